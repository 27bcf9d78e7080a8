package delivery

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/throttle"
	"github.com/svcrelay/relay/internal/upstream"
)

// harness runs a real spool in t.TempDir(), the simulator on 127.0.0.1 and a
// Pipeline between them, and remembers every event it appended.
type harness struct {
	t *testing.T
	// real: not in a synctest bubble, so waits are real time and a
	// loaded machine stretches them (waitDrained's bound is then at
	// least polltest.Max); in a bubble they are exact fake time.
	real bool
	sim  *simtest.Sim
	url  string
	sp   *spool.Spool
	thr  *throttle.Throttle
	cli  *upstream.Client
	send *countingSender
	reg  *prometheus.Registry
	p    *Pipeline
	cfg  Config
	dir  string

	mu       sync.Mutex
	appended map[string]sentEvent // insert_id -> event
	data     map[string]string    // insert_id -> the record's data as appended
	seq      map[string]int       // per order key, next index
	lanes    map[string]*spool.Lane

	cancel context.CancelFunc
	done   chan error
	// restarts counts restart calls: a restart resends what was delivered
	// but not yet acknowledged.
	restarts int
	// upstreamReorders: the sim's reading ingests part of a refused
	// request (PartialThrottle/PartialSilence), so a device whose event was
	// refused for its user may see a later event ingested first: the
	// upstream reorders what the relay sent in order; order is not checked.
	upstreamReorders bool
}

type sentEvent struct {
	apiKey, orderKey string
	idx              int
}

// countingSender counts requests and wraps the real client (it only counts).
// It also counts, per insert_id, how often an event was sent and how often
// in a request the relay saw answered 200: the sim dedups by insert_id, so
// only these counts show an event sent again after its 200.
type countingSender struct {
	next  Sender
	calls atomic.Int64

	mu     sync.Mutex
	pauses []namedPause
	sent   map[string]int // insert_id -> requests that carried it
	okSent map[string]int // insert_id -> requests answered 200 that carried it
	failed int            // events in requests not answered 200
	events int            // events in all requests
}

// namedPause is a 429 answer: when it was received and whom it named.
type namedPause struct {
	at             time.Time
	devices, users []string
}

func (c *countingSender) Do(ctx context.Context, r *upstream.Request) upstream.Result {
	c.calls.Add(1)
	res := c.next.Do(ctx, r)
	var env struct {
		Events []struct {
			InsertID string `json:"insert_id"`
		} `json:"events"`
	}
	json.Unmarshal(r.Body, &env) // a body the relay built; unreadable ones (a test's raw records) count as none
	c.mu.Lock()
	if c.sent == nil {
		c.sent, c.okSent = map[string]int{}, map[string]int{}
	}
	for _, e := range env.Events {
		c.sent[e.InsertID]++
		if res.Kind == upstream.OK {
			c.okSent[e.InsertID]++
		}
	}
	c.events += len(env.Events)
	if res.Kind != upstream.OK {
		c.failed += len(env.Events)
	}
	c.mu.Unlock()
	if res.Kind == upstream.Throttled {
		c.mu.Lock()
		c.pauses = append(c.pauses, namedPause{at: time.Now(), devices: res.ThrottledDevices, users: res.ThrottledUsers})
		c.mu.Unlock()
	}
	return res
}

// harnessLogLevel is the least level the harness's pipelines log at. The
// test's log is kept in memory until the test ends: a test that measures
// the heap during an outage raises it, or the retries' lines (one per shard
// and retry, more the slower the machine) are counted as held chunks.
var harnessLogLevel = zapcore.DebugLevel

func newHarness(t *testing.T, simCfg sim.Config, cfg Config, thrCfg throttle.Config) *harness {
	t.Helper()
	return newHarnessOn(t, simCfg, cfg, thrCfg, false)
}

