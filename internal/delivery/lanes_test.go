package delivery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"weak"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/throttle"
	"github.com/svcrelay/relay/internal/upstream"
)

// scraper scrapes a /metrics handler on 127.0.0.1 in a loop until stopped:
// the issue-19 deadlock hung a scrape for good, so every scrape has a
// deadline and one that misses it fails the test.
type scraper struct {
	t       *testing.T
	url     string
	n       atomic.Int64
	maxSize atomic.Int64
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	err     error
}

func startScraper(t *testing.T, h http.Handler) *scraper {
	srv := httptest.NewServer(h) // 127.0.0.1
	s := &scraper{t: t, url: srv.URL, stop: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() {
		s.mu.Lock()
		failed := s.err != nil
		s.mu.Unlock()
		select {
		case <-s.done:
			if !failed {
				srv.Close()
				return
			}
		default:
		}
		// A hung scrape: Close would wait for its handler for ever.
		srv.CloseClientConnections()
	})
	cli := &http.Client{Timeout: 20 * time.Second}
	go func() {
		defer close(s.done)
		for i := 0; i < 100000; i++ { // bounded; stopped long before
			select {
			case <-s.stop:
				return
			default:
			}
			resp, err := cli.Get(s.url)
			if err == nil {
				var b []byte
				b, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				if err == nil && resp.StatusCode != 200 {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
				s.maxSize.Store(max(s.maxSize.Load(), int64(len(b))))
			}
			if err != nil {
				s.mu.Lock()
				s.err = fmt.Errorf("scrape %d: %w", i, err)
				s.mu.Unlock()
				return
			}
			s.n.Add(1)
		}
	}()
	return s
}

// finish stops the loop and returns its error; a scrape that hangs fails.
func (s *scraper) finish() error {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	select {
	case <-s.done:
	case <-time.After(polltest.Max):
		return errors.New("a scrape hung")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// /metrics is scraped in a loop while thousands of lanes
// are created, stopped, resumed and the pipeline restarted. No scrape may
// hang, and every lane created during the scrapes must start and deliver.
// Before the fix, Run held the pipeline's mutex while creating a lane's
// relay_lane_stopped series, and a scrape's gauge waited for that mutex
// while holding the series vector's lock: scrapes, the admin API and every
// lane created afterwards hung for good.
func TestMetricsScrapeWhileLanesChurn(t *testing.T) {
	h := newHarness(t, sim.Config{}, Config{ShardsPerLane: 2}, throttle.Config{})
	sc := startScraper(t, promhttp.HandlerFor(h.reg, promhttpOpts()))
	fail := func(format string, args ...any) {
		t.Helper()
		if err := sc.finish(); err != nil {
			t.Errorf("after %d scrapes: %v", sc.n.Load(), err)
		}
		t.Fatalf(format, args...)
	}
	h.start()
	lanes := 3000
	if raceEnabled {
		lanes = 800
	}
	deadline := time.Now().Add(polltest.Max)
	for i := 0; i < lanes; i++ {
		key := fmt.Sprintf("churn-key-%04d", i)
		h.add(key, ev{Device: "dev-1"})
		switch {
		case i%250 == 100:
			// Stop and resume a lane the pipeline runs (both touch
			// relay_lane_stopped), from another goroutine like the
			// admin API.
			id := h.lane(fmt.Sprintf("churn-key-%04d", i-50), "").ID()
			go func() {
				if err := h.p.StopLane(id); err == nil {
					_ = h.p.ResumeLane(id)
				}
			}()
		case i == lanes/2:
			// Restart delivery: every lane's runner starts again.
			h.cancel()
			select {
			case <-h.done:
			case <-time.After(polltest.Max):
				h.cancel = nil // hung: the cleanup must not wait for it again
				fail("Run did not return within polltest.Max")
			}
			h.start()
		}
		if time.Now().After(deadline) {
			fail("creating lanes took over 60s (%d of %d)", i, lanes)
		}
	}
	polltest.Until(t, "every lane's event delivered", func() bool { return h.sim.Count() >= int64(lanes) })
	if err := sc.finish(); err != nil {
		t.Fatalf("after %d scrapes: %v", sc.n.Load(), err)
	}
	if sc.n.Load() < 5 {
		t.Fatalf("only %d scrapes ran", sc.n.Load())
	}
	for _, st := range h.p.LaneStatus() {
		if st.Stopped {
			t.Errorf("lane %s left stopped: %+v", st.Label, st)
		}
	}
	h.stop()
	h.check(nil)
	t.Logf("%d lanes, %d scrapes, largest %d bytes", lanes, sc.n.Load(), sc.maxSize.Load())
}

func promhttpOpts() promhttp.HandlerOpts {
	return promhttp.HandlerOpts{Timeout: 0}
}

// churnRelay is a spool, the simulator and a pipeline with every metric on
// one registry, for the lane-count tests.
type churnRelay struct {
	t      testing.TB
	dir    string
	reg    *prometheus.Registry
	sink   *sink
	sp     *spool.Spool
	p      *Pipeline
	cancel context.CancelFunc
	done   chan error
	scfg   spool.Config
	cfg    Config
	// refused counts the lanes refused for MaxLanes (and asked again).
	refused int
	// inProcess: the pipeline sends to sink's handler (sinkSender).
	inProcess bool
}

// sinkSender sends to a sink's handler in the same process and classifies
// its answer with the upstream package, as the real client does.
type sinkSender struct{ sink *sink }

func (f sinkSender) Do(ctx context.Context, r *upstream.Request) upstream.Result {
	req := httptest.NewRequestWithContext(ctx, "POST", "/2/httpapi", bytes.NewReader(r.Body))
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	f.sink.ServeHTTP(w, req)
	return upstream.Classify(w.Code, w.Body.Bytes(), w.Header().Get("Retry-After"), nil)
}

func newChurnRelay(t testing.TB, scfg spool.Config) *churnRelay {
	return newChurnRelayOn(t, scfg, false)
}

// newChurnRelayOn is newChurnRelay, for a synctest bubble when inProcess:
// the pipeline sends to the sink's handler in the same process
// (sinkSender), with no socket, so that every wait is in fake time.
func newChurnRelayOn(t testing.TB, scfg spool.Config, inProcess bool) *churnRelay {
	r := &churnRelay{t: t, dir: t.TempDir(), sink: &sink{}, inProcess: inProcess}
	url := "http://sink"
	if !inProcess {
		srv := httptest.NewServer(r.sink) // 127.0.0.1
		t.Cleanup(srv.Close)
		url = srv.URL
	}
	scfg.Dir, scfg.NoSync, scfg.MinFreeBytes = r.dir, true, -1
	r.scfg = scfg
	r.cfg = Config{Live: Live{IngestURL: url, FlushInterval: 5 * time.Millisecond}, RetryInitial: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond}
	r.open()
	t.Cleanup(r.close)
	return r
}

func (r *churnRelay) open() {
	r.t.Helper()
	r.reg = prometheus.NewRegistry()
	var err error
	if r.sp, err = spool.Open(r.scfg, nil, r.reg); err != nil {
		r.t.Fatal(err)
	}
	var send Sender = sinkSender{r.sink}
	if !r.inProcess {
		if send, err = upstream.New(upstream.Config{Timeout: 5 * time.Second}, r.reg); err != nil {
			r.t.Fatal(err)
		}
	}
	if r.p, err = New(r.cfg, local(r.sp), send, nil, zaptest.NewLogger(r.t, zaptest.Level(zap.WarnLevel)), r.reg); err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan error, 1)
	go func() { r.done <- r.p.Run(ctx) }()
}

func (r *churnRelay) close() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(polltest.Max):
		r.t.Error("Run did not return")
	}
	r.cancel = nil
	if err := r.sp.Close(); err != nil {
		r.t.Error(err)
	}
}

