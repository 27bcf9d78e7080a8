package delivery

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/upstream"
)

// The form kinds (group identify, user mappings) run on the lane runner
// of events: these tests drive NewForm's pipeline over a real spool.

// formUpstream starts the simulator with fault injection on 127.0.0.1
// (closed at cleanup) and returns it, its base URL and a client.
func formUpstream(t *testing.T) (*simtest.Sim, string, *upstream.Client) {
	t.Helper()
	s := simtest.New(sim.Config{}, nil)
	u, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	cli, err := upstream.New(upstream.Config{Timeout: 5 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, u, cli
}

func openFormSpool(t *testing.T, cfg spool.Config) *spool.Spool {
	t.Helper()
	cfg.Dir, cfg.NoSync, cfg.MinFreeBytes = t.TempDir(), true, -1
	sp, err := spool.Open(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

// giForm is the group identify kind's Form.
func giForm() Form {
	return Form{Field: "identification", MaxItems: 1024, MaxBodyBytes: 1 << 20}
}

// newGI returns a group identify pipeline sending to base over st, with
// no linger unless fc says otherwise.
func newGI(t *testing.T, fc FormConfig, base string, st Store, send Sender, reg prometheus.Registerer) *Pipeline {
	t.Helper()
	fc.Name, fc.Lanes, fc.Store = "groupidentify", storage.KindGroupIdentify, st
	fc.URL = func(string) string { return base + "/groupidentify" }
	if fc.Kind == nil {
		f := giForm()
		fc.Kind = &f
	}
	if fc.Linger == 0 {
		fc.Linger = -1
	}
	p, err := NewForm(fc, send, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// appendGI appends one chunk of group identifies v<from>..v<to-1> to lane
// key of sp.
func appendGI(t *testing.T, sp *spool.Spool, key string, from, to int) *spool.Lane {
	t.Helper()
	l, err := sp.Lane(context.Background(), storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	var b storage.Batch
	for i := from; i < to; i++ {
		b.Add(storage.Record{OrderKey: []byte("org"), Data: fmt.Appendf(nil, `{"group_type":"org","group_value":"v%d"}`, i)})
	}
	if err := sp.Append(context.Background(), l, &b); err != nil {
		t.Fatal(err)
	}
	return l
}

// runPipeline runs p until the test ends, then stops it and closes sp.
func runPipeline(t *testing.T, p *Pipeline, sp *spool.Spool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		sp.Close()
	})
}

// runUntilEmpty runs p until l holds no record (in a synctest bubble: the
// polls cost no time), then stops it.
func runUntilEmpty(p *Pipeline, l *spool.Lane) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	for l.Stats().Records != 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
}

func giValues(s *simtest.Sim, key string) []string {
	var got []string
	for _, g := range simtest.GroupIdentifies(s, key) {
		got = append(got, g.GroupValue)
	}
	return got
}

// The runner acts on an answer naming records of a form request: those
// named are dead letters, the others are sent again at once, in order, and
// the chunk is acknowledged after both.
func TestFormNamedRecords(t *testing.T) {
	s, base, cli := formUpstream(t)
	var answered atomic.Int32
	send := senderFunc(func(ctx context.Context, r *upstream.Request) upstream.Result {
		res := cli.Do(ctx, r)
		if answered.Add(1) == 1 {
			res.Kind, res.InvalidEvents = upstream.Invalid, map[int]string{1: "invalid_fields"}
		}
		return res
	})
	sp := openFormSpool(t, spool.Config{})
	p := newGI(t, FormConfig{}, base, spool.NewBackend(sp), send, nil)
	l := appendGI(t, sp, "k", 0, 3)
	runPipeline(t, p, sp)
	polltest.Until(t, "the lane acknowledged", func() bool { return l.Stats().Records == 0 })
	if got, want := giValues(s, "k"), []string{"v0", "v1", "v2", "v0", "v2"}; !slices.Equal(got, want) {
		t.Fatalf("upstream got %v, want %v (the request, then the two not named, in order)", got, want)
	}
	dead, err := sp.ListDead(context.Background(), storage.DeadFilter{}, 0, 0)
	if err != nil || len(dead) != 1 || dead[0].Reason != "invalid_fields" || string(dead[0].Record.Data) != `{"group_type":"org","group_value":"v1"}` {
		t.Fatalf("dead letters %+v (%v), want v1 alone, reason invalid_fields", dead, err)
	}
}

// formSender answers with fn and records each request's records (the form
// field, decoded) in fake time.
type formSender struct {
	mu   sync.Mutex
	sent [][]string
	at   []time.Time
	fn   func(n int) upstream.Result
}

func (f *formSender) Do(_ context.Context, r *upstream.Request) upstream.Result {
	v, _ := url.ParseQuery(string(r.Body))
	var recs []json.RawMessage
	_ = json.Unmarshal([]byte(v.Get("identification")), &recs)
	var list []string
	for _, r := range recs {
		list = append(list, string(r))
	}
	f.mu.Lock()
	f.sent = append(f.sent, list)
	f.at = append(f.at, time.Now())
	n := len(f.sent)
	f.mu.Unlock()
	return f.fn(n)
}

func (f *formSender) requests() ([][]string, []time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sent), slices.Clone(f.at)
}

// A request sent again after a wait leaves out the records that expired
// meanwhile: the older chunk's record is a dead letter (with the last
// answer), the younger one is resent alone.
func TestFormResendWithoutExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp := openFormSpool(t, spool.Config{})
		defer sp.Close()
		l := appendGI(t, sp, "k", 0, 1)
		start := time.Now()
		time.Sleep(5 * time.Millisecond) // the second chunk is accepted later
		appendGI(t, sp, "k", 1, 2)
		const maxAge = time.Minute
		f := &formSender{fn: func(n int) upstream.Result {
			if n == 1 {
				// The upstream answers after v0 has expired, v1 not.
				time.Sleep(time.Until(start.Add(maxAge + time.Millisecond)))
				return upstream.Classify(503, []byte(`{"code":503}`), "", nil)
			}
			return upstream.Classify(200, []byte(`{"code":200}`), "", nil)
		}}
		p := newGI(t, FormConfig{FormTiming: FormTiming{MaxAge: maxAge, RetryInitial: time.Millisecond, RetryMax: time.Millisecond}},
			"http://sim", spool.NewBackend(sp), f, nil)
		runUntilEmpty(p, l)
		got, _ := f.requests()
		if want := [][]string{{`{"group_type":"org","group_value":"v0"}`, `{"group_type":"org","group_value":"v1"}`}, {`{"group_type":"org","group_value":"v1"}`}}; !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("requests %q, want %q", got, want)
		}
		dead, err := sp.ListDead(context.Background(), storage.DeadFilter{}, 0, 0)
		if err != nil || len(dead) != 1 || dead[0].Reason != reasonExpired || string(dead[0].Record.Data) != `{"group_type":"org","group_value":"v0"}` ||
			!strings.Contains(string(dead[0].Answer), "503") {
			t.Fatalf("dead letters %+v (%v), want v0 alone, expired, with the last answer", dead, err)
		}
	})
}

