package batcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/throttle"
	"github.com/svcrelay/relay/internal/upstream"
)

// Sender sends one request upstream and classifies the answer.
// *upstream.Client implements it.
type Sender interface {
	Do(ctx context.Context, req *upstream.Request) upstream.Result
}

// ErrNotRunning is returned by Ready before Run starts and after it returns.
var ErrNotRunning = errors.New("batcher: delivery not running")

// ErrAlreadyRunning is returned by a second concurrent Run.
var ErrAlreadyRunning = errors.New("batcher: already running")

// Pipeline delivers every events lane of a spool upstream. See the package
// documentation.
type Pipeline struct {
	cfg  Config
	sp   *spool.Spool
	send Sender
	thr  *throttle.Throttle
	log  *zap.Logger
	m    *metrics
	url  string
	// budget is the read-ahead of all lanes (MaxReadAheadTotalBytes).
	budget *budget
	// bodies holds the request body buffers of shards that wait.
	bodies bodyPool
	// seed hashes order keys to shards (shardOf).
	seed maphash.Seed

	mu      sync.Mutex
	lanes   map[uint64]*laneRunner
	running bool

	// afterBuild, when set (tests only), is called on a shard's goroutine
	// after it built a batch and before the send-time pause check.
	afterBuild func(*shard)
}

// New returns a pipeline; nothing runs before Run. log and reg may be nil;
// thr may be nil (a Throttle without pacing is made).
func New(cfg Config, sp *spool.Spool, send Sender, thr *throttle.Throttle, log *zap.Logger, reg prometheus.Registerer) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if sp == nil || send == nil {
		return nil, errors.New("batcher: spool and sender are required")
	}
	if log == nil {
		log = zap.NewNop()
	}
	if thr == nil {
		var err error
		if thr, err = throttle.New(throttle.Config{}, nil); err != nil {
			return nil, err
		}
	}
	cfg = cfg.withDefaults()
	p := &Pipeline{cfg: cfg, sp: sp, send: send, thr: thr, log: log, url: cfg.IngestURL + "/2/httpapi", lanes: map[uint64]*laneRunner{}, seed: maphash.MakeSeed(),
		budget: newBudget(int64(cfg.MaxReadAheadTotalBytes)), bodies: newBodyPool()}
	m, err := newMetrics(reg, p)
	if err != nil {
		return nil, err
	}
	p.m = m
	return p, nil
}

// Run delivers until ctx ends: it starts a runner for every events lane that
// exists and for every one created later. When ctx ends it stops taking new
// work, gives requests in flight Config.DrainTimeout to finish (their answers
// are still handled: acks, dead letters), then abandons them and returns nil.
// What was not acknowledged stays in the spool. Run must return before the
// spool is closed.
func (p *Pipeline) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return ErrAlreadyRunning
	}
	p.running = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.running = false
		p.mu.Unlock()
	}()

	drainCtx, cancelDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDrain()
	var wg sync.WaitGroup
	// next is the lowest lane id not seen yet: each wake-up looks only at
	// the lanes created since (Spool.LanesFrom), so that creating n lanes
	// costs O(n) in all, not O(n) each.
	var next uint64
	for {
		changed := p.sp.LanesChanged()
		for _, l := range p.sp.LanesFrom(next) {
			next = l.ID() + 1
			if l.Key().Kind != spool.KindEvents {
				continue
			}
			// No call into another package (metrics included) while
			// p.mu is held: a scrape calls back into the pipeline.
			p.mu.Lock()
			lr := p.lanes[l.ID()]
			if lr == nil {
				lr = newLaneRunner(p, l)
				p.lanes[l.ID()] = lr
			}
			start := !lr.started
			lr.started = true
			p.mu.Unlock()
			if start {
				lr.start(ctx, drainCtx, &wg)
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t := time.AfterFunc(p.cfg.DrainTimeout, cancelDrain)
			wg.Wait()
			t.Stop()
			p.mu.Lock()
			for _, lr := range p.lanes {
				lr.started = false
			}
			p.mu.Unlock()
			return nil
		}
	}
}

// ReleaseMemory drops the request body buffers kept for reuse (up to ~8 MB),
// so that the next GC frees them: for a process that has gone idle.
func (p *Pipeline) ReleaseMemory() { p.bodies.drain() }

// Ready returns nil while Run is delivering.
func (p *Pipeline) Ready() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		return ErrNotRunning
	}
	return nil
}

// StopLane stops sending the lane's events (an operator's pause); they stay
// in the spool. ResumeLane undoes it.
func (p *Pipeline) StopLane(laneID uint64) error {
	lr := p.lane(laneID)
	if lr == nil {
		return fmt.Errorf("stop lane %d: %w", laneID, delivery.ErrUnknownLane)
	}
	lr.stopLane("stopped by operator")
	return nil
}

// ResumeLane resumes a lane stopped by StopLane or by the upstream refusing
// its api_key ("Invalid API key"); its held events are sent at once.
func (p *Pipeline) ResumeLane(laneID uint64) error {
	lr := p.lane(laneID)
	if lr == nil {
		// A lane created after the last LanesChanged wake-up is not known
		// yet; look it up in the spool so that an admin call never misses.
		if ls := p.sp.LanesFrom(laneID); len(ls) > 0 && ls[0].ID() == laneID && ls[0].Key().Kind == spool.KindEvents {
			return nil // not running yet, so not stopped
		}
		return fmt.Errorf("resume lane %d: %w", laneID, delivery.ErrUnknownLane)
	}
	lr.resume()
	return nil
}