func (r *churnRelay) add(key string, n int) {
	r.t.Helper()
	ctx := context.Background()
	l, err := r.sp.Lane(ctx, storage.LaneKey{Kind: storage.KindEvents, APIKey: key})
	for try := 0; errors.Is(err, spool.ErrTooManyLanes) && try < 1000; try++ {
		// --max-lanes: the SDK is answered 503 + Retry-After and
		// sends again later, when idle lanes were retired.
		r.refused++
		time.Sleep(10 * time.Millisecond)
		l, err = r.sp.Lane(ctx, storage.LaneKey{Kind: storage.KindEvents, APIKey: key})
	}
	if err != nil {
		r.t.Fatal(err)
	}
	var b storage.Batch
	for i := range n {
		b.Add(storage.Record{OrderKey: []byte("d:device-1"), Data: fmt.Appendf(nil, `{"event_type":"e","device_id":"device-1","insert_id":"%s-%d"}`, key, i)})
	}
	if err := r.sp.Append(ctx, l, &b); err != nil {
		r.t.Fatal(err)
	}
}

func (r *churnRelay) metricsSize() int {
	r.t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.Len()
}

func (r *churnRelay) waitFor(what string, d time.Duration, cond func() bool) {
	r.t.Helper()
	d = max(d, polltest.Max) // real time: a loaded machine stretches every wait
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: not within %v (lanes %d, goroutines %d, delivered %d)", what, d, r.sp.Stats().Lanes, runtime.NumGoroutine(), r.sink.n.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sink is an upstream that counts the events it is sent and keeps nothing
// (the simulator keeps every event: its memory would hide the relay's).
type sink struct{ n atomic.Int64 }

func (k *sink) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var env struct {
		Events []json.RawMessage `json:"events"`
	}
	if err := json.NewDecoder(req.Body).Decode(&env); err != nil {
		http.Error(w, `{"code":400,"error":"Invalid JSON request body"}`, 400)
		return
	}
	k.n.Add(int64(len(env.Events)))
	fmt.Fprintf(w, `{"code":200,"events_ingested":%d,"payload_size_bytes":1,"server_upload_time":1}`, len(env.Events))
}

