package crash

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// The relay's start and `relay spool verify` judge the write-ahead log
// with one reader: these tests hold both to the rule that damage is
// reported when something was lost, exactly, and never otherwise.

const damageLine = "damaged write-ahead log records skipped"

// stopsEnv sets how many stops TestStopsUnderLoadReportNoDamage makes
// (half SIGTERM, half SIGKILL); the regular suite makes 8.
const stopsEnv = "RELAY_TEST_STOPS"

// load posts requests of perRequest events with conns connections until
// ctx ends (which the test must end: its cleanup waits for them); it
// returns how many were answered 200.
func load(ctx context.Context, t *testing.T, listen, apiKey string, conns, perRequest int) *atomic.Int64 {
	t.Helper()
	var ok atomic.Int64
	var wg sync.WaitGroup
	for c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Timeout: 5 * time.Second}
			var body bytes.Buffer
			for n := 0; ctx.Err() == nil; n++ {
				body.Reset()
				fmt.Fprintf(&body, `{"api_key":%q,"events":[`, apiKey)
				for i := range perRequest {
					if i > 0 {
						body.WriteByte(',')
					}
					fmt.Fprintf(&body, `{"event_type":"stop_test","device_id":"dev-%d","insert_id":"iid-%d-%07d-%03d","event_properties":{"pad":%q}}`,
						c, c, n, i, strings.Repeat("p", 40+(n*7+i)%60))
				}
				body.WriteString(`]}`)
				resp, err := hc.Post("http://"+listen+"/2/httpapi", "application/json", bytes.NewReader(body.Bytes()))
				if err != nil {
					time.Sleep(5 * time.Millisecond) // the relay is down
					continue
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					ok.Add(1)
				}
			}
		}()
	}
	t.Cleanup(wg.Wait)
	return &ok
}

// TestStopsUnderLoadReportNoDamage stops the real relay under load again
// and again, alternately with SIGTERM (after a SIGHUP, as `systemctl
// reload` sends) and SIGKILL, while 8 connections post requests of 100
// events and the simulator takes deliveries (so acknowledgements flow and
// log files are reused). Nothing is damaged, so no start may report damage
// (no error line, relay_spool_damaged_records_total{file="wal"} 0); a start
// after a SIGTERM may not even report a torn write; and `relay spool
// verify` says OK with no note at the end.
func TestStopsUnderLoadReportNoDamage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and stops the real binary many times; skipped under -short")
	}
	stops := 8
	if v := os.Getenv(stopsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 {
			t.Fatalf("%s=%q: want a number of stops, at least 2", stopsEnv, v)
		}
		stops = n
	}
	start := time.Now()
	rng := rand.New(rand.NewPCG(uint64(start.UnixNano()), 7))
	bin := harness.Build(t)
	tmp := t.TempDir()
	sim := harness.StartSim(t, bin, tmp)
	dataDir := filepath.Join(tmp, "data")
	opts := &harness.RelayOpts{Listen: harness.FreeAddr(t), DataDir: dataDir, IngestURL: sim.Base,
		Extra: []string{"--drain-timeout", "2s"}}
	r := harness.StartRelay(t, bin, tmp, opts)
	ctx, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	accepted := load(ctx, t, opts.Listen, "stop-test-key", 8, 100)

	logText := func() string {
		b, _ := os.ReadFile(filepath.Join(tmp, "relay.log"))
		return string(b)
	}
	var terms, kills int
	for i := range stops {
		time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond)
		before := strings.Count(logText(), "write cut short")
		term := i%2 == 0
		if term {
			terms++
			if err := r.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
			if err := r.Stop(t, polltest.Max); err != nil {
				t.Fatalf("stop %d: exit after SIGTERM: %v, want 0\n%s", i, err, r.LogTail(4000))
			}
		} else {
			kills++
			r.Kill(t)
		}
		r = harness.StartRelay(t, bin, tmp, opts)
		log := logText()
		if n := strings.Count(log, damageLine); n != 0 {
			t.Fatalf("stop %d (%s): the start reported damage %d times, nothing was damaged:\n%s",
				i, map[bool]string{true: "SIGTERM", false: "SIGKILL"}[term], n, grepLines(log, damageLine))
		}
		if v, err := r.Metric("relay_spool_damaged_records_total", `file="wal"`); err != nil || v != 0 {
			t.Fatalf("stop %d: relay_spool_damaged_records_total{file=\"wal\"} = %v (%v), want 0", i, v, err)
		}
		if n := strings.Count(log, "write cut short"); term && n != before {
			t.Fatalf("stop %d: a start after SIGTERM reported a write cut short:\n%s", i, grepLines(log, "write cut short"))
		}
	}
	time.Sleep(300 * time.Millisecond) // load on the last start before its stop
	if err := r.Stop(t, polltest.Max); err != nil {
		t.Fatalf("last stop: exit after SIGTERM: %v, want 0", err)
	}
	stopLoad()
	out, err := exec.Command(bin, "spool", "verify", "--data-dir", dataDir).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "\nOK") || strings.Contains(string(out), "note:") {
		t.Fatalf("spool verify after a SIGTERM: %v\n%s", err, out)
	}
	t.Logf("%d SIGTERMs and %d SIGKILLs under load, %d requests of 100 events accepted, no damage reported; %v",
		terms, kills, accepted.Load(), time.Since(start).Round(time.Millisecond))
	if accepted.Load() < int64(stops) {
		t.Fatalf("only %d requests accepted: the test proved little", accepted.Load())
	}
}

