package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// backfillSize is one size of the backfill test: events of devices, some
// of them heavy, against a simulator whose per-device threshold is eps (the
// strict reading: 10 s window, a request's own events count), sent at
// maxEPS for the project.
type backfillSize struct {
	events, devices, heavy, heavyEvents int
	eps, maxEPS                         int
}

// TestBackfillKilledAndRerun is the backfill's done-when through the real
// binary, scaled down (BACKFILL_FULL=1 runs the full size: 200,000 events
// of 2,000 devices, 20 of them with 5,000 events, at the document's 30
// events/s per device and --max-eps 1000; about 4 minutes): the run is
// SIGKILLed three times and run again until it exits 0; then run again
// over the same file with the same data dir (it sends nothing) and with a
// fresh one (same insert_ids: the upstream keeps one of each). Every event
// must arrive exactly once under one insert_id, in file order per device,
// no device or user over the limit in any 10 s window, and at most one 429
// per 10,000 events.
func TestBackfillKilledAndRerun(t *testing.T) {
	if testing.Short() {
		t.Skip("binary-level test; skipped under -short")
	}
	t.Parallel()
	// Ten times the document's rates, with the same ratios: a heavy device
	// needs 2000 / (0.8 x 300) = 8.3 s, as 5,000 events do at 30/s in 208 s.
	size := backfillSize{events: 20_000, devices: 200, heavy: 5, heavyEvents: 2000, eps: 300, maxEPS: 5000}
	if os.Getenv("BACKFILL_FULL") != "" {
		size = backfillSize{events: 200_000, devices: 2000, heavy: 20, heavyEvents: 5000, eps: 30, maxEPS: 1000}
	}
	bin := harness.Build(t)
	dir := t.TempDir()
	s := sim.New(sim.Config{EPSThreshold: size.eps, KeepRequests: 1 << 20}, nil)
	base, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	in := filepath.Join(dir, "history.jsonl")
	writeHistory(t, in, size)

	const apiKey = "backfill-e2e-key"
	data := filepath.Join(dir, "data")
	args := func(data string) []string {
		return []string{"backfill", "--ingest-url", base, "--api-key", apiKey, "--data-dir", data,
			"--max-eps", strconv.Itoa(size.maxEPS), "--device-eps", strconv.Itoa(size.eps), in}
	}
	t0 := time.Now()
	// Three SIGKILLs: once reading has begun, then at 40% and 70% arrived.
	for i, at := range []int{0, size.events * 4 / 10, size.events * 7 / 10} {
		cmd := exec.Command(bin, args(data)...)
		cmd.Env = harness.CleanEnv()
		logf, _ := os.Create(filepath.Join(dir, fmt.Sprintf("run%d.log", i)))
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		polltest.Within(t, 10*time.Minute, fmt.Sprintf("kill %d: %d events arrived", i+1, at), func() bool {
			if at == 0 {
				_, err := os.Stat(filepath.Join(data, "backfill.state.json"))
				return err == nil
			}
			return s.Stats().Ingested >= int64(at)
		})
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
		t.Logf("SIGKILL %d at %d events arrived", i+1, s.Stats().Ingested)
	}
	run := func(name, data string) string {
		t.Helper()
		cmd := exec.Command(bin, args(data)...)
		cmd.Env = harness.CleanEnv()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		t.Logf("%s: %s", name, strings.TrimSpace(lastLine(string(out))))
		return string(out)
	}
	run("run after the kills", data)
	elapsed := time.Since(t0)
	checkBackfill(t, s, apiKey, size)
	st := s.Stats()
	t.Logf("%d events of %d devices in %v with 3 SIGKILLs: %d requests, %d answered 429, %d duplicates (resent after the kills)",
		size.events, size.devices, elapsed.Round(time.Millisecond), st.Requests, st.Throttled, st.Duplicates)

	requests := s.Stats().Requests
	run("the same command again", data)
	if n := s.Stats().Requests; n != requests {
		t.Fatalf("a rerun over a finished backfill sent %d requests", n-requests)
	}
	run("the same file into a fresh data dir", filepath.Join(dir, "data2"))
	checkBackfill(t, s, apiKey, size)
}

