package delivery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// ErrAlreadyRunning is returned by a second concurrent Engine.Run.
var ErrAlreadyRunning = errors.New("delivery: already running")

// Runner delivers one lane; a kind makes one per lane (EngineConfig.NewRunner).
type Runner interface {
	// Run delivers the lane until ctx ends or the spool retires the lane
	// (it then returns an error wrapping spool.ErrRetired and the engine
	// forgets the runner). It may also return an error wrapping
	// spool.ErrIdle once the lane is idle, holding nothing: the engine
	// then calls Run again when the lane has work (spool.Lane.OnWork),
	// so that an idle lane holds no goroutine. After ctx ends, work in
	// flight may finish until drain ends. Run is called again on the same
	// runner by a later Engine.Run.
	Run(ctx, drain context.Context) error
	// Status is a snapshot of the lane; it must take no lock held across
	// a call out of the runner's package (a scrape calls it).
	Status() LaneStatus
	// Stop stops the lane (an operator's pause) and Resume resumes it.
	Stop(reason string)
	Resume()
}

// EngineConfig configures an Engine.
type EngineConfig[R Runner] struct {
	// Name prefixes the errors of StopLane and ResumeLane; may be empty.
	Name string
	// Kind is the lane kind delivered.
	Kind storage.Kind
	// NewRunner makes the runner of a lane of Kind. Required.
	NewRunner func(l *spool.Lane) R
	// DrainTimeout is how long runners may finish work in flight after
	// Run's context ended; zero means none.
	DrainTimeout time.Duration
}

type engineLane[R Runner] struct {
	r R
	l *spool.Lane
	// started: Run met the lane (its runner runs, or waits for work in
	// OnWork); guarded by Engine.mu.
	started bool
}

// Engine is the supervisor every lane kind shares: it starts a runner for
// every lane of its kind that exists and for each one created later,
// starts an idle runner again when its lane has work (spool.ErrIdle,
// Lane.OnWork), forgets a runner whose lane the spool retired, and answers the lane
// control (LaneStatus, StopLane, ResumeLane) and relay_lane_stopped.
// Its lock is never held across a call out of the package: runners and
// metrics are called on snapshots (a scrape never waits for
// delivery).
type Engine[R Runner] struct {
	cfg EngineConfig[R]
	sp  *spool.Spool

	mu      sync.Mutex
	lanes   map[uint64]*engineLane[R]
	peak    int // len(lanes) at its largest since it was made (forget)
	running bool
	// The current Run's (guarded by mu): its contexts, its runners'
	// goroutines, and gen, which tells an OnWork of an earlier Run (whose
	// end marked every lane not started) from its own.
	ctx, drain context.Context
	wg         sync.WaitGroup
	gen        uint64
	stopping   bool
}

// NewEngine returns an engine; nothing runs before Run.
func NewEngine[R Runner](cfg EngineConfig[R], sp *spool.Spool) (*Engine[R], error) {
	if cfg.NewRunner == nil || sp == nil {
		return nil, errors.New("delivery: engine needs a spool and NewRunner")
	}
	if cfg.DrainTimeout < 0 {
		return nil, errors.New("delivery: negative drain timeout")
	}
	return &Engine[R]{cfg: cfg, sp: sp, lanes: map[uint64]*engineLane[R]{}}, nil
}

// Run delivers until ctx ends: it runs a runner for every lane of the kind.
// When ctx ends it gives runners EngineConfig.DrainTimeout to finish, waits
// for them and returns nil. A runner survives Run (its stop state with it):
// a later Run starts it again.
func (e *Engine[R]) Run(ctx context.Context) error {
	e.mu.Lock()
	if e.running {
		e.mu.Unlock()
		return ErrAlreadyRunning
	}
	e.running = true
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.running = false
		e.mu.Unlock()
	}()

	drainCtx, cancelDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDrain()
	e.mu.Lock()
	e.ctx, e.drain, e.stopping = ctx, drainCtx, false
	e.gen++
	gen := e.gen
	e.mu.Unlock()
	// next is the lowest lane id not seen yet: each wake-up looks only at
	// the lanes created since (Spool.LanesFrom), so that creating n lanes
	// costs O(n) in all, not O(n) each.
	var next uint64
	for {
		lanes, changed := e.sp.LanesFrom(next)
		for _, l := range lanes {
			next = l.ID() + 1
			if l.Key().Kind != e.cfg.Kind {
				continue
			}
			e.mu.Lock()
			el := e.lanes[l.ID()]
			e.mu.Unlock()
			if el == nil {
				// NewRunner is the kind's code: called without e.mu.
				el = &engineLane[R]{r: e.cfg.NewRunner(l), l: l}
				e.mu.Lock()
				e.lanes[l.ID()] = el
				e.peak = max(e.peak, len(e.lanes))
				e.mu.Unlock()
			}
			e.start(el, gen)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			var t *time.Timer
			if e.cfg.DrainTimeout > 0 {
				t = time.AfterFunc(e.cfg.DrainTimeout, cancelDrain)
			} else {
				cancelDrain()
			}
			e.mu.Lock()
			e.stopping = true // no runner starts from now on (OnWork)
			e.mu.Unlock()
			e.wg.Wait()
			if t != nil {
				t.Stop()
			}
			e.mu.Lock()
			for _, el := range e.lanes {
				el.started = false
			}
			e.mu.Unlock()
			return nil
		}
	}
}

