package delivery

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/throttle"
	"github.com/svcrelay/relay/internal/upstream"
)

// Sender sends one request upstream and classifies the answer.
// *upstream.Client implements it.
type Sender interface {
	Do(ctx context.Context, req *upstream.Request) upstream.Result
}

// ErrNotRunning is returned by Ready before Run starts and after it returns.
var ErrNotRunning = errors.New("delivery: not running")

// Pipeline delivers every events lane of a store upstream. See the package
// documentation.
type Pipeline struct {
	cfg    Config
	send   Sender
	thr    *throttle.Throttle
	log    *zap.Logger
	m      *metrics
	budget *budget  // the read-ahead of all lanes (MaxReadAheadTotalBytes)
	bodies bodyPool // the request body buffers of shards that wait
	seed   maphash.Seed
	name   string // labels requests and logs: "events", or the form kind's
	lanes  storage.Kind
	kind   Kind
	form   *FormConfig // nil for events

	// st hands Run a queue per lane (a laneRunner each) or per fleet
	// partition (deliverPartition); it takes the dead letters too.
	st      Store
	fl      *fleetState // nil for events in local mode
	running atomic.Bool

	// rmu guards runners: the runner of every lane met, kept across Runs
	// (its stop state with it) until the lane retires; a fleet feed's
	// under an id of its own. Never held across a call out of the package.
	rmu     sync.Mutex
	runners map[uint64]*laneRunner
	peak    int // len(runners) at its largest since it was made (forget)

	// live holds the settings SetLive changes while running; shards read
	// it at each use (one atomic load per batch or wait).
	live atomic.Pointer[liveState]

	// afterBuild, when set (tests only), is called on a shard's goroutine
	// after it built a batch and before the send-time pause check.
	afterBuild func(*shard)
}

// New returns a pipeline over a store whose queues are lanes (the local
// spool: spool.Backend, through the seam as the fleet's); nothing runs
// before Run. log and reg may be nil; thr may be nil (a Throttle without
// pacing is made).
func New(cfg Config, st Store, send Sender, thr *throttle.Throttle, log *zap.Logger, reg prometheus.Registerer) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if st == nil || send == nil {
		return nil, errors.New("delivery: store and sender are required")
	}
	p := newPipeline(cfg, st, send, thr, log)
	p.m = newMetrics(reg, p)
	return p, nil
}

// Live are the settings of Config a running Pipeline can change (a
// configuration reload).
type Live struct {
	// IngestURL is the upstream base; requests go to IngestURL+"/2/httpapi".
	// Required; in SetLive, "" keeps the one in force (a batch built before
	// the change may still go to the old one: a send in flight is not
	// called back).
	IngestURL string
	// MaxBatchEvents is the most events per request; zero means 1000. Above
	// 1999 is invalid (the upstream takes fewer than 2000).
	MaxBatchEvents int
	// MaxBatchBytes bounds a request body: every body is strictly smaller
	// (measured uncompressed, on the exact bytes sent); zero means 1,000,000.
	MaxBatchBytes int
	// FlushInterval is the longest an event waits for its batch to fill;
	// zero means 200ms.
	FlushInterval time.Duration
	// ThrottlePause is how long a device or user named in a 429 gets nothing
	// sent; zero means 30s.
	ThrottlePause time.Duration
	// MaxEventAge: an event not delivered this long after it was accepted
	// goes to dead letters ("expired") instead of another try; zero means
	// 6 days.
	MaxEventAge time.Duration
	// Gzip compresses request bodies (the byte limit stays uncompressed).
	Gzip bool
}

// liveState is the Config in force (with defaults) for what Live
// changes; changed is closed when SetLive replaces it, so that a shard
// waiting on the old FlushInterval wakes up and waits on the new one.
type liveState struct {
	Config
	url     string // IngestURL + "/2/httpapi"
	changed chan struct{}
}

func (c Config) liveState() *liveState {
	c = c.withDefaults()
	return &liveState{Config: c, url: c.IngestURL + "/2/httpapi", changed: make(chan struct{})}
}

// SetLive puts l in force for every batch built after it (its zero values
// meaning Config's defaults). l is valid as Config.Validate says.
func (p *Pipeline) SetLive(l Live) {
	c := p.cfg
	c.Live, c.IngestURL = l, cmp.Or(l.IngestURL, c.IngestURL)
	close(p.live.Swap(c.liveState()).changed) // newPipeline stored the first
}

