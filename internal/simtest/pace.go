package simtest

import (
	"slices"
	"sort"
	"time"

	"github.com/svcrelay/relay/internal/sim"
)

// MaxCallsInWindow returns the most calls of api for one account whose
// times fall within any span shorter than window (the test of a
// client-side rate limit).
func MaxCallsInWindow(calls []sim.MgmtCall, api string, window time.Duration) int {
	by := map[string][]time.Time{}
	for _, c := range calls {
		if c.API == api && c.Account != "" {
			by[c.Account] = append(by[c.Account], c.Time)
		}
	}
	most := 0
	for _, ts := range by {
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		j := 0
		for i := range ts {
			for ts[i].Sub(ts[j]) >= window {
				j++
			}
			most = max(most, i-j+1)
		}
	}
	return most
}

// MaxWindowCount returns the largest number of mapping calls of one
// organization accepted within any window of length window (the pace).
func MaxWindowCount(batches []sim.MappingBatch, window time.Duration) int {
	byOrg := map[string][]sim.MappingBatch{}
	for _, b := range batches {
		byOrg[b.Org] = append(byOrg[b.Org], b)
	}
	best := 0
	for _, bs := range byOrg {
		sort.Slice(bs, func(i, j int) bool { return bs[i].Time.Before(bs[j].Time) })
		sum, lo := 0, 0
		for _, b := range bs {
			sum += b.N
			for !bs[lo].Time.After(b.Time.Add(-window)) { // drop those at or before b.Time-window
				sum -= bs[lo].N
				lo++
			}
			best = max(best, sum)
		}
	}
	return best
}
