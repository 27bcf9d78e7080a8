package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
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
	// Upstream down: every event waits in the spool; killed right after the
	// last answer, the latest chunks are in the log only (spool.db takes a
	// chunk half a second after it was written), the others in spool.db.
	r := harness.StartRelay(t, bin, dir, &harness.RelayOpts{DataDir: data, IngestURL: "http://" + harness.FreeAddr(t)})
	hc := harness.NewClient()
	post := func(r *harness.Relay, key, dev string, from, n int) (int, http.Header) {
		var evs []string
		for j := range n {
			evs = append(evs, fmt.Sprintf(`{"event_type":"e","device_id":%q,"insert_id":"%s-%s-%06d"}`, dev, key, dev, from+j))
		}
		body := fmt.Sprintf(`{"api_key":%q,"events":[%s]}`, key, strings.Join(evs, ","))
		req, _ := http.NewRequest(http.MethodPost, "http://"+r.Listen+"/2/httpapi", strings.NewReader(body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	key := func(q int) string { return fmt.Sprintf("full-key-%d", q%keys) }
	dev := func(q int) string { return fmt.Sprintf("device-%02d", q%devs) }
	for q := range requests {
		// Each request one device's events, numbered on per device.
		if code, _ := post(r, key(q), dev(q), q*per, per); code != 200 {
			t.Fatalf("post %d: %d", q, code)
		}
		time.Sleep(10 * time.Millisecond) // spread over seconds, as clients do
	}
	r.Kill(t)
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
	if code, h := post(r, key(0), dev(0), 9_000_000, 1); code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
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
		if code, _ := post(r, key(q), dev(q), 9_000_000, 1); code != 200 {
			t.Fatalf("post after draining: %d", code)
		}
	}
	want := requests*per + keys*devs
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
	if len(seen) != want {
		t.Errorf("%d distinct events delivered, want %d", len(seen), want)
	}
	if err := r.Stop(t, polltest.Max); err != nil {
		t.Fatalf("stop: %v\n%s", err, r.LogTail(4000))
	}
}