// start runs el's runner in a goroutine unless it runs (or waits for work)
// already, or the Run of gen is over. When the runner ends idle, it starts
// again when its lane has work.
func (e *Engine[R]) start(el *engineLane[R], gen uint64) {
	e.mu.Lock()
	if el.started || e.stopping || e.gen != gen {
		e.mu.Unlock()
		return
	}
	el.started = true
	e.wg.Add(1)
	ctx, drain := e.ctx, e.drain
	e.mu.Unlock()
	go func() {
		defer e.wg.Done()
		err := el.r.Run(ctx, drain)
		switch {
		case errors.Is(err, spool.ErrRetired):
			e.forget(el.l.ID(), el)
		case errors.Is(err, spool.ErrIdle):
			e.mu.Lock()
			el.started = false
			e.mu.Unlock()
			el.l.OnWork(func() { e.start(el, gen) })
		}
	}()
}

// forget drops a runner whose lane the spool retired (a lane of the same
// key created later is a new lane, with a new runner).
func (e *Engine[R]) forget(id uint64, el *engineLane[R]) {
	e.mu.Lock()
	if e.lanes[id] == el {
		delete(e.lanes, id)
		// A map keeps the room of its largest size: once most of a wave
		// of lanes retired, a smaller one.
		if e.peak >= 1024 && len(e.lanes) < e.peak/4 {
			n := make(map[uint64]*engineLane[R], len(e.lanes)) // (maps.Clone keeps the room)
			for id, el := range e.lanes {
				n[id] = el
			}
			e.lanes, e.peak = n, len(e.lanes)
		}
	}
	e.mu.Unlock()
}

// Running reports whether Run is running.
func (e *Engine[R]) Running() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.running
}

// Lane returns the runner of a lane, if Run has met the lane.
func (e *Engine[R]) Lane(id uint64) (R, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	el := e.lanes[id]
	if el == nil {
		var zero R
		return zero, false
	}
	return el.r, true
}

// Runners is a snapshot of the runners, in no order.
func (e *Engine[R]) Runners() []R {
	e.mu.Lock()
	defer e.mu.Unlock()
	rs := make([]R, 0, len(e.lanes))
	for _, el := range e.lanes {
		rs = append(rs, el.r)
	}
	return rs
}

// LaneStatus returns a snapshot of every lane, by lane id.
func (e *Engine[R]) LaneStatus() []LaneStatus {
	rs := e.Runners()
	out := make([]LaneStatus, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.Status())
	}
	slices.SortFunc(out, func(a, b LaneStatus) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func (e *Engine[R]) prefix() string {
	if e.cfg.Name == "" {
		return ""
	}
	return e.cfg.Name + ": "
}

// StopLane stops sending a lane's records (they stay in the spool). It
// wraps ErrUnknownLane for a lane Run has not met.
func (e *Engine[R]) StopLane(laneID uint64) error {
	r, ok := e.Lane(laneID)
	if !ok {
		return fmt.Errorf("%sstop lane %d: %w", e.prefix(), laneID, ErrUnknownLane)
	}
	r.Stop("stopped by operator")
	return nil
}

// ResumeLane resumes a stopped lane. A lane of the kind that Run has not
// met yet (created after its last wake-up) is not stopped: nil.
func (e *Engine[R]) ResumeLane(laneID uint64) error {
	r, ok := e.Lane(laneID)
	if !ok {
		if ls, _ := e.sp.LanesFrom(laneID); len(ls) > 0 && ls[0].ID() == laneID && ls[0].Key().Kind == e.cfg.Kind {
			return nil
		}
		return fmt.Errorf("%sresume lane %d: %w", e.prefix(), laneID, ErrUnknownLane)
	}
	r.Resume()
	return nil
}

// StoppedCollector returns the relay_lane_stopped{lane} collector of the
// engine's lanes, made at scrape time from Status snapshots. Only one
// deliverer's collector may be checked (describe its descriptor): the
// others share the family unchecked.
func (e *Engine[R]) StoppedCollector(checked bool) prometheus.Collector {
	return NewStoppedCollector(e.LaneStatus, checked)
}

// NewStoppedCollector returns a relay_lane_stopped{lane} collector made at
// scrape time from status (for a deliverer without an Engine: the fleet's
// partitions). status must take no lock held across a call out
// of its package, and its labels must be unique.
func NewStoppedCollector(status func() []LaneStatus, checked bool) prometheus.Collector {
	return &stoppedCollector{status: status, desc: NewLaneStoppedDesc(), checked: checked}
}

// NewLaneStoppedDesc describes relay_lane_stopped{lane}, 1 while a lane
// sends nothing. Every deliverer's collector uses it: the registry merges
// their series into one family only if name, help and labels are equal.
func NewLaneStoppedDesc() *prometheus.Desc {
	return prometheus.NewDesc("relay_lane_stopped",
		"1 while a lane sends nothing (invalid API key, fatal upstream answer, operator stop): alert on it.",
		[]string{"lane"}, nil)
}

type stoppedCollector struct {
	status  func() []LaneStatus
	desc    *prometheus.Desc
	checked bool
}

func (c *stoppedCollector) Describe(ch chan<- *prometheus.Desc) {
	if c.checked {
		ch <- c.desc
	}
}

func (c *stoppedCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.status() {
		v := 0.0
		if s.Stopped {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, s.Label)
	}
}