// newPipeline is what every kind shares; cfg is valid.
func newPipeline(cfg Config, st Store, send Sender, thr *throttle.Throttle, log *zap.Logger) *Pipeline {
	if log == nil {
		log = zap.NewNop()
	}
	if thr == nil {
		thr, _ = throttle.New(throttle.Config{}, nil) // the zero Config is valid
	}
	cfg = cfg.withDefaults()
	p := &Pipeline{cfg: cfg, st: st, send: send, thr: thr, log: log, seed: maphash.MakeSeed(),
		name: "events", lanes: storage.KindEvents, kind: events{cfg.Check}, budget: newBudget(int64(cfg.MaxReadAheadTotalBytes)), bodies: newBodyPool(),
		runners: map[uint64]*laneRunner{}}
	p.live.Store(cfg.liveState())
	return p
}

// ErrAlreadyRunning is returned by a second concurrent Run.
var ErrAlreadyRunning = errors.New("delivery: already running")

var errNotLanes = errors.New("delivery: the store's queue is not a lane")

// Run delivers until ctx ends: it starts a runner for every lane of the
// kind that exists and for every one created later (fleet mode: it delivers
// every partition handed over). When ctx ends it stops taking new work,
// gives requests in flight Config.DrainTimeout to finish (their answers are
// still handled: acks, dead letters), then abandons them and returns nil;
// the store's Run outlives ctx until every partition drained (at most
// DrainTimeout and a second), so the leases stay held meanwhile. What was
// not acknowledged stays in the store. A runner survives Run: a later Run
// starts it again. Run must return before the spool is closed.
func (p *Pipeline) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer p.running.Store(false)
	drain, cancelDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDrain()
	stopDrain := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(p.cfg.DrainTimeout, cancelDrain)
		context.AfterFunc(drain, func() { t.Stop() })
	})
	defer stopDrain()
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRun()
	dr := &drainTracker{changed: make(chan struct{})}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-ctx.Done():
		case <-runCtx.Done():
			return
		}
		tctx, cancel := context.WithTimeout(context.Background(), p.cfg.DrainTimeout+time.Second)
		dr.wait(tctx)
		cancel()
		cancelRun()
	}()
	err := p.st.Run(runCtx, func(qctx context.Context, r storage.Reader) error {
		q, ok := r.(storage.LaneQueue)
		// The events' fleet mode takes every queue as a partition (also
		// the spool's lanes behind the seam); a form kind its lanes as lanes.
		if !ok || p.fl != nil && p.form == nil {
			if p.fl == nil {
				return errNotLanes
			}
			dr.add(1)
			drained := sync.OnceFunc(func() { dr.add(-1) })
			defer drained()
			return p.deliverPartition(ctx, qctx, r, drained)
		}
		l := q.Lane()
		if l.Key().Kind != p.lanes {
			return nil
		}
		id := l.ID()
		lr := p.lane(id)
		if lr == nil {
			lr = newRunner(p, l, id, l.Key().Label(), l.Key())
			lr.stop.Lane = l // a stopped lane is not retired while empty (its stop would be lost)
			p.add(id, lr)
		}
		err := lr.Run(qctx, drain)
		if errors.Is(err, storage.ErrRetired) {
			p.forget(id, lr)
		}
		return err
	})
	cancelRun()
	<-stopped
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// drainTracker counts the partitions that have not finished draining.
type drainTracker struct {
	mu      sync.Mutex
	n       int
	changed chan struct{}
}

func (d *drainTracker) add(n int) {
	d.mu.Lock()
	d.n += n
	if n < 0 {
		close(d.changed)
		d.changed = make(chan struct{})
	}
	d.mu.Unlock()
}

// wait waits until none drains or ctx ends.
func (d *drainTracker) wait(ctx context.Context) {
	for {
		d.mu.Lock()
		n, c := d.n, d.changed
		d.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-c:
		case <-ctx.Done():
			return
		}
	}
}

// add records the runner of lane id: one the store handed over, or one
// of a fleet partition's lanes (its runner's own id).
func (p *Pipeline) add(id uint64, lr *laneRunner) {
	p.rmu.Lock()
	p.runners[id] = lr
	p.peak = max(p.peak, len(p.runners))
	p.rmu.Unlock()
}