// newSyncHarness is newHarness for a synctest bubble: the pipeline sends to
// the sim's handler in the same process (simSender), with no socket, so
// that every wait is in fake time. Drop faults (which hijack a connection)
// do not apply; latency does, in fake time.
func newSyncHarness(t *testing.T, simCfg sim.Config, cfg Config, thrCfg throttle.Config) *harness {
	t.Helper()
	return newHarnessOn(t, simCfg, cfg, thrCfg, true)
}

// down takes the sim down in mode for d. In a bubble (no socket) a
// refused connection is the sender's (simSender).
func (h *harness) down(mode simtest.DownMode, d time.Duration) {
	h.t.Helper()
	if ss, ok := h.send.next.(*simSender); ok && mode == simtest.DownRefuse {
		ss.mu.Lock()
		ss.downFrom, ss.downTo = time.Now(), time.Now().Add(d)
		ss.mu.Unlock()
		return
	}
	if err := h.sim.Down(mode, d); err != nil {
		h.t.Fatal(err)
	}
}

// up ends down.
func (h *harness) up() {
	h.t.Helper()
	if ss, ok := h.send.next.(*simSender); ok {
		ss.mu.Lock()
		ss.downTo = time.Time{}
		ss.mu.Unlock()
	}
	if err := h.sim.Up(); err != nil {
		h.t.Fatal(err)
	}
}

func newHarnessOn(t *testing.T, simCfg sim.Config, cfg Config, thrCfg throttle.Config, inProcess bool) *harness {
	t.Helper()
	h := &harness{t: t, appended: map[string]sentEvent{}, data: map[string]string{}, seq: map[string]int{}, lanes: map[string]*spool.Lane{}, reg: prometheus.NewRegistry()}
	h.sim = simtest.New(simCfg, nil)
	var err error
	var next Sender
	h.real = !inProcess
	if inProcess {
		h.url = "http://sim"
		next = &simSender{sim: h.sim, rng: rand.New(rand.NewPCG(1, 1))}
	} else {
		url, err := h.sim.Start("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		h.url = url
	}
	t.Cleanup(func() { h.sim.Close() })
	h.dir = t.TempDir()
	h.sp, err = spool.Open(spool.Config{Dir: h.dir, NoSync: true, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.stop()
		if err := h.sp.Close(); err != nil {
			t.Errorf("close spool: %v", err)
		}
	})
	h.thr, err = throttle.New(thrCfg, h.reg)
	if err != nil {
		t.Fatal(err)
	}
	if next == nil {
		h.cli, err = upstream.New(upstream.Config{Timeout: 5 * time.Second}, h.reg)
		if err != nil {
			t.Fatal(err)
		}
		next = h.cli
	}
	h.send = &countingSender{next: next}
	cfg.IngestURL = h.url
	if cfg.RetryInitial == 0 {
		cfg.RetryInitial = 20 * time.Millisecond
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = 200 * time.Millisecond
	}
	if cfg.FlushInterval == 0 {
		cfg.FlushInterval = 20 * time.Millisecond
	}
	h.cfg = cfg
	h.p, err = New(cfg, local(h.sp), h.send, h.thr, zaptest.NewLogger(t, zaptest.Level(harnessLogLevel)), h.reg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.p.Run(ctx) }()
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run: %v", err)
		}
	case <-time.After(polltest.Max):
		h.t.Fatal("Run did not return")
	}
	h.cancel = nil
}

