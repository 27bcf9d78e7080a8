package backfill

import (
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

func TestEvents(t *testing.T) {
	for _, tt := range []struct {
		name, line string
		want       []string // events, as JSON; "ID" stands for the derived insert_id
		dropped    string
		err        string
	}{
		{"event", `{"event_type":"a","device_id":"device-1","insert_id":"x1"}`,
			[]string{`{"device_id":"device-1","event_type":"a","insert_id":"x1"}`}, "", ""},
		{"event without insert_id", `{"event_type":"a","user_id":"user-1","ip":"$remote"}`,
			[]string{`{"event_type":"a","insert_id":"ID0","user_id":"user-1"}`}, "", ""},
		{"envelope", `{"api_key":"other","events":[{"event_type":"a","device_id":"device-1"},{"event_type":"b","device_id":"device-1","insert_id":"x"}]}`,
			[]string{`{"device_id":"device-1","event_type":"a","insert_id":"ID0"}`, `{"device_id":"device-1","event_type":"b","insert_id":"x"}`}, "", ""},
		{"export record", `{"app":1,"svc_id":7,"uuid":"u","$insert_id":"i1","event_type":"a","device_id":"device-1","user_id":null,` +
			`"event_time":"2026-03-01 10:15:00.123000","client_event_time":"2026-03-01 10:15:00.100000","server_upload_time":"2026-03-01 10:16:00.000000",` +
			`"ip_address":"192.0.2.1","version_name":"1.2","device_carrier":"c","event_properties":{"k":1},"data":{},"sample_rate":null,"paying":true}`,
			[]string{`{"app_version":"1.2","carrier":"c","device_id":"device-1","event_properties":{"k":1},"event_type":"a","insert_id":"i1","ip":"192.0.2.1","time":1772360100123}`},
			"app 1, client_event_time 1, data 1, paying 1, server_upload_time 1, svc_id 1, uuid 1", ""},
		{"export record without event_time", `{"uuid":"u","event_type":"a","device_id":"device-1","client_event_time":"2026-03-01T10:15:00Z"}`,
			[]string{`{"device_id":"device-1","event_type":"a","insert_id":"ID0","time":1772360100000}`}, "uuid 1", ""},
		{"not JSON", `{"event_type":`, nil, "", "not a JSON object"},
		{"envelope with a bad event", `{"events":[1]}`, nil, "", "event 0 is not an object"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := line{at: pos{Entry: 2, Offset: 100}, text: []byte(tt.line + "\n")}
			dropped := map[string]int64{}
			evs, err := events(l, dropped)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range evs {
				got = append(got, string(e))
			}
			var want []string
			for i, w := range tt.want {
				want = append(want, strings.ReplaceAll(w, fmt.Sprintf("ID%d", i), derivedID(l, i)))
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("events\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if s := (Counts{Dropped: dropped}).DroppedSummary(); s != tt.dropped {
				t.Fatalf("dropped %q, want %q", s, tt.dropped)
			}
		})
	}
	// The derived id depends on the line and its place, nothing else.
	a := line{at: pos{0, 10}, text: []byte(`{"event_type":"a"}`)}
	b := line{at: pos{0, 10}, text: []byte(`{"event_type":"a"}` + "\n")}
	c := line{at: pos{0, 11}, text: []byte(`{"event_type":"a"}`)}
	if derivedID(a, 0) != derivedID(b, 0) || derivedID(a, 0) == derivedID(c, 0) || derivedID(a, 0) == derivedID(a, 1) {
		t.Fatal("derived ids: not stable, or equal for different places")
	}
}

// TestInputResume: every input form read from each line's recorded
// position gives the rest of the lines, as read in one go.
func TestInputResume(t *testing.T) {
	dir := t.TempDir()
	lines := func(from, n int) string {
		var b strings.Builder
		for i := from; i < from+n; i++ {
			fmt.Fprintf(&b, `{"event_type":"e%d"}`+"\n", i)
			if i%4 == 0 {
				b.WriteString("\n") // blank lines are skipped
			}
		}
		return b.String()
	}
	gz := func(s string) []byte {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		w.Write([]byte(s))
		w.Close()
		return b.Bytes()
	}
	plain := filepath.Join(dir, "plain.jsonl")
	os.WriteFile(plain, []byte(lines(0, 10)), 0o644)
	gzipped := filepath.Join(dir, "events.jsonl.gz")
	os.WriteFile(gzipped, gz(lines(0, 10)), 0o644)
	archive := filepath.Join(dir, "export.zip")
	var zb bytes.Buffer
	zw := zip.NewWriter(&zb)
	for i, body := range [][]byte{[]byte(lines(0, 5)), gz(lines(5, 5)), nil, []byte(strings.TrimSuffix(lines(10, 3), "\n"))} {
		w, _ := zw.Create(fmt.Sprintf("1/1_2026-03-01_%d#0.json", i))
		w.Write(body)
	}
	zw.Close()
	os.WriteFile(archive, zb.Bytes(), 0o644)

	for _, path := range []string{plain, gzipped, archive} {
		var all []line
		in, err := openInput(path, pos{})
		if err != nil {
			t.Fatal(err)
		}
		for {
			l, err := in.next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			l.text = append([]byte(nil), l.text...)
			all = append(all, l)
		}
		in.close()
		if path != archive && len(all) != 10 || path == archive && len(all) != 13 {
			t.Fatalf("%s: %d lines", path, len(all))
		}
		for i := range all {
			in, err := openInput(path, all[i].at)
			if err != nil {
				t.Fatal(err)
			}
			for j := i; j < len(all); j++ {
				l, err := in.next()
				if err != nil || string(l.text) != string(all[j].text) || l.at != all[j].at {
					t.Fatalf("%s from line %d: line %d is %q at %v (%v), want %q at %v", path, i, j, l.text, l.at, err, all[j].text, all[j].at)
				}
			}
			if _, err := in.next(); !errors.Is(err, io.EOF) {
				t.Fatalf("%s: no end after the last line: %v", path, err)
			}
			in.close()
		}
	}
}

func startSim(t *testing.T, cfg sim.Config) (*sim.Sim, string) {
	t.Helper()
	s := sim.New(cfg, nil)
	u, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, u
}

// TestRunDeadLettersAndReport: lines that are not JSON and events the
// ingest would refuse are dead letters at once, listed in the report; the
// rest is delivered; Run returns nil (all delivered or dead).
func TestRunDeadLettersAndReport(t *testing.T) {
	s, up := startSim(t, sim.Config{})
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	os.WriteFile(in, []byte(`{"event_type":"ok","device_id":"device-1"}
not json
{"event_type":"no ids"}
{"event_type":"bad time","device_id":"device-1","time":"2026-01-01"}
{"event_type":"ok2","device_id":"device-1"}
`), 0o644)
	c, err := Run(context.Background(), Config{IngestURL: up, APIKey: "k", Dir: filepath.Join(dir, "data"), Files: []string{in}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Read != 4 || c.Dead != 3 || c.Delivered != 2 || c.Waiting != 0 {
		t.Fatalf("counts %+v", c)
	}
	if n := len(s.Events("k")); n != 2 {
		t.Fatalf("%d events delivered", n)
	}
	b, err := os.ReadFile(filepath.Join(dir, "data", "backfill-report.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r reportLine
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		reasons = append(reasons, r.Reason)
	}
	sort.Strings(reasons)
	if strings.Join(reasons, ",") != "invalid_fields,missing_fields,unreadable" {
		t.Fatalf("report reasons %v:\n%s", reasons, b)
	}
}

// TestRunStopsOnInvalidKey: an api_key the upstream refuses stops the run
// with an error and drops nothing; a run with another key into the same
// data dir is refused.
func TestRunStopsOnInvalidKey(t *testing.T) {
	_, up := startSim(t, sim.Config{APIKeys: []string{"good"}})
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	os.WriteFile(in, []byte(`{"event_type":"a","device_id":"device-1"}`+"\n"), 0o644)
	cfg := Config{IngestURL: up, APIKey: "bad", Dir: filepath.Join(dir, "data"), Files: []string{in}}
	c, err := Run(context.Background(), cfg, nil)
	if err == nil || !strings.Contains(err.Error(), "delivery stopped") || c.Waiting != 1 || c.Dead != 0 {
		t.Fatalf("err %v, counts %+v", err, c)
	}
	cfg.APIKey = "good"
	if _, err := Run(context.Background(), cfg, nil); err == nil || !strings.Contains(err.Error(), "another project") {
		t.Fatalf("a run of another key into the data dir: %v", err)
	}
	cfg.APIKey, cfg.Batch = "bad", true
	if _, err := Run(context.Background(), cfg, nil); err == nil || !strings.Contains(err.Error(), "another project or upstream") {
		t.Fatalf("a run to /batch into the data dir of a /2/httpapi run: %v", err)
	}
	// The same base with a trailing slash is the same upstream: the run
	// resumes (and stops again on the key).
	cfg.Batch, cfg.IngestURL = false, up+"/"
	if _, err := Run(context.Background(), cfg, nil); err == nil || !strings.Contains(err.Error(), "delivery stopped") {
		t.Fatalf("a resume with a trailing slash: %v", err)
	}
}

// TestMaxEPS: the project's pace holds through a real upstream: the run
// takes at least what MaxEPS allows.
func TestMaxEPS(t *testing.T) {
	s, up := startSim(t, sim.Config{})
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	var b strings.Builder
	const n, maxEPS = 3000, 1000
	for i := range n {
		fmt.Fprintf(&b, `{"event_type":"e","device_id":"device-%04d"}`+"\n", i) // one event per device
	}
	os.WriteFile(in, []byte(b.String()), 0o644)
	start := time.Now()
	c, err := Run(context.Background(), Config{IngestURL: up, APIKey: "k", Dir: filepath.Join(dir, "data"), Files: []string{in}, MaxEPS: maxEPS}, nil)
	if err != nil || c.Delivered != n {
		t.Fatalf("%v %+v", err, c)
	}
	// Only the lower bound is checked here, from before the run to the
	// last arrival: a loaded machine can delay a request between its
	// release and its arrival, and so bunch arrivals beyond any bound, but
	// never make the whole run faster. The bound on every window is
	// TestLimiterWindows', on the limiter's own clock.
	reqs := s.Requests()
	if d := reqs[len(reqs)-1].Time.Sub(start); d < (n-maxEPS/10)*time.Second/maxEPS {
		t.Fatalf("%d events in %v at %d/s", n, d, maxEPS)
	}
}

// TestRunUpstreamFaults: 5xx answers and dropped connections are retried,
// a silenced device's events are dead letters in the report, and the rest
// arrives once, as in the daemon.
func TestRunUpstreamFaults(t *testing.T) {
	s := simtest.New(sim.Config{}, nil)
	up, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	simtest.Silence(s, "device-silent")
	s.FailNext(3, 503)
	s.DropNext(2, simtest.DropAfterIngest)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	var b strings.Builder
	for i := range 200 {
		dev := fmt.Sprintf("device-%02d", i%10)
		if i%50 == 0 {
			dev = "device-silent"
		}
		fmt.Fprintf(&b, `{"event_type":"e","device_id":%q,"event_properties":{"i":%d}}`+"\n", dev, i)
	}
	os.WriteFile(in, []byte(b.String()), 0o644)
	c, err := Run(context.Background(), Config{IngestURL: up, APIKey: "k", Dir: filepath.Join(dir, "data"), Files: []string{in}, MaxEPS: 5000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Dead != 4 || c.Waiting != 0 || c.Read != 200 {
		t.Fatalf("counts %+v", c)
	}
	stored := map[string]bool{}
	for _, e := range s.Events("k") {
		if stored[e.InsertID] || e.DeviceID == "device-silent" {
			t.Fatalf("event %s stored twice, or of the silenced device", e.InsertID)
		}
		stored[e.InsertID] = true
	}
	if len(stored) != 196 {
		t.Fatalf("%d events stored, want 196", len(stored))
	}
	rep, _ := os.ReadFile(filepath.Join(dir, "data", "backfill-report.jsonl"))
	if n := strings.Count(string(rep), `"reason":"silenced"`); n != 4 {
		t.Fatalf("%d silenced events in the report:\n%s", n, rep)
	}
}

// TestRunInterruptedResumes: a run whose context ends returns
// ErrInterrupted with events waiting; the same Config again delivers the
// rest, every event once.
func TestRunInterruptedResumes(t *testing.T) {
	s, up := startSim(t, sim.Config{})
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	var b strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&b, `{"event_type":"e","device_id":"device-%02d","event_properties":{"i":%d}}`+"\n", i%20, i)
	}
	os.WriteFile(in, []byte(b.String()), 0o644)
	cfg := Config{IngestURL: up, APIKey: "k", Dir: filepath.Join(dir, "data"), Files: []string{in}}
	ctx, cancel := context.WithCancel(context.Background())
	cfg.Progress = func(c Counts) {
		if c.Delivered >= 200 {
			cancel()
		}
	}
	c, err := Run(ctx, cfg, nil)
	if !errors.Is(err, ErrInterrupted) || c.Waiting == 0 {
		t.Fatalf("err %v, counts %+v", err, c)
	}
	cfg.Progress = nil
	c2, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The second run sends what waited in the spool (some of it delivered
	// already: its chunk was not acknowledged yet) and what was not read;
	// nothing read and acknowledged is read again.
	if sent := c.Sent + c2.Sent; sent > 2000+c.Waiting {
		t.Fatalf("%d events sent in all, more than the 2000 read plus the %d that waited", sent, c.Waiting)
	}
	evs := s.Events("k")
	seen := map[string]bool{}
	for _, e := range evs {
		if seen[e.InsertID] {
			t.Fatalf("insert_id %s stored twice", e.InsertID)
		}
		seen[e.InsertID] = true
	}
	if len(evs) != 2000 {
		t.Fatalf("%d events stored, want 2000", len(evs))
	}
}

// TestLimiterYields: the project's pace less the live traffic's; nothing
// while live traffic takes the whole rate.
func TestLimiterYields(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var live atomic.Int64
		l := newLimiter(100, 10, func() float64 { return float64(live.Load()) })
		ctx := context.Background()
		took := func(d time.Duration) int { // events taken in d, 10 at a time
			n := 0
			for end := time.Now().Add(d); time.Now().Before(end); n += 10 {
				if err := l.wait(ctx, 10); err != nil {
					t.Fatal(err)
				}
			}
			return n
		}
		if n := took(10 * time.Second); n < 1000 || n > 1020 {
			t.Fatalf("%d events in 10 s at 100/s", n)
		}
		live.Store(75)
		if n := took(10 * time.Second); n < 250 || n > 270 {
			t.Fatalf("%d events in 10 s at 100/s less 75 live", n)
		}
		live.Store(150)
		done := make(chan struct{})
		go func() {
			l.wait(ctx, 10)
			l.wait(ctx, 10)
			close(done)
		}()
		time.Sleep(time.Minute)
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("sent while live traffic took the whole rate")
		default:
		}
		live.Store(0)
		<-done
	})
}

// TestLimiterWindows: with several shards waiting at once for requests of
// different sizes, the events released in any window of W seconds are at
// most rate*W plus the bucket's burst.
func TestLimiterWindows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rate, burst = 1000, 100
		l := newLimiter(rate, burst, nil)
		type release struct {
			at time.Time
			n  int
		}
		var mu sync.Mutex
		var rel []release
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := range 25 {
					n := 20 + 25*w + i%7
					if err := l.wait(context.Background(), n); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					rel = append(rel, release{time.Now(), n})
					mu.Unlock()
					// Gaps, one of them long enough to fill the bucket
					// many times over: what it may then release at once
					// is the burst, not what the gap earned.
					time.Sleep(time.Duration(i%3) * 30 * time.Millisecond)
					if i == 12 {
						time.Sleep(time.Second)
					}
				}
			})
		}
		wg.Wait()
		sort.Slice(rel, func(i, j int) bool { return rel[i].at.Before(rel[j].at) })
		for _, w := range []time.Duration{100 * time.Millisecond, time.Second, 2 * time.Second} {
			lo, sum := 0, 0
			for hi := range rel {
				sum += rel[hi].n
				for rel[hi].at.Sub(rel[lo].at) >= w {
					sum -= rel[lo].n
					lo++
				}
				if most := int(rate*w.Seconds()) + burst; sum > most {
					t.Fatalf("%d events released within %v (at most %d)", sum, w, most)
				}
			}
		}
		if d := rel[len(rel)-1].at.Sub(rel[0].at); d < time.Duration(float64(total(rel, func(r release) int { return r.n })-burst)/rate*float64(time.Second)) {
			t.Fatalf("all released in %v, faster than %d/s", d, rate)
		}
	})
}

func total[T any](xs []T, n func(T) int) int {
	s := 0
	for _, x := range xs {
		s += n(x)
	}
	return s
}

// TestRunBatchEndpoint: Config.Batch sends to /batch.
func TestRunBatchEndpoint(t *testing.T) {
	s, up := startSim(t, sim.Config{})
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	os.WriteFile(in, []byte(`{"event_type":"a","device_id":"device-1"}`+"\n"), 0o644)
	if _, err := Run(context.Background(), Config{IngestURL: up, APIKey: "k", Dir: filepath.Join(dir, "data"), Files: []string{in}, Batch: true}, nil); err != nil {
		t.Fatal(err)
	}
	reqs := s.Requests()
	if len(reqs) != 1 || reqs[0].Path != "/batch" || len(s.Events("k")) != 1 {
		t.Fatalf("requests %+v", reqs)
	}
}
