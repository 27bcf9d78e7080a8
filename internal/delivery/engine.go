package delivery

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/svcrelay/relay/internal/storage"
)

// ErrAlreadyRunning is returned by a second concurrent Engine.Run.
var ErrAlreadyRunning = errors.New("delivery: already running")

// Runner delivers one lane (EngineConfig.NewRunner).
type Runner interface {
	// Run delivers the lane until ctx ends, the store retires the lane
	// (an error wrapping storage.ErrRetired: the engine forgets the
	// runner) or the lane is idle, holding nothing (storage.ErrIdle: the
	// store hands it over again when it has work). After ctx ends, work in
	// flight may finish until drain ends. A later Engine.Run calls Run
	// again.
	Run(ctx, drain context.Context) error
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
	// NewRunner makes the runner of a lane of Kind; nil hands every queue
	// to Partition (a lane then delivered as a partition: fleet mode).
	NewRunner func(q storage.LaneQueue) R
	// DrainTimeout is how long runners may finish work in flight after
	// Run's context ended; zero means none.
	DrainTimeout time.Duration
	// Partition, when not nil, delivers a queue that is not one lane (a
	// fleet partition: Pipeline.deliverPartition) until stop (Run's
	// context) or owned (the queue's) ends, and calls drained once its work
	// in flight is done and acknowledged; nil refuses such a queue. The
	// store's Run outlives Run's context until every partition drained (at
	// most DrainTimeout and a second), so the leases stay held meanwhile.
	Partition func(stop, owned context.Context, r storage.Reader, drained func()) error
}

// Engine delivers a store through the seam: it keeps a runner per lane the
// store hands it (storage.LaneQueue), across Runs, forgets one whose lane
// the store retired and answers the lane control of the runners it knows;
// a queue that is not one lane (a fleet partition) goes to
// EngineConfig.Partition. Its lock is never held across a call out of the
// package: runners are called on snapshots.
type Engine[R Runner] struct {
	cfg EngineConfig[R]
	st  storage.Owner

	running atomic.Bool

	mu    sync.Mutex
	lanes map[uint64]R
	peak  int // len(lanes) at its largest since it was made (forget)
}

// NewEngine returns an engine over st (its Run hands lanes of the kind:
// see spool.Backend.Only); nothing runs before Run.
func NewEngine[R Runner](cfg EngineConfig[R], st storage.Owner) (*Engine[R], error) {
	if (cfg.NewRunner == nil && cfg.Partition == nil) || st == nil {
		return nil, errors.New("delivery: engine needs a store and NewRunner or Partition")
	}
	if cfg.DrainTimeout < 0 {
		return nil, errors.New("delivery: negative drain timeout")
	}
	return &Engine[R]{cfg: cfg, st: st, lanes: map[uint64]R{}}, nil
}

var errNotLanes = errors.New("delivery: the store's queue is not a lane")