// TestDamageReportedExactly SIGKILLs the relay while it spools requests of
// 50 events that it cannot deliver (nothing listens upstream), flips a
// byte inside one event of a request that is still only in the
// write-ahead log, and requires `relay spool verify` and the next start to
// report the same, exactly: that request's lane, one damaged log record,
// 50 events lost (the counter counts events).
func TestDamageReportedExactly(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills the real binary; skipped under -short")
	}
	bin := harness.Build(t)
	tmp := t.TempDir()
	dataDir := filepath.Join(tmp, "data")
	opts := &harness.RelayOpts{Listen: harness.FreeAddr(t), DataDir: dataDir,
		IngestURL: "http://" + harness.FreeAddr(t), Extra: []string{"--drain-timeout", "2s"}}
	r := harness.StartRelay(t, bin, tmp, opts)
	ctx, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	accepted := load(ctx, t, opts.Listen, "damage-test-key", 4, 50)
	polltest.Until(t, "40 requests accepted", func() bool { return accepted.Load() >= 40 })
	r.Kill(t) // under load: the last requests' chunks are only in the log
	stopLoad()

	// A record that only the log holds, from salvage: its lane and its
	// insert_id, whose bytes are then found in the log and damaged.
	out, err := exec.Command(bin, "spool", "salvage", "--data-dir", dataDir, "--out", "-").Output()
	if err != nil {
		t.Fatalf("spool salvage: %v", err)
	}
	// The first such request: one after it is in the log too, so that its
	// damage lies between valid records (a bad last record past the end
	// spool.db recorded as acknowledged would be a write cut short).
	var lane, iid string
	var seq, lastSeq uint64
	for line := range strings.SplitSeq(string(out), "\n") {
		var rec struct {
			Source string `json:"source"`
			Lane   string `json:"lane"`
			Seq    uint64 `json:"seq"`
			Data   struct {
				InsertID string `json:"insert_id"`
			} `json:"data"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Source != "wal" {
			continue
		}
		if iid == "" {
			lane, iid, seq = rec.Lane, rec.Data.InsertID, rec.Seq
		}
		lastSeq = rec.Seq
	}
	if iid == "" || lastSeq == seq {
		t.Fatal("fewer than two requests are only in the write-ahead log: nothing to damage")
	}
	segs, _ := filepath.Glob(filepath.Join(dataDir, "wal", "*.wal"))
	damaged := 0
	for _, path := range segs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(b, []byte(`"insert_id":"`+iid)); i >= 0 {
			b[i+len(`"insert_id":"`)] ^= 0x01
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			damaged++
		}
	}
	if damaged != 1 {
		t.Fatalf("insert_id %s found in %d log files, want 1", iid, damaged)
	}

	want := fmt.Sprintf("lane %s: 1 damaged records, 50 events lost", lane)
	out, err = exec.Command(bin, "spool", "verify", "--data-dir", dataDir).CombinedOutput()
	if err == nil || strings.Count(string(out), "damage:") != 1 || !strings.Contains(string(out), want) ||
		!strings.Contains(string(out), ", 50 damaged") {
		t.Fatalf("spool verify: %v; want exit 1 and one damage line saying %q, 50 damaged:\n%s", err, want, out)
	}

	r = harness.StartRelay(t, bin, tmp, opts)
	lines := grepLines(r.LogTail(1<<20), damageLine)
	var got struct {
		Lane    string `json:"lane"`
		Records int    `json:"records"`
		Events  int    `json:"events"`
	}
	if strings.Count(lines, "\n") != 1 || json.Unmarshal([]byte(lines), &got) != nil ||
		got.Lane != lane || got.Records != 1 || got.Events != 50 {
		t.Fatalf("the start's damage report:\n%s\nwant one line with lane %s, records 1, events 50", lines, lane)
	}
	if v, err := r.Metric("relay_spool_damaged_records_total", `file="wal"`); err != nil || v != 50 {
		t.Fatalf("relay_spool_damaged_records_total{file=\"wal\"} = %v (%v), want 50", v, err)
	}
	if err := r.Stop(t, polltest.Max); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
}

// grepLines returns the lines of s that contain sub, each ending in "\n".
func grepLines(s, sub string) string {
	var b strings.Builder
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