// A lane lingers for more records while what it holds does not fill a
// request, and sends as soon as it is full: records of three chunks merge
// into a request of MaxItems at once (never a lone first record), and the
// rest goes when the linger ends.
func TestFormLingerUntilFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp := openFormSpool(t, spool.Config{})
		defer sp.Close()
		var l *spool.Lane
		for i := range 3 { // three chunks of one record
			l = appendGI(t, sp, "k", i, i+1)
		}
		start := time.Now()
		f := &formSender{fn: func(int) upstream.Result { return upstream.Classify(200, []byte(`{"code":200}`), "", nil) }}
		const linger = time.Minute
		p := newGI(t, FormConfig{Kind: &Form{Field: "identification", MaxItems: 2, MaxBodyBytes: 1 << 20},
			FormTiming: FormTiming{Linger: linger}}, "http://sim", spool.NewBackend(sp), f, nil)
		runUntilEmpty(p, l)
		got, at := f.requests()
		if len(got) != 2 || len(got[0]) != 2 || len(got[1]) != 1 || !strings.Contains(got[1][0], "v2") {
			t.Fatalf("requests %q, want v0 and v1, then v2", got)
		}
		if d := at[0].Sub(start); d >= linger {
			t.Fatalf("a full request waited %v", d)
		}
		if d := at[1].Sub(start); d < linger {
			t.Fatalf("the rest went after %v, before the linger's end", d)
		}
	})
}

// readLeasedStore hands out the local spool's queues with a lease the test
// runs out and renews (as the fleet's partitions: storage.WithLease), and
// counts the messages read. It hides the local spool's lanes (a wrapped
// queue is not a storage.LaneQueue), so that they are delivered as the
// fleet's partitions.
type readLeasedStore struct {
	loc   *spool.Backend
	held  atomic.Bool
	reads atomic.Int64
}