// Run delivers until ctx ends: it runs a runner for every lane of the kind.
// When ctx ends it gives runners EngineConfig.DrainTimeout to finish, waits
// for them and returns nil. A runner survives Run (its stop state with it):
// a later Run starts it again.
func (e *Engine[R]) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer e.running.Store(false)
	drain, cancelDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDrain()
	stopDrain := context.AfterFunc(ctx, func() {
		if e.cfg.DrainTimeout <= 0 {
			cancelDrain()
			return
		}
		t := time.AfterFunc(e.cfg.DrainTimeout, cancelDrain)
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
		tctx, cancel := context.WithTimeout(context.Background(), e.cfg.DrainTimeout+time.Second)
		dr.wait(tctx)
		cancel()
		cancelRun()
	}()
	err := e.st.Run(runCtx, func(qctx context.Context, r storage.Reader) error {
		q, ok := r.(storage.LaneQueue)
		if !ok || e.cfg.NewRunner == nil {
			if e.cfg.Partition == nil {
				return errNotLanes
			}
			dr.add(1)
			drained := sync.OnceFunc(func() { dr.add(-1) })
			defer drained()
			return e.cfg.Partition(ctx, qctx, r, drained)
		}
		if q.Key().Kind != e.cfg.Kind {
			return nil
		}
		id := q.LaneID()
		e.mu.Lock()
		lr, ok := e.lanes[id]
		e.mu.Unlock()
		if !ok {
			lr = e.cfg.NewRunner(q) // the kind's code: called without e.mu
			e.add(id, lr)
		}
		err := lr.Run(qctx, drain)
		if errors.Is(err, storage.ErrRetired) {
			e.forget(id, lr)
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
func (e *Engine[R]) add(id uint64, lr R) {
	e.mu.Lock()
	e.lanes[id] = lr
	e.peak = max(e.peak, len(e.lanes))
	e.mu.Unlock()
}

// forget drops a runner whose lane the store retired (a lane of the same
// key created later is a new lane, with a new runner).
func (e *Engine[R]) forget(id uint64, lr R) {
	e.mu.Lock()
	if cur, ok := e.lanes[id]; ok && any(cur) == any(lr) {
		delete(e.lanes, id)
		// A map keeps the room of its largest size: once most of a wave
		// of lanes retired, a smaller one.
		if e.peak >= 1024 && len(e.lanes) < e.peak/4 {
			n := make(map[uint64]R, len(e.lanes)) // (maps.Clone keeps the room)
			maps.Copy(n, e.lanes)
			e.lanes, e.peak = n, len(e.lanes)
		}
	}
	e.mu.Unlock()
}

// Running reports whether Run is running.
func (e *Engine[R]) Running() bool { return e.running.Load() }

// Lane returns the runner of a lane, if Run has met the lane.
func (e *Engine[R]) Lane(id uint64) (R, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.lanes[id]
	return r, ok
}

// Runners is a snapshot of the runners, in no order.
func (e *Engine[R]) Runners() []R {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.AppendSeq(make([]R, 0, len(e.lanes)), maps.Values(e.lanes))
}

// StopLane stops sending a lane's records (they stay in the store). It
// wraps ErrUnknownLane for a lane Run has not met.
func (e *Engine[R]) StopLane(laneID uint64) error {
	return e.control("stop", laneID, func(r R) { r.Stop("stopped by operator") })
}

// ResumeLane resumes a stopped lane. It wraps ErrUnknownLane for a lane
// the store has not handed to Run (none of its kind was ever stopped).
func (e *Engine[R]) ResumeLane(laneID uint64) error {
	return e.control("resume", laneID, func(r R) { r.Resume() })
}

func (e *Engine[R]) control(verb string, laneID uint64, fn func(R)) error {
	r, ok := e.Lane(laneID)
	if !ok {
		name := ""
		if e.cfg.Name != "" {
			name = e.cfg.Name + ": "
		}
		return fmt.Errorf("%s%s lane %d: %w", name, verb, laneID, ErrUnknownLane)
	}
	fn(r)
	return nil
}

// NewStoppedCollector returns a relay_lane_stopped{lane} collector made at
// scrape time from status (a retired lane's series goes with it). Only one
// deliverer's collector may be checked (describe its descriptor): the
// others share the family unchecked.
func NewStoppedCollector(status func() []LaneStatus, checked bool) prometheus.Collector {
	return &laneCollector{status: status, checked: checked, desc: prometheus.NewDesc("relay_lane_stopped",
		"1 while a lane sends nothing (invalid API key, fatal upstream answer, operator stop): alert on it.",
		[]string{"lane"}, nil), value: func(s LaneStatus) float64 {
		if s.Stopped {
			return 1
		}
		return 0
	}}
}

// laneCollector exports a gauge per lane read at scrape time from a
// snapshot of the lanes (a lane gone is simply not reported).
type laneCollector struct {
	status  func() []LaneStatus
	desc    *prometheus.Desc
	checked bool
	value   func(LaneStatus) float64
}

func (c *laneCollector) Describe(ch chan<- *prometheus.Desc) {
	if c.checked {
		ch <- c.desc
	}
}

func (c *laneCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.status() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, c.value(s), s.Label)
	}
}