// forget drops a runner whose lane retired (a lane of the same key
// created later is a new lane, with a new runner).
func (p *Pipeline) forget(id uint64, lr *laneRunner) {
	p.rmu.Lock()
	if p.runners[id] == lr {
		delete(p.runners, id)
		// A map keeps the room of its largest size: once most of a wave
		// of lanes retired, a smaller one.
		if p.peak >= 1024 && len(p.runners) < p.peak/4 {
			n := make(map[uint64]*laneRunner, len(p.runners)) // (maps.Clone keeps the room)
			maps.Copy(n, p.runners)
			p.runners, p.peak = n, len(p.runners)
		}
	}
	p.rmu.Unlock()
}

// lane returns the runner of lane id, or nil.
func (p *Pipeline) lane(id uint64) *laneRunner {
	p.rmu.Lock()
	defer p.rmu.Unlock()
	return p.runners[id]
}

// runnerList is a snapshot of the runners, in no order.
func (p *Pipeline) runnerList() []*laneRunner {
	p.rmu.Lock()
	defer p.rmu.Unlock()
	return slices.AppendSeq(make([]*laneRunner, 0, len(p.runners)), maps.Values(p.runners))
}

// ReleaseMemory drops the request body buffers kept for reuse (up to ~8 MB),
// so that the next GC frees them: for a process that has gone idle.
func (p *Pipeline) ReleaseMemory() { p.bodies.drain() }

// Ready returns nil while Run is delivering.
func (p *Pipeline) Ready() error {
	if !p.running.Load() {
		if p.form != nil {
			return fmt.Errorf("%s: %w", p.name, ErrNotRunning)
		}
		return ErrNotRunning
	}
	return nil
}

// StopLane stops sending the lane's events (an operator's pause); they stay
// in the store. ResumeLane undoes it.
func (p *Pipeline) StopLane(laneID uint64) error { return p.control(laneID, true) }

// ResumeLane resumes a lane stopped by StopLane or by the upstream refusing
// its api_key ("Invalid API key"); its held events are sent at once. It
// wraps ErrUnknownLane for a lane the store has not handed over
// yet (none was stopped).
func (p *Pipeline) ResumeLane(laneID uint64) error { return p.control(laneID, false) }

func (p *Pipeline) control(laneID uint64, stop bool) error {
	lr := p.lane(laneID)
	switch {
	case lr == nil:
		return fmt.Errorf("%s: lane %d: %w", p.name, laneID, ErrUnknownLane)
	case lr.stop.Lane == nil: // a fleet partition's runner
		p.controlShared(lr, stop)
	default:
		lr.setStop(stop, operatorStop)
	}
	return nil
}