// writeHistory writes size.events events as JSON lines, the heavy devices'
// events spread over the file (as in a history sorted by time). Half of
// the events carry an insert_id; the backfill derives the others'.
func writeHistory(t *testing.T, path string, size backfillSize) {
	t.Helper()
	type ev struct{ dev, n int }
	var all []ev
	for d := range size.heavy {
		for n := range size.heavyEvents {
			all = append(all, ev{d, n})
		}
	}
	light := size.events - size.heavy*size.heavyEvents
	for i := range light {
		d := size.heavy + i%(size.devices-size.heavy)
		all = append(all, ev{d, i / (size.devices - size.heavy)})
	}
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	// Each device's events in order of n: the shuffle decides only how
	// devices interleave.
	next := map[int]int{}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for i, e := range all {
		n := next[e.dev]
		next[e.dev]++
		m := map[string]any{"event_type": "history", "device_id": fmt.Sprintf("device-%05d", e.dev),
			"time": 1_700_000_000_000 + int64(i), "event_properties": map[string]any{"n": n}}
		if e.dev%2 == 0 {
			m["user_id"] = fmt.Sprintf("user-%05d", e.dev)
		}
		if i%2 == 0 {
			m["insert_id"] = fmt.Sprintf("ins-%d-%d", e.dev, n)
		}
		b, _ := json.Marshal(m)
		w.Write(append(b, '\n'))
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// checkBackfill requires every event of writeHistory stored once under one
// insert_id, in order per device, no key over the limit of any 10 s window
// (at arrival), and at most one 429 per 10,000 events.
func checkBackfill(t *testing.T, s *sim.Sim, apiKey string, size backfillSize) {
	t.Helper()
	evs := s.Events(apiKey)
	if len(evs) != size.events {
		t.Fatalf("the upstream stored %d events, want %d", len(evs), size.events)
	}
	arrived := map[int64]time.Time{}
	for _, r := range s.Requests() {
		arrived[r.Seq] = r.Time
	}
	ids := map[string]bool{}
	last := map[string]int{}
	times := map[string][]time.Time{}
	for _, e := range evs {
		if e.InsertID == "" || ids[e.InsertID] {
			t.Fatalf("insert_id %q missing or stored twice", e.InsertID)
		}
		ids[e.InsertID] = true
		var body struct {
			P struct{ N int } `json:"event_properties"`
		}
		json.Unmarshal(e.Raw, &body)
		want := 0
		if n, ok := last[e.DeviceID]; ok {
			want = n + 1
		}
		if body.P.N != want {
			t.Fatalf("device %s: event %d arrived where %d was due (lost, twice or out of order)", e.DeviceID, body.P.N, want)
		}
		last[e.DeviceID] = body.P.N
		at, ok := arrived[e.Request]
		if !ok {
			t.Fatalf("request %d of an event is not in the request log", e.Request)
		}
		times["d:"+e.DeviceID] = append(times["d:"+e.DeviceID], at)
		if e.UserID != "" {
			times["u:"+e.UserID] = append(times["u:"+e.UserID], at)
		}
	}
	if len(last) != size.devices {
		t.Fatalf("%d devices arrived, want %d", len(last), size.devices)
	}
	limit := size.eps * 10
	for k, ts := range times {
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		lo := 0
		for hi := range ts {
			for ts[hi].Sub(ts[lo]) >= 10*time.Second {
				lo++
			}
			if hi-lo+1 > limit {
				t.Fatalf("%s: %d events arrived within 10 s (limit %d)", k, hi-lo+1, limit)
			}
		}
	}
	if n, most := s.Stats().Throttled, int64(size.events/10_000); n > most {
		t.Fatalf("%d answers 429 for %d events, at most %d allowed", n, size.events, most)
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