func (s *readLeasedStore) PutDead(ctx context.Context, dls []storage.DeadLetter) error {
	return s.loc.PutDead(ctx, dls)
}

func (s *readLeasedStore) Run(ctx context.Context, deliver storage.DeliverFunc) error {
	return s.loc.Run(ctx, func(owned context.Context, r storage.Reader) error {
		return deliver(storage.WithLease(owned, s.held.Load), &countingReader{Reader: r, reads: &s.reads})
	})
}

type countingReader struct {
	storage.Reader
	reads *atomic.Int64
}

func (r *countingReader) Next(ctx context.Context) (*storage.Message, error) {
	m, err := r.Reader.Next(ctx)
	if err == nil {
		r.reads.Add(1)
	}
	return m, err
}

// TestFormLeaseRunOut: while a queue's lease has run out by the clock, its
// context not cancelled (a relay resumed after a stop, its timers not yet
// run), a form lane sends nothing of it; when a renewal extends the lease
// instead, its records are delivered, in order (the lane waited, it did
// not end).
func TestFormLeaseRunOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := simtest.New(sim.Config{}, nil)
		sp := openFormSpool(t, spool.Config{})
		st := &readLeasedStore{loc: spool.NewBackend(sp)}
		p := newGI(t, FormConfig{}, "http://sim", st, formSimSender(s), nil)
		l := appendGI(t, sp, "k", 0, 3)
		runPipeline(t, p, sp)
		polltest.Until(t, "the lane to read its queue", func() bool { return st.reads.Load() > 0 })
		time.Sleep(time.Second) // the lane sends at once (no linger)
		if got := simtest.GroupIdentifies(s, "k"); len(got) != 0 {
			t.Fatalf("upstream got %d group identifies while the lease had run out", len(got))
		}
		st.held.Store(true)
		polltest.Until(t, "the lane acknowledged", func() bool { return l.Stats().Records == 0 })
		if got, want := giValues(s, "k"), []string{"v0", "v1", "v2"}; !slices.Equal(got, want) {
			t.Fatalf("upstream got %v, want %v", got, want)
		}
	})
}

// formSimSender sends a form request to s's handler in process: no socket,
// so that a test in a synctest bubble waits in fake time only.
func formSimSender(s *simtest.Sim) Sender {
	return senderFunc(func(ctx context.Context, r *upstream.Request) upstream.Result {
		u, err := url.Parse(r.URL)
		if err != nil {
			return upstream.Classify(0, nil, "", err)
		}
		req := httptest.NewRequestWithContext(ctx, "POST", u.Path, bytes.NewReader(r.Body))
		req.Header.Set("Content-Type", r.ContentType)
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, req)
		return upstream.Classify(w.Code, w.Body.Bytes(), w.Header().Get("Retry-After"), nil)
	})
}

// Group identify (and user mapping) lanes are bounded like event lanes:
// once delivered and idle they are retired by the spool, and their runner's
// goroutines end and it is forgotten; a later record of the same key makes
// a new lane that delivers.
func TestFormRetiredLanesForgotten(t *testing.T) {
	s, base, cli := formUpstream(t)
	sp := openFormSpool(t, spool.Config{RetireIdle: 50 * time.Millisecond})
	p := newGI(t, FormConfig{FormTiming: FormTiming{RetryInitial: 5 * time.Millisecond}}, base, spool.NewBackend(sp), cli, nil)
	runPipeline(t, p, sp)
	// laneGoroutines counts the goroutines running a lane: the whole
	// process's count also holds the upstream client's connections, which
	// vary with the machine's speed.
	laneGoroutines := func() int {
		buf := make([]byte, 1<<20)
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				return strings.Count(string(buf[:n]), "delivery.(*laneRunner).Run(")
			}
			buf = make([]byte, 2*len(buf))
		}
	}
	const keys = 50
	for i := range keys {
		appendGI(t, sp, fmt.Sprintf("key-%d", i), i, i+1)
	}
	polltest.Until(t, "delivered", func() bool {
		return len(simtest.GroupIdentifies(s, "key-49")) == 1 && len(simtest.GroupIdentifies(s, "key-0")) == 1
	})
	polltest.Until(t, "retired and forgotten", func() bool { return sp.Stats().Lanes == 0 && len(p.LaneStatus()) == 0 })
	polltest.Until(t, "lane goroutines ended", func() bool { return laneGoroutines() == 0 })
	appendGI(t, sp, "key-0", 100, 101)
	polltest.Until(t, "a new lane of a retired key delivers", func() bool { return len(simtest.GroupIdentifies(s, "key-0")) == 2 })
}