// LaneStatus returns a snapshot of every lane started, by lane id.
func (p *Pipeline) LaneStatus() []LaneStatus {
	rs := p.runnerList()
	out := make([]LaneStatus, 0, len(rs))
	for _, lr := range rs {
		out = append(out, lr.Status())
	}
	slices.SortFunc(out, func(a, b LaneStatus) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// events is the Kind of event lanes: /2/httpapi's JSON body
// {"api_key":<json string>,"events":[e,e,...],"options":<raw>} ("options"
// when the lane has them). Its limits are the Live ones, which a shard sets
// on its copy of the Frame at each batch.
type events struct {
	check func(apiKey string) func(data []byte, verdict uint64) ([]byte, string, []byte)
}

// Frame is the lane's envelope; events are written as they are.
func (k events) Frame(key storage.LaneKey) Frame {
	q, _ := json.Marshal(key.APIKey) // a string always marshals
	suffix := "]"
	if key.Options != "" {
		suffix += `,"options":` + key.Options
	}
	f := Frame{Prefix: `{"api_key":` + string(q) + `,"events":[`, Suffix: suffix + "}", Sep: ","}
	if k.check != nil {
		f.Check = k.check(key.APIKey)
	}
	return f
}

// laneRunner delivers one lane: a reader goroutine and ShardsPerLane
// shards, each with a goroutine while it has records.
type laneRunner struct {
	p *Pipeline
	// src is what the reader reads: the local spool's lane, or the lane's
	// messages of one fleet partition (a Feed).
	src   storage.Lane
	id    uint64
	label string
	key   storage.LaneKey
	// frame packs the lane's requests (Pipeline.kind's Frame).
	frame Frame
	// shards has Config.ShardsPerLane entries, each nil until the shard
	// has a record (laneRunner.shard).
	shards []*shard

	// partial is the chunk read in parts whose last part is still to come
	// (reader goroutine only).
	partial *ackRef

	// The shards' goroutines: started by the reader's hand-over (give)
	// with Run's contexts, ended when idle or with Run.
	sctx, sdrain context.Context
	swg          sync.WaitGroup

	// readAhead is the lane's read-ahead: bytes read and not done. bwake
	// wakes its reader when budget is freed.
	readAhead atomic.Int64
	bwake     chan struct{}

	// stop is the lane's stop state; its Stopped (an atomic) serves the
	// relay_lane_stopped collector, which reads no lock of the relay. It
	// pins the lane while stopped.
	stop                 StopSwitch
	heldKeys, heldEvents atomic.Int64
	// failing counts the shards whose last request failed (retryable) and
	// that have not had a 200 since.
	failing atomic.Int32
	// window is the read-ahead the lane may use now (at most
	// MaxReadAheadBytes): one chunk at the start and while every shard
	// fails, a step after the first progress, then doubled by each
	// (laneRunner.progress). A relay started on a backlog while the
	// upstream is down so holds one chunk, not a step (1 MB).
	window atomic.Int64
	// readerWaits is true while the reader waits because of the window or
	// a read-ahead budget: shards then send what they have instead of
	// waiting for full batches.
	readerWaits atomic.Bool
}

// newRunner returns the runner of one lane reading src.
func newRunner(p *Pipeline, src storage.Lane, id uint64, label string, key storage.LaneKey) *laneRunner {
	lr := &laneRunner{p: p, src: src, id: id, label: label, key: key, bwake: make(chan struct{}, 1)}
	lr.frame = p.kind.Frame(key)
	lr.window.Store(1)
	if p.form != nil {
		// A form lane reads its whole budget at once: its requests merge
		// many small callers' chunks, and a lane has one shard to feed.
		lr.window.Store(int64(p.cfg.MaxReadAheadBytes))
	}
	lr.shards = make([]*shard, p.cfg.ShardsPerLane)
	return lr
}

// shard returns shard i, made at its first record (an idle lane drops its
// shards: see Run). Reader goroutine only (Run's).
func (lr *laneRunner) shard(i int) *shard {
	if lr.shards[i] == nil {
		lr.shards[i] = newShard(lr, i)
	}
	return lr.shards[i]
}

// Run runs the lane's reader and, as the reader hands them records, its
// shards: until ctx ends, the store retires the lane
// (storage.ErrRetired) or every record read is done (storage.ErrIdle).
func (lr *laneRunner) Run(ctx, drain context.Context) error {
	if g := lr.p.m.lanes; g != nil {
		g.Inc()
		defer g.Dec()
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lr.sctx, lr.sdrain = lctx, drain
	for _, s := range lr.shards {
		if s != nil {
			s.resume() // what an earlier Run left queued
		}
	}
	end := lr.read(lctx)
	if end != endStop {
		cancel() // the shards hold nothing: every record was done
	}
	lr.swg.Wait()
	lr.sctx, lr.sdrain = nil, nil
	if end == endIdle {
		// Settled: the shards hold nothing (their batch limits and
		// backoff start again); an idle lane keeps a few hundred bytes.
		clear(lr.shards)
		lr.failing.Store(0)
	}
	switch end {
	case endRetired:
		return storage.ErrRetired
	case endIdle:
		return storage.ErrIdle
	}
	return nil
}

// setStop stops the lane with reason (an operator, an upstream refusing
// its api_key) or resumes it, and logs a change once.
func (lr *laneRunner) setStop(stop bool, reason string) {
	if lr.stop.Set(stop, reason) {
		lr.stopChanged(stop, reason)
	}
}

// stopChanged logs a change of the lane's stop state and wakes a resumed
// lane's reader.
func (lr *laneRunner) stopChanged(stopped bool, reason string) {
	if stopped {
		lr.p.log.Error("lane stopped: nothing is sent until it is resumed (admin API) or the relay restarts",
			zap.String("lane", lr.label), zap.String("reason", reason))
		return
	}
	poke(lr.bwake)
	lr.p.log.Info("lane resumed", zap.String("lane", lr.label))
}

// Status is the lane's snapshot.
func (lr *laneRunner) Status() LaneStatus {
	st := LaneStatus{ID: lr.id, Label: lr.label}
	st.Stopped, st.StopReason = lr.stop.State()
	st.PausedKeys = lr.heldKeys.Load()
	st.HeldEvents = lr.heldEvents.Load()
	st.ReadAheadBytes = lr.readAhead.Load()
	if f, ok := lr.src.(*Feed); ok {
		st.Records, st.Bytes = f.Waiting()
	}
	return st
}