func (p *Pipeline) lane(id uint64) *laneRunner {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lanes[id]
}

// runners is a snapshot of the lanes' runners, taken under p.mu (which
// nothing holds across a call out of the package).
func (p *Pipeline) runners() []*laneRunner {
	p.mu.Lock()
	defer p.mu.Unlock()
	lrs := make([]*laneRunner, 0, len(p.lanes))
	for _, lr := range p.lanes {
		lrs = append(lrs, lr)
	}
	return lrs
}

// LaneStatus returns a snapshot of every lane the pipeline has started,
// by lane id.
func (p *Pipeline) LaneStatus() []delivery.LaneStatus {
	lrs := p.runners()
	out := make([]delivery.LaneStatus, 0, len(lrs))
	for _, lr := range lrs {
		out = append(out, lr.status())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// envelope returns the fixed bytes around a lane's events:
// `{"api_key":<json string>,"events":[` and `]` + `,"options":<raw>` + `}`.
func envelope(key spool.LaneKey) (prefix, suffix []byte) {
	q, _ := json.Marshal(key.APIKey) // a string always marshals
	prefix = append([]byte(`{"api_key":`), q...)
	prefix = append(prefix, `,"events":[`...)
	suffix = []byte(`]`)
	if key.Options != "" {
		suffix = append(suffix, `,"options":`...)
		suffix = append(suffix, key.Options...)
	}
	suffix = append(suffix, '}')
	return prefix, suffix
}

// laneRunner delivers one lane: a reader goroutine and ShardsPerLane shard
// goroutines.
type laneRunner struct {
	p       *Pipeline
	lane    *spool.Lane
	id      uint64
	label   string
	key     spool.LaneKey
	prefix  []byte
	suffix  []byte
	shards  []*shard
	started bool // guarded by p.mu

	// partial is the chunk read in parts whose last part is still to come
	// (reader goroutine only).
	partial *ackRef

	// read-ahead budget (bytes read and not done)
	bmu      sync.Mutex
	inflight int64
	bwake    chan struct{}

	// stop is the lane's stop state; its Stopped (an atomic) serves the
	// relay_lane_stopped collector, which reads no lock of the relay. It
	// pins the lane while stopped.
	stop delivery.StopSwitch
	// cancel ends the lane's goroutines when the spool retires the lane.
	cancel context.CancelFunc

	heldKeys, heldEvents atomic.Int64
	readAhead            atomic.Int64
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

func newLaneRunner(p *Pipeline, l *spool.Lane) *laneRunner {
	lr := &laneRunner{p: p, lane: l, id: l.ID(), label: l.Label(), key: l.Key(), bwake: make(chan struct{}, 1)}
	lr.stop.Lane = l // a stopped lane is not retired while empty (its stop would be lost)
	lr.prefix, lr.suffix = envelope(lr.key)
	lr.window.Store(1)
	for i := 0; i < p.cfg.ShardsPerLane; i++ {
		lr.shards = append(lr.shards, newShard(lr, i))
	}
	return lr
}

// start starts the lane's reader and shards. They end with ctx, or when
// the spool retires the lane (empty and idle): the reader then cancels the
// shards (which hold nothing: every record was done) and the runner is
// forgotten, so that its goroutines, memory and metric series are gone.
func (lr *laneRunner) start(ctx, drainCtx context.Context, wg *sync.WaitGroup) {
	lctx, cancel := context.WithCancel(ctx)
	lr.cancel = cancel
	wg.Add(1 + len(lr.shards))
	go func() {
		defer wg.Done()
		if lr.read(lctx) {
			lr.retire()
		}
	}()
	for _, s := range lr.shards {
		go func() {
			defer wg.Done()
			s.run(lctx, drainCtx)
		}()
	}
}

// retire ends a lane the spool retired: its shards stop and the pipeline
// forgets it (a lane of the same key created later is a new lane).
func (lr *laneRunner) retire() {
	lr.cancel()
	p := lr.p
	p.mu.Lock()
	if p.lanes[lr.id] == lr {
		delete(p.lanes, lr.id)
	}
	p.mu.Unlock()
}

// stopLane stops the lane (no-op when stopped) and logs it once.
func (lr *laneRunner) stopLane(reason string) {
	if !lr.stop.Stop(reason) {
		return
	}
	lr.p.log.Error("lane stopped: nothing is sent until it is resumed (admin API) or the relay restarts",
		zap.String("lane", lr.label), zap.String("reason", reason))
}

func (lr *laneRunner) resume() {
	if !lr.stop.Resume() {
		return
	}
	lr.wakeReader()
	lr.p.log.Info("lane resumed", zap.String("lane", lr.label))
}

func (lr *laneRunner) status() delivery.LaneStatus {
	st := delivery.LaneStatus{ID: lr.id, Label: lr.label}
	st.Stopped, st.StopReason = lr.stop.State()
	st.PausedKeys = lr.heldKeys.Load()
	st.HeldEvents = lr.heldEvents.Load()
	st.ReadAheadBytes = lr.readAhead.Load()
	return st
}