// restart stops the pipeline, closes and reopens the spool and makes a new
// pipeline, as a restart of the relay does.
func (h *harness) restart() {
	h.t.Helper()
	h.restarts++
	h.stop()
	if err := h.sp.Close(); err != nil {
		h.t.Fatal(err)
	}
	var err error
	h.sp, err = spool.Open(spool.Config{Dir: h.dir, NoSync: true, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	h.mu.Lock()
	h.lanes = map[string]*spool.Lane{}
	h.mu.Unlock()
	h.p, err = New(h.cfg, local(h.sp), h.send, h.thr, zaptest.NewLogger(h.t, zaptest.Level(harnessLogLevel)), nil)
	if err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) lane(apiKey, options string) *spool.Lane {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := apiKey + "\x00" + options
	if l := h.lanes[k]; l != nil {
		return l
	}
	l, err := h.sp.Lane(context.Background(), storage.LaneKey{Kind: storage.KindEvents, APIKey: apiKey, Options: options})
	if err != nil {
		h.t.Fatal(err)
	}
	h.lanes[k] = l
	return l
}

// ev describes one event to append; Device or User (or both) set.
type ev struct {
	Device, User string
	Extra        string // raw JSON fields appended inside the object, e.g. `"time":"x"`
	Raw          string // the whole record data instead of a generated object
	Pad          int    // bytes of padding property
}

// add appends one chunk of events to the lane and returns their insert_ids.
func (h *harness) add(apiKey string, evs ...ev) []string {
	h.t.Helper()
	l := h.lane(apiKey, "")
	var b storage.Batch
	ids := make([]string, len(evs))
	h.mu.Lock()
	for i, e := range evs {
		ok := "d:" + e.Device
		if e.Device == "" {
			ok = "u:" + e.User
		}
		idx := h.seq[apiKey+ok]
		h.seq[apiKey+ok] = idx + 1
		id := fmt.Sprintf("%s|%s|%d", apiKey, ok, idx)
		ids[i] = id
		data := e.Raw
		if data == "" {
			var sb strings.Builder
			sb.WriteString(`{"event_type":"test"`)
			if e.Device != "" {
				fmt.Fprintf(&sb, `,"device_id":%q`, e.Device)
			}
			if e.User != "" {
				fmt.Fprintf(&sb, `,"user_id":%q`, e.User)
			}
			fmt.Fprintf(&sb, `,"insert_id":%q,"time":1700000000000`, id)
			if e.Pad > 0 {
				fmt.Fprintf(&sb, `,"event_properties":{"pad":%q}`, strings.Repeat("p", e.Pad))
			}
			if e.Extra != "" {
				sb.WriteString("," + e.Extra)
			}
			sb.WriteString("}")
			data = sb.String()
		}
		h.appended[id] = sentEvent{apiKey: apiKey, orderKey: ok, idx: idx}
		h.data[id] = data
		b.Add(storage.Record{OrderKey: []byte(ok), UserID: []byte(e.User), Data: []byte(data)})
	}
	h.mu.Unlock()
	if err := h.sp.Append(context.Background(), l, &b); err != nil {
		h.t.Fatal(err)
	}
	return ids
}

// waitDrained waits until every lane's records are acknowledged (or the
// spool holds exactly keep records in total).
func (h *harness) waitDrained(timeout time.Duration, keep int64) {
	h.t.Helper()
	if h.real {
		timeout = max(timeout, polltest.Max)
	}
	deadline := time.Now().Add(timeout)
	for {
		var n int64
		for _, l := range h.sp.Lanes() {
			n += l.Stats().Records
		}
		if n == keep {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("spool still holds %d records (want %d) after %v; lanes %+v; sim %+v", n, keep, timeout, h.p.LaneStatus(), h.sim.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *harness) dead() map[string]storage.DeadLetter {
	h.t.Helper()
	dls, err := h.sp.ListDead(context.Background(), storage.DeadFilter{}, 0, 1<<20)
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]storage.DeadLetter{}
	for _, d := range dls {
		id := insertID(d.Record.Data)
		if id == "" {
			id = "raw:" + string(d.Record.Data)
		}
		if _, dup := out[id]; dup {
			h.t.Errorf("dead letter %s twice", id)
		}
		out[id] = d
	}
	return out
}

func insertID(data []byte) string {
	var v struct {
		InsertID string `json:"insert_id"`
	}
	if json.Unmarshal(data, &v) != nil {
		return ""
	}
	return v.InsertID
}

// check asserts: every appended event is at the sim exactly once, or a dead
// letter (with a reason in wantDead when given), or still in the spool
// (pending); none is both; per order key the sim got them in order; the
// sim got every event byte for byte as appended.
// It returns the dead letters by insert_id.
func (h *harness) check(pending map[string]bool) map[string]storage.DeadLetter {
	h.t.Helper()
	dead := h.dead()
	at := map[string]int{}
	last := map[string]int{}
	for _, e := range h.sim.AllEvents() {
		id := e.InsertID
		at[id]++
		se, ok := h.appended[id]
		if !ok {
			h.t.Errorf("sim holds unknown event %q", id)
			continue
		}
		if want := h.data[id]; string(e.Raw) != want {
			h.t.Errorf("event %s arrived as %.200q, appended as %.200q", id, e.Raw, want)
		}
		k := se.apiKey + se.orderKey
		if p, seen := last[k]; seen && se.idx <= p && !h.upstreamReorders {
			h.t.Errorf("order broken for %s: %d after %d", k, se.idx, p)
		}
		last[k] = se.idx
	}
	var lost []string
	for id := range h.appended {
		n := at[id]
		_, isDead := dead[id]
		switch {
		case n > 1:
			h.t.Errorf("%s stored %d times", id, n)
		case n == 1 && isDead:
			h.t.Errorf("%s both delivered and dead-lettered", id)
		case n == 0 && !isDead && !pending[id]:
			lost = append(lost, id)
		}
	}
	sort.Strings(lost)
	if len(lost) > 0 {
		h.t.Errorf("%d events lost, e.g. %v", len(lost), lost[:min(5, len(lost))])
	}
	// Sent again only after a failure: never after a 200 the relay saw
	// (but a restart resends what was delivered and not yet acked), and
	// all the events sent again were in failed requests.
	h.send.mu.Lock()
	for id, n := range h.send.okSent {
		if n > 1+h.restarts && id != "" {
			h.t.Errorf("%s sent again after a 200: in %d requests answered 200", id, n)
		}
	}
	distinct := len(h.send.sent)
	if resent := h.send.events - distinct; resent > h.send.failed+h.restarts*distinct {
		h.t.Errorf("%d events sent again, but only %d were in requests that failed", resent, h.send.failed)
	}
	h.send.mu.Unlock()
	return dead
}

func (h *harness) metric(name string, labels ...string) float64 {
	h.t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

func devs(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// checkReadAheadBackPressure: events (200) held for a device paused until
// tomorrow fill the read-ahead (h's MaxReadAheadBytes, max); the reader
// then waits (the rest stays in the spool), the read-ahead stays bounded,
// the paused device sends nothing; after the stop the harness's checks
// hold with every event still in the spool.
func (h *harness) checkReadAheadBackPressure(max int64) {
	t := h.t
	t.Helper()
	h.thr.PauseUntilNextDay([]string{"d:quota-device"})
	for range 100 {
		h.add("key", ev{Device: "quota-device", Pad: 200}, ev{Device: "quota-device", Pad: 200})
	}
	h.start()
	time.Sleep(time.Second)
	var st LaneStatus
	for _, s := range h.p.LaneStatus() {
		st = s
	}
	if st.ReadAheadBytes < max || st.ReadAheadBytes > max*5/4 {
		t.Fatalf("read-ahead %d, want about %d: %+v", st.ReadAheadBytes, max, st)
	}
	if st.HeldEvents == 0 || st.HeldEvents >= 200 {
		t.Fatalf("held %d of 200", st.HeldEvents)
	}
	if len(h.sim.Requests()) != 0 {
		t.Fatal("paused device sent")
	}
	h.stop()
	pending := map[string]bool{}
	for id := range h.appended {
		pending[id] = true
	}
	h.check(pending)
	h.waitDrained(time.Second, 200)
}

// local is sp behind the seam, as cmd/relay gives it to New.
func local(sp *spool.Spool) Store { return spool.NewBackend(sp).Only(storage.KindEvents) }
