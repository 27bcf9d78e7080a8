package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
)

// TestBackfillRouteYields: POST /relay/v1/backfill runs a backfill inside
// the relay, in lanes of its own, at what its max_eps leaves of the
// project's live traffic: while live events of the same project go out
// faster than max_eps, the backfill sends (almost) nothing; once they stop,
// it finishes, and GET /relay/v1/backfill says so.
func TestBackfillRouteYields(t *testing.T) {
	s := sim.New(sim.Config{}, nil)
	up, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	r := startServe(t, "--ingest-url", up, "--flush-interval", "20ms")
	const key = "project-key"

	// Live traffic: 80 events every 100 ms (800/s), each of its own device.
	stopLive := make(chan struct{})
	liveDone := make(chan struct{})
	var liveAccepted atomic.Int64
	go func() {
		defer close(liveDone)
		for i := 0; ; i++ {
			select {
			case <-stopLive:
				return
			case <-time.After(100 * time.Millisecond):
			}
			var evs []string
			for k := range 80 {
				evs = append(evs, fmt.Sprintf(`{"event_type":"live","device_id":"live-%d-%d"}`, i, k))
			}
			resp, err := http.Post(r.ingest+"/2/httpapi", "application/json",
				strings.NewReader(`{"api_key":"`+key+`","events":[`+strings.Join(evs, ",")+`]}`))
			if err == nil {
				if resp.StatusCode == http.StatusOK {
					liveAccepted.Add(int64(len(evs)))
				}
				resp.Body.Close()
			}
		}
	}()
	polltest.Until(t, "live traffic to flow", func() bool { return s.Stats().Ingested >= 400 })

	var body bytes.Buffer
	for i := range 300 {
		fmt.Fprintf(&body, `{"event_type":"history","device_id":"old-device-%d"}`+"\n", i)
	}
	// The window is measured, not assumed: a loaded machine may run the
	// sleep below late, and the backfill's share grows with the window.
	start, live0 := time.Now(), liveAccepted.Load()
	resp, err := http.Post(r.admin+"/relay/v1/backfill?api_key="+key+"&max_eps=100", "application/x-ndjson", &body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /relay/v1/backfill: %d", resp.StatusCode)
	}
	history := func() int {
		n := 0
		for _, e := range s.Events(key) {
			if e.EventType == "history" {
				n++
			}
		}
		return n
	}
	time.Sleep(3 * time.Second) // the window watched: at 100/s, 300 events would take 3 s
	// A loaded machine may post less live traffic than 800/s: what it
	// left of max_eps over the window is the backfill's to take. Read in
	// this order (live traffic, then what was sent, then the clock), a
	// stall between two reads can only raise what is allowed.
	live := liveAccepted.Load() - live0
	n := history()
	window := time.Since(start)
	allowed := 60 + max(0, int(100*window.Seconds())-int(live))
	t.Logf("%d backfill events sent in %v of live traffic (%d live events accepted meanwhile)", n, window.Round(time.Millisecond), live)
	if n > allowed {
		t.Fatalf("%d backfill events sent while live traffic (%d events in %v) took the whole max_eps (100/s); want at most %d", n, live, window.Round(time.Millisecond), allowed)
	}
	close(stopLive)
	<-liveDone
	polltest.Until(t, "the backfill to finish once live traffic stopped", func() bool { return history() == 300 })
	var list struct {
		Backfills []struct {
			Status    string `json:"status"`
			Delivered int64  `json:"delivered"`
		} `json:"backfills"`
	}
	polltest.Until(t, "GET /relay/v1/backfill to say done", func() bool {
		_, b := getBody(t, r.admin+"/relay/v1/backfill")
		json.Unmarshal([]byte(b), &list)
		return len(list.Backfills) == 1 && list.Backfills[0].Status == "done"
	})
	if list.Backfills[0].Delivered != 300 {
		t.Fatalf("listed %+v", list.Backfills)
	}
}

// TestBackfillRouteResumes: a backfill the relay's stop interrupted goes on
// at the next start on the same data dir, every event stored once.
func TestBackfillRouteResumes(t *testing.T) {
	s := sim.New(sim.Config{}, nil)
	up, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	dir := t.TempDir()
	r := startServe(t, "--ingest-url", up, "--data-dir", dir)
	var body bytes.Buffer
	for i := range 300 {
		fmt.Fprintf(&body, `{"event_type":"history","device_id":"old-device-%d"}`+"\n", i)
	}
	resp, err := http.Post(r.admin+"/relay/v1/backfill?api_key=k&max_eps=100", "application/x-ndjson", &body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	polltest.Until(t, "the backfill to begin", func() bool { return s.Stats().Ingested >= 50 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if n := s.Stats().Ingested; n == 300 {
		t.Fatal("the backfill finished before the stop: nothing to resume")
	}
	r = startServe(t, "--ingest-url", up, "--data-dir", dir)
	polltest.Until(t, "the backfill to finish after the restart", func() bool {
		_, b := getBody(t, r.admin+"/relay/v1/backfill")
		return strings.Contains(b, `"status":"done"`)
	})
	if n := len(s.Events("k")); n != 300 {
		t.Fatalf("%d events stored, want 300", n)
	}
}

// TestBackfillRouteLargeBody: a backfill's input is one file and may be
// far larger than any other admin request; the listener's own body bound
// (32 MiB) must not cut it off.
func TestBackfillRouteLargeBody(t *testing.T) {
	t.Parallel()
	s := sim.New(sim.Config{}, nil)
	up, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	r := startServe(t, "--ingest-url", up, "--flush-interval", "20ms")
	const key = "project-key"
	var body bytes.Buffer
	for i := range 100 {
		fmt.Fprintf(&body, `{"event_type":"history","device_id":"old-device-%d"}`+"\n", i)
	}
	blank := strings.Repeat(" ", 1023) + "\n" // blank lines are skipped
	for body.Len() < 33<<20 {
		body.WriteString(blank)
	}
	resp, err := http.Post(r.admin+"/relay/v1/backfill?api_key="+key, "application/x-ndjson", &body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /relay/v1/backfill of a 33 MiB input: %d, want 202", resp.StatusCode)
	}
	polltest.Until(t, "the backfill's 100 events to arrive", func() bool { return len(s.Events(key)) == 100 })
}