// answerLog wraps a Sender and notes when each request was answered and
// how, by path.
type answerLog struct {
	Sender
	mu  sync.Mutex
	got map[string][]answered
}

type answered struct {
	at   time.Time
	kind upstream.Kind
}

func (a *answerLog) Do(ctx context.Context, r *upstream.Request) upstream.Result {
	res := a.Sender.Do(ctx, r)
	u, _ := url.Parse(r.URL)
	a.mu.Lock()
	a.got[u.Path] = append(a.got[u.Path], answered{time.Now(), res.Kind})
	a.mu.Unlock()
	return res
}

func (a *answerLog) of(path string) []answered {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.got[path])
}

// A 429 of a form lane goes through the send loop of an events lane: the
// simulator answers three requests of each kind 429 (an answer that names
// no device); both lanes keep their records, wait the same backoff
// (Retry.Wait: never sooner than half RetryInitial, the jitter's floor)
// before each resend, count their retries, dead-letter nothing, and
// deliver everything once the upstream takes it.
func TestThrottledSameLoop(t *testing.T) {
	s, base, cli := formUpstream(t)
	const throttled = 3
	s.Inject(simtest.Fault{Status: 429, Count: throttled, PathPrefix: "/2/httpapi"})
	s.Inject(simtest.Fault{Status: 429, Count: throttled, PathPrefix: "/groupidentify"})
	send := &answerLog{Sender: cli, got: map[string][]answered{}}
	const initial = 300 * time.Millisecond
	reg := prometheus.NewRegistry()

	sp := openFormSpool(t, spool.Config{})
	gi := newGI(t, FormConfig{FormTiming: FormTiming{RetryInitial: initial, RetryMax: initial}}, base, spool.NewBackend(sp).Only(storage.KindGroupIdentify), send, reg)
	ev, err := New(Config{Live: Live{IngestURL: base, FlushInterval: time.Millisecond}, ShardsPerLane: 1, RetryInitial: initial, RetryMax: initial},
		local(sp), send, nil, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	gl := appendGI(t, sp, "k", 0, 3)
	el, err := sp.Lane(context.Background(), storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	var b storage.Batch
	for i := range 3 {
		b.Add(storage.Record{OrderKey: []byte("d:device-1"), Data: fmt.Appendf(nil, `{"event_type":"e","device_id":"device-1","insert_id":"insert-%d"}`, i)})
	}
	if err := sp.Append(context.Background(), el, &b); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, p := range []*Pipeline{gi, ev} {
		wg.Go(func() { p.Run(ctx) })
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		sp.Close()
	})
	polltest.Until(t, "both lanes acknowledged", func() bool { return gl.Stats().Records == 0 && el.Stats().Records == 0 })

	for _, path := range []string{"/groupidentify", "/2/httpapi"} {
		got := send.of(path)
		if len(got) != throttled+1 {
			t.Fatalf("%s: %d requests %v, want %d answered 429 then one 200", path, len(got), got, throttled+1)
		}
		for i, a := range got {
			want := upstream.Throttled
			if i == throttled {
				want = upstream.OK
			}
			if a.kind != want {
				t.Fatalf("%s: answer %d is %v, want %v", path, i, a.kind, want)
			}
			if i > 0 {
				if gap := a.at.Sub(got[i-1].at); gap < initial/2 {
					t.Fatalf("%s: request %d sent %v after a 429, before the backoff (>= %v)", path, i, gap, initial/2)
				}
			}
		}
	}
	if got, want := giValues(s, "k"), []string{"v0", "v1", "v2"}; !slices.Equal(got, want) {
		t.Fatalf("group identifies %v, want %v", got, want)
	}
	if n := len(s.Events("k")); n != 3 {
		t.Fatalf("%d events delivered, want 3", n)
	}
	if dead, _ := sp.ListDead(context.Background(), storage.DeadFilter{}, 0, 0); len(dead) != 0 {
		t.Fatalf("dead letters %+v", dead)
	}
	if v := gatherValue(t, reg, "relay_groupidentify_retries_total"); v != throttled {
		t.Fatalf("relay_groupidentify_retries_total %v, want %d", v, throttled)
	}
	if v := gatherValue(t, reg, "relay_delivery_events_retried_total"); v != 3*throttled {
		t.Fatalf("relay_delivery_events_retried_total %v, want %d", v, 3*throttled)
	}
}

// gatherValue is the value of the metric name without labels in reg.
func gatherValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}
