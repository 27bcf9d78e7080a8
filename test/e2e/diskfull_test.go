package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/diskfulltest"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// TestFullDiskStartAtBinaryLevel: a relay killed with a backlog in its
// write-ahead log and in spool.db, started again on a filesystem with no
// space left, drains (503 with Retry-After, /readyz says why) and delivers
// what spool.db holds; once space is freed it replays the log and delivers
// the whole backlog, in order per device, before what is posted after.
// Before the fix the replayed backlog was never read (the lanes' readers
// had moved past its seqs) while new events were delivered.
func TestFullDiskStartAtBinaryLevel(t *testing.T) {
	if testing.Short() {
		t.Skip("binary-level test; skipped under -short")
	}
	t.Parallel()
	const (
		requests, per = 300, 50
		keys, devs    = 3, 50
	)
	bin := harness.Build(t)
	mnt := diskfulltest.Tmpfs(t, "40m", "")
	dir := t.TempDir()
	data := filepath.Join(mnt, "data")
	// Upstream down: every event waits in the spool. The relay is killed
	// while requests are being answered, after `requests` of them: the
	// chunks of the last half second are in the log only (spool.db takes a
	// chunk half a second after it was written), the others in spool.db.
	// (Killed after the last answer, a loaded machine could let half a
	// second pass first, and nothing would be left in the log.)
	r := harness.StartRelay(t, bin, dir, &harness.RelayOpts{DataDir: data, IngestURL: "http://" + harness.FreeAddr(t)})
	hc := harness.NewClient()
	post := func(r *harness.Relay, key, dev string, from, n int) (int, http.Header, error) {
		var evs []string
		for j := range n {
			evs = append(evs, fmt.Sprintf(`{"event_type":"e","device_id":%q,"insert_id":"%s"}`, dev, insertID(key, dev, from+j)))
		}
		body := fmt.Sprintf(`{"api_key":%q,"events":[%s]}`, key, strings.Join(evs, ","))
		req, _ := http.NewRequest(http.MethodPost, "http://"+r.Listen+"/2/httpapi", strings.NewReader(body))
		resp, err := hc.Do(req)
		if err != nil {
			return 0, nil, err
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header, nil
	}
	mustPost := func(r *harness.Relay, key, dev string, from, n int) (int, http.Header) {
		t.Helper()
		code, h, err := post(r, key, dev, from, n)
		if err != nil {
			t.Fatal(err)
		}
		return code, h
	}
	key := func(q int) string { return fmt.Sprintf("full-key-%d", q%keys) }
	dev := func(q int) string { return fmt.Sprintf("device-%02d", q%devs) }
	var acked atomic.Int64 // requests 0..acked-1 answered 200; the next may be in flight at the kill
	killing, posted := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(posted)
		for q := range 4 * requests {
			// Each request one device's events, numbered on per device.
			code, _, err := post(r, key(q), dev(q), q*per, per)
			select {
			case <-killing:
				return
			default:
			}
			if err != nil || code != 200 {
				t.Errorf("post %d: %d %v", q, code, err)
				return
			}
			acked.Store(int64(q + 1))
			time.Sleep(10 * time.Millisecond) // spread over seconds, as clients do
		}
	}()
	polltest.Until(t, fmt.Sprintf("%d requests answered", requests), func() bool { return acked.Load() >= requests })
	close(killing)
	r.Kill(t)
	<-posted
	answered := int(acked.Load())
	filler := filepath.Join(mnt, "filler")
	diskfulltest.Fill(t, filler)

	sm := harness.StartSim(t, bin, dir)
	r = harness.StartRelay(t, bin, dir, &harness.RelayOpts{DataDir: data, IngestURL: sm.Base,
		Extra: []string{"--spool-upstream-change", "allow"}})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay log:\n%s", r.LogTail(8000))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if code, h := mustPost(r, key(0), dev(0), 9_000_000, 1); code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
		t.Fatalf("post while draining: %d (Retry-After %q), want 503 with Retry-After", code, h.Get("Retry-After"))
	}
	resp, err := hc.Get("http://" + r.AdminListen + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz while draining: %d, want 503", resp.StatusCode)
	}
	// What spool.db holds is delivered while draining.
	var stored []sim.Ingested
	events := func() int {
		var all []sim.Ingested
		for k := range keys {
			evs, err := sm.Ctl.Events(ctx, key(k), 0)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, evs...)
		}
		stored = all
		return len(all)
	}
	polltest.Within(t, 3*time.Minute, "spool.db's events delivered while draining", func() bool { return events() > 0 })
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// Space is back: the replay goes through; the whole backlog follows.
	polltest.Within(t, 3*time.Minute, "ingest to take events again", func() bool {
		resp, err := hc.Get("http://" + r.AdminListen + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	// One more event per device, after the backlog.
	for q := range keys * devs {
		if code, _ := mustPost(r, key(q), dev(q), 9_000_000, 1); code != 200 {
			t.Fatalf("post after draining: %d", code)
		}
	}
	want := answered*per + keys*devs
	polltest.Within(t, 6*time.Minute, fmt.Sprintf("%d events delivered", want), func() bool { return events() >= want })
	seen := map[string]bool{}
	last := map[string]string{}
	for _, e := range stored {
		if seen[e.InsertID] {
			t.Errorf("event %s delivered twice", e.InsertID)
		}
		seen[e.InsertID] = true
		k := e.InsertID[:strings.LastIndexByte(e.InsertID, '-')] // key and device
		if p := last[k]; p >= e.InsertID {
			t.Errorf("%s: %s after %s", k, e.InsertID, p)
		}
		last[k] = e.InsertID
	}
	// Every answered event, and at most the request in flight at the kill.
	for q := range answered {
		for j := range per {
			if id := insertID(key(q), dev(q), q*per+j); !seen[id] {
				t.Errorf("answered event %s not delivered", id)
			}
		}
	}
	if len(seen) != want && len(seen) != want+per {
		t.Errorf("%d distinct events delivered, want %d (or %d with the request in flight at the kill)", len(seen), want, want+per)
	}
	if err := r.Stop(t, polltest.Max); err != nil {
		t.Fatalf("stop: %v\n%s", err, r.LogTail(4000))
	}
}

func insertID(key, dev string, n int) string { return fmt.Sprintf("%s-%s-%06d", key, dev, n) }