// rss is the process's resident set (after the free heap is given back to
// the OS), 0 where /proc is missing.
func rss() uint64 {
	debug.FreeOSMemory()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// 20,000 distinct api_keys over an hour-equivalent run
// (keys come in waves; a lane idle for the retire time is retired, here
// 100ms standing for the default 10 minutes): every event is delivered,
// lanes, goroutines, heap and /metrics stay within the bounds the README
// gives, and a restart brings no retired lane back.
func TestTwentyThousandKeys(t *testing.T) {
	keys, wave := 20000, 2000
	if raceEnabled || testing.Short() {
		keys, wave = 2000, 500
	}
	r := newChurnRelay(t, spool.Config{RetireIdle: 100 * time.Millisecond, MaxLanes: wave})
	baseG, baseHeap, baseMetrics, baseRSS := runtime.NumGoroutine(), heapInuse(), r.metricsSize(), rss()
	var peakG, peakLanes, peakMetrics int
	var peakHeap uint64
	for w := 0; w < keys/wave; w++ {
		for i := range wave {
			r.add(fmt.Sprintf("%032x", w*wave+i), 1+i%3)
		}
		peakG = max(peakG, runtime.NumGoroutine())
		peakLanes = max(peakLanes, r.sp.Stats().Lanes)
		peakMetrics = max(peakMetrics, r.metricsSize())
		peakHeap = max(peakHeap, heapInuse())
		delivered := int64(0)
		for i := range (w + 1) * wave {
			delivered += int64(1 + i%wave%3)
		}
		r.waitFor(fmt.Sprintf("wave %d delivered", w), 60*time.Second, func() bool { return r.sink.n.Load() >= delivered })
	}
	t0 := time.Now()
	r.waitFor("every lane retired", 30*time.Second, func() bool {
		if st := r.p.LaneStatus(); len(st) > 0 && r.sp.Stats().Lanes == 0 {
			if l, ok := lr(r.p, st[0].ID); ok && time.Since(t0) > 20*time.Second {
				t.Logf("left: %d, e.g. %+v retired %v stats %+v goroutines %d", len(st), st[0], l.IsRetired(), l.Stats(), runtime.NumGoroutine())
			}
		}
		return r.sp.Stats().Lanes == 0 && len(r.p.LaneStatus()) == 0
	})
	// What stays: the upstream client's kept-alive connections and the
	// simulator's goroutines serving them.
	r.waitFor("goroutines back", 10*time.Second, func() bool { return runtime.NumGoroutine() <= baseG+200 })
	endHeap, endMetrics, endRSS := heapInuse(), r.metricsSize(), rss()
	t.Logf("%d keys in waves of %d (%d refused for max-lanes, then taken): peak %d lanes, %d goroutines (%d at start), heap %d KiB at peak, %d KiB at the end (%d KiB at start), /metrics %d bytes at peak, %d at the end (%d at start)",
		keys, wave, r.refused, peakLanes, peakG, baseG, peakHeap>>10, endHeap>>10, baseHeap>>10, peakMetrics, endMetrics, baseMetrics)
	t.Logf("RSS %d MiB at start, %d MiB after every lane retired", baseRSS>>20, endRSS>>20)
	// (The race detector's shadow memory makes RSS meaningless under -race.)
	if !raceEnabled && endRSS > baseRSS+32<<20 {
		t.Errorf("RSS %d MiB after every lane retired, %d MiB at start", endRSS>>20, baseRSS>>20)
	}
	// The bounds: the README's per-lane costs times the lanes alive at once.
	perLaneG := DefaultShardsPerLane + 1
	if peakLanes > wave {
		t.Errorf("peak %d lanes, max %d", peakLanes, wave)
	}
	// Plus the upstream connections' (client and server) goroutines.
	if peakG > baseG+perLaneG*wave+200 {
		t.Errorf("peak goroutines %d, base %d, %d lanes", peakG, baseG, peakLanes)
	}
	// What stays is fixed, not per key (4,000 keys left the same as
	// 20,000): buffer pools, histogram buckets and status labels filled.
	if endMetrics > baseMetrics+2048 {
		t.Errorf("/metrics %d bytes after every lane retired, %d at start", endMetrics, baseMetrics)
	}
	if endHeap > baseHeap+16<<20 {
		t.Errorf("heap %d KiB after every lane retired, %d KiB at start", endHeap>>10, baseHeap>>10)
	}
	if got := r.sink.n.Load(); got != int64(keys/wave)*int64(func() int {
		n := 0
		for i := range wave {
			n += 1 + i%3
		}
		return n
	}()) {
		t.Errorf("sim got %d events", got)
	}
	// A restart does not bring them back.
	r.close()
	r.open()
	if n := r.sp.Stats().Lanes; n != 0 {
		t.Fatalf("%d lanes after a restart", n)
	}
}

// What one idle lane costs (goroutines, heap), for the README: no
// goroutine (its reader and shards end once it is idle; the engine starts
// them again at its next record) and a few KB of heap.
func TestLaneCost(t *testing.T) {
	n := 2000
	if raceEnabled || testing.Short() {
		n = 300
	}
	r := newChurnRelay(t, spool.Config{RetireIdle: -1, MaxLanes: -1})
	baseG, baseHeap, baseMetrics := runtime.NumGoroutine(), heapInuse(), r.metricsSize()
	for i := range n {
		r.add(fmt.Sprintf("%032x", i), 1)
	}
	r.waitFor("delivered", 60*time.Second, func() bool { return r.sink.n.Load() >= int64(n) })
	r.waitFor("idle", 10*time.Second, func() bool { return r.p.budget.Used() == 0 })
	// Past the readers' and shards' idle time (a second); what stays is
	// the upstream connections kept alive (client and server goroutines).
	r.waitFor("idle lanes' goroutines ended", 2*time.Minute, func() bool { return runtime.NumGoroutine() <= baseG+100 })
	g, heap, ms := runtime.NumGoroutine(), heapInuse(), r.metricsSize()
	var mst runtime.MemStats
	runtime.ReadMemStats(&mst)
	perG := float64(g-baseG) / float64(n)
	t.Logf("per idle lane: %.2f goroutines, %.0f bytes of heap, %.0f bytes of goroutine stacks in all (%d lanes), %.0f bytes of /metrics",
		perG, float64(heap-baseHeap)/float64(n), float64(mst.StackInuse)/float64(n), n, float64(ms-baseMetrics)/float64(n))
	// (The race detector's shadow memory counts too under -race.)
	if perHeap := float64(heap-baseHeap) / float64(n); !raceEnabled && perHeap > 6<<10 {
		t.Errorf("%.0f bytes of heap per idle lane", perHeap)
	}
}

// BenchmarkCreateLane: a new lane (created, one event appended, delivered)
// with 0 or 5,000 lanes existing costs the same (it grew with
// the lanes, 2,500 new ones took 1.8 s at first and 10.3 s with 7,500).
func BenchmarkCreateLane(b *testing.B) {
	for _, existing := range []int{0, 5000} {
		b.Run(fmt.Sprintf("existing=%d", existing), func(b *testing.B) {
			r := newChurnRelay(b, spool.Config{RetireIdle: -1, MaxLanes: -1})
			for i := range existing {
				r.add(fmt.Sprintf("old-%d", i), 1)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				r.add(fmt.Sprintf("new-%d", i), 1)
			}
		})
	}
}

// A retired lane leaves nothing behind: once every lane made through the
// ingest's path (spool.Backend) has been delivered and retired, no
// spool.Lane and no laneRunner is reachable any more (no cache, index, map,
// timer or goroutine keeps one), the goroutines and /metrics are back to
// where they started, and the lanes that are idle before they retire hold
// no goroutine.
func TestRetiredLaneLeavesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 300
		r := newChurnRelayOn(t, spool.Config{RetireIdle: 3 * time.Second}, true)
		local := spool.NewBackend(r.sp)
		ctx := context.Background()
		baseG, baseMetrics := runtime.NumGoroutine(), r.metricsSize()
		t0 := time.Now()
		var lanes []weak.Pointer[spool.Lane]
		for i := range n {
			var b storage.Batch
			b.Add(storage.Record{OrderKey: []byte("d:device-1"), Data: fmt.Appendf(nil, `{"event_type":"e","device_id":"device-1","insert_id":"%d"}`, i)})
			req := storage.Request{Kind: storage.KindEvents, APIKey: fmt.Appendf(nil, "key-%04d", i), Batch: &b}
			if i%2 == 1 {
				req.Options = []byte(`{"min_id_length":1}`)
			}
			k := req.Lane()
			if err := local.Append(ctx, req); err != nil {
				t.Fatal(err)
			}
			l, err := r.sp.Lane(ctx, k) // the lane appended to, or (retired already) a new empty one
			if err != nil {
				t.Fatal(err)
			}
			lanes = append(lanes, weak.Make(l))
		}
		// The runners that exist now (on a slow machine some lanes may have
		// retired already).
		var runners []weak.Pointer[laneRunner]
		r.waitFor("runners started", 2*time.Minute, func() bool { return len(r.p.runnerList()) > 0 })
		for _, lr := range r.p.runnerList() {
			runners = append(runners, weak.Make(lr))
		}
		r.waitFor("delivered", 2*time.Minute, func() bool { return r.sink.n.Load() >= n })
		// Idle, not yet retired: no goroutine per lane.
		r.waitFor("idle lanes hold no goroutine", 2*time.Minute, func() bool {
			return r.sp.Stats().Lanes < n || runtime.NumGoroutine() <= baseG+50
		})
		r.waitFor("every lane retired", 2*time.Minute, func() bool {
			return r.sp.Stats().Lanes == 0 && len(r.p.LaneStatus()) == 0
		})
		// What stays: the upstream connections kept alive (client and server
		// goroutines), until their idle time-out.
		r.waitFor("goroutines back", 2*time.Minute, func() bool { return runtime.NumGoroutine() <= baseG+100 })
		t.Logf("every lane retired after %v; goroutines %d (%d at start)", time.Since(t0), runtime.NumGoroutine(), baseG)
		left := 0
		for try := 0; try < 100; try++ {
			runtime.GC()
			left = 0
			for _, w := range lanes {
				if w.Value() != nil {
					left++
				}
			}
			for _, w := range runners {
				if w.Value() != nil {
					left++
				}
			}
			if left == 0 {
				break
			}
			synctest.Wait() // a goroutine that was ending
		}
		if left > 0 {
			t.Errorf("%d of %d lanes and runners still reachable after every lane retired", left, len(lanes)+len(runners))
		}
		if m := r.metricsSize(); m > baseMetrics+2048 {
			t.Errorf("/metrics %d bytes after every lane retired, %d at start", m, baseMetrics)
		}
		runtime.KeepAlive(local) // the ingest's, for the relay's life
	})
}

// lr is the spool lane of p's runner id.
func lr(p *Pipeline, id uint64) (*spool.Lane, bool) {
	r := p.lane(id)
	if r == nil {
		return nil, false
	}
	l, ok := r.src.(*spool.Lane)
	return l, ok
}
