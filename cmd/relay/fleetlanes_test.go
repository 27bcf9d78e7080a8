package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
)

// laneRunners are a relay's runners (/relay/v1/lanes) of the lanes whose
// label starts with prefix.
func laneRunners(t *testing.T, admin, prefix string) []struct {
	Label      string `json:"label"`
	Stopped    bool   `json:"stopped"`
	StopReason string `json:"stop_reason"`
	Records    int64  `json:"records"`
	Bytes      int64  `json:"bytes"`
} {
	t.Helper()
	_, body := getBody(t, admin+"/relay/v1/lanes")
	var out struct {
		Lanes []struct {
			Label      string `json:"label"`
			Stopped    bool   `json:"stopped"`
			StopReason string `json:"stop_reason"`
			Records    int64  `json:"records"`
			Bytes      int64  `json:"bytes"`
		} `json:"lanes"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	rs := out.Lanes[:0]
	for _, l := range out.Lanes {
		if strings.HasPrefix(l.Label, prefix) {
			rs = append(rs, l)
		}
	}
	return rs
}

// TestFleetLaneStopHoldsOnEveryRelay: an operator's pause of a lane on one
// relay stops that lane's runners on the other relay too (every partition),
// nothing more of it is delivered while stopped, and a resume on the other
// relay delivers everything.
func TestFleetLaneStopHoldsOnEveryRelay(t *testing.T) {
	cl, up, upURL := startFleetCluster(t)
	a := startFleetRelay(t, cl, upURL)
	b := startFleetRelay(t, cl, upURL)
	const apiKey, devices, perReq = "fleet-key-5", 12, 3
	send := func(r *fleetRelay, round int) {
		t.Helper()
		for dev := range devices {
			polltest.Until(t, "the relay accepting events", func() bool {
				return postEvents(http.DefaultClient, r.ingest, deviceEvents(apiKey, dev, round*perReq, perReq)) == http.StatusOK
			})
		}
	}
	waitEvents := func(n int, what string) {
		t.Helper()
		polltest.Until(t, fmt.Sprintf("%s: %d events delivered", what, n), func() bool { return distinct(up.Events(apiKey)) >= n })
	}
	// Both relays deliver some of the lane's partitions: runners on each.
	// B takes its share of the partitions at a membership tick after it
	// joined: rounds go on until then (a count of rounds would be a
	// wall-clock bound: on a quiet machine they all fit in one tick).
	var prefix string
	deadline := time.Now().Add(polltest.Max)
	for i := 0; ; i++ {
		send(a, i)
		waitEvents((i+1)*devices*perReq, "before the stop")
		ra, rb := laneRunners(t, a.admin, ""), laneRunners(t, b.admin, "")
		if len(ra) > 0 && len(rb) > 0 {
			prefix, _, _ = strings.Cut(ra[0].Label, "-events-")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runners of the lane on both relays: a %v, b %v", ra, rb)
		}
		time.Sleep(200 * time.Millisecond)
	}
	delivered := distinct(up.Events(apiKey))

	// Stop on A, by one of A's runners.
	label := laneRunners(t, a.admin, prefix)[0].Label
	if st, body := postBody(t, a.admin+"/relay/v1/lanes/"+label+"/pause"); st != http.StatusOK {
		t.Fatalf("pause on a: %d %s", st, body)
	}
	allStopped := func(admin string) bool {
		rs := laneRunners(t, admin, prefix)
		for _, r := range rs {
			if !r.Stopped || r.StopReason != "stopped by operator" {
				return false
			}
		}
		return len(rs) > 0
	}
	polltest.Until(t, "the lane stopped on every runner", func() bool { return allStopped(a.admin) && allStopped(b.admin) })
	// Sent through B while stopped: stored, not delivered.
	send(b, 100)
	time.Sleep(2 * time.Second) // a delivery would have happened by now; none may
	if got := distinct(up.Events(apiKey)); got != delivered {
		t.Fatalf("%d events delivered while the lane was stopped", got-delivered)
	}
	// The lanes API counts them: read on from the partitions and held, on
	// whichever relay delivers each.
	waiting := func() (records, bytes int64) {
		for _, admin := range []string{a.admin, b.admin} {
			for _, r := range laneRunners(t, admin, prefix) {
				records, bytes = records+r.Records, bytes+r.Bytes
			}
		}
		return records, bytes
	}
	polltest.Until(t, "the lanes API counting the stopped lane's records", func() bool {
		n, size := waiting()
		return n == devices*perReq && size > 0
	})
	// Resume on B, by one of B's runners: everything goes.
	label = laneRunners(t, b.admin, prefix)[0].Label
	if st, body := postBody(t, b.admin+"/relay/v1/lanes/"+label+"/resume"); st != http.StatusOK {
		t.Fatalf("resume on b: %d %s", st, body)
	}
	waitEvents(delivered+devices*perReq, "after the resume")
	polltest.Until(t, "the lanes API counting nothing waiting once delivered", func() bool {
		n, size := waiting()
		return n == 0 && size == 0
	})
}

// postBody posts an empty body and returns the status and the answer.
func postBody(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
