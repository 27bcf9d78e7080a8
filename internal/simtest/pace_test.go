package simtest

import (
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/sim"
)

func TestMaxCallsInWindow(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	at := func(acc string, s int) sim.MgmtCall {
		return sim.MgmtCall{API: "scim", Account: acc, Time: t0.Add(time.Duration(s) * time.Second)}
	}
	calls := []sim.MgmtCall{at("a", 0), at("a", 5), at("a", 9), at("a", 10), at("a", 11), at("b", 0), at("b", 1),
		{API: "taxonomy", Account: "a", Time: t0.Add(9 * time.Second)}, {API: "scim", Time: t0}}
	// Spans shorter than 10s: a's {5,9,10,11} (4); b's 2; other APIs and
	// calls without an account do not count.
	if n := MaxCallsInWindow(calls, "scim", 10*time.Second); n != 4 {
		t.Fatalf("got %d, want 4", n)
	}
	if n := MaxCallsInWindow(calls, "scim", time.Second); n != 1 {
		t.Fatalf("1s: got %d, want 1", n)
	}
}

func TestMaxWindowCount(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	at := func(org string, s, n int) sim.MappingBatch {
		return sim.MappingBatch{Org: org, N: n, Time: t0.Add(time.Duration(s) * time.Second)}
	}
	bs := []sim.MappingBatch{at("o", 0, 1000), at("o", 10, 500), at("p", 10, 900), at("o", 30, 1000), at("o", 31, 10)}
	// A window of 30s holds (t-30s, t]: {10,30,31} = 1510; 0 and 30 are not both in one.
	if got := MaxWindowCount(bs, 30*time.Second); got != 1510 {
		t.Fatalf("got %d, want 1510", got)
	}
	if got := MaxWindowCount(bs, 31*time.Second); got != 2500 { // (-1s,30s]: 0, 10 and 30
		t.Fatalf("31s: got %d, want 2500", got)
	}
}
