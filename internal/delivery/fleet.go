package delivery

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/throttle"
)

// SharedPauses are the pauses every relay of the fleet sees (fleet.Fleet):
// a 429's pause and a daily quota's are written there too, so that a relay
// taking a partition over honours them.
type SharedPauses interface {
	// Pause holds key until until on every relay; it returns once stored.
	Pause(ctx context.Context, key []byte, until time.Time) error
	// PausedUntil is key's pause as known here; it never blocks.
	PausedUntil(key []byte) (time.Time, bool)
	// AnyPaused reports whether some key may be paused.
	AnyPaused() bool
}

// SharedLanes are the lane stops every relay of the fleet sees
// (fleet.Fleet): an operator's StopLane holds the lane in every partition
// on every relay, also after its partitions move, until a ResumeLane on
// any relay.
type SharedLanes interface {
	// StopLane stops lane on every relay; it returns once stored.
	StopLane(ctx context.Context, lane storage.LaneKey, reason string) error
	// ResumeLane ends lane's stop on every relay.
	ResumeLane(ctx context.Context, lane storage.LaneKey) error
	// WatchLanes calls fn for every lane stopped now, then for every
	// change, in order; fn must not block.
	WatchLanes(fn func(lane storage.LaneKey, stopped bool, reason string))
}

// feedIdle is how long a fleet lane runner with nothing to send lives.
const feedIdle = time.Minute

// NewFleet returns a pipeline for fleet mode: it delivers the events
// partitions st hands it, stores dead letters in st, shares pauses through
// pauses and operators' lane stops through lanes (either may be nil: this
// relay's own then). log, reg and thr may be nil.
func NewFleet(cfg Config, st Store, pauses SharedPauses, lanes SharedLanes, send Sender, thr *throttle.Throttle, log *zap.Logger, reg prometheus.Registerer) (*Pipeline, error) {
	p, err := New(cfg, st, send, thr, log, reg)
	if err != nil {
		return nil, err
	}
	p.fl = &fleetState{pauses: pauses, lanes: lanes, stops: make(map[storage.LaneKey]string)}
	if lanes != nil {
		lanes.WatchLanes(p.laneStopChanged)
	}
	return p, nil
}

// fleetState is what a pipeline has to deliver fleet partitions. Its lock
// is never held across a call out.
type fleetState struct {
	pauses SharedPauses
	lanes  SharedLanes
	nextID atomic.Uint64

	smu   sync.Mutex
	stops map[storage.LaneKey]string // lanes stopped fleet-wide, by reason
}

// queueName names a store's queue for labels and logs: the fleet's
// "events-3", or a number.
func (p *Pipeline) queueName(r storage.Reader) string {
	if n, ok := r.(interface{ Name() string }); ok {
		return n.Name()
	}
	return "q" + strconv.FormatUint(p.fl.nextID.Add(1), 10)
}

// startFeed makes the runner of a new feed of partition name, known to the
// pipeline until it retires (Feed.Wait) or its partition ends (abandon).
func (p *Pipeline) startFeed(f *Feed, name string) *laneRunner {
	lr := newRunner(p, f, p.fl.nextID.Add(1), f.key.Label()+"-"+name, f.key)
	p.add(lr.id, lr)
	p.applyStop(lr) // after add: a change arriving meanwhile finds the runner
	return lr
}

// abandon forgets a fleet runner whose partition went and releases the
// read-ahead it holds (read again by the next owner).
func (lr *laneRunner) abandon() {
	lr.p.forget(lr.id, lr)
	lr.release(lr.readAhead.Load())
	lr.heldKeys.Store(0)
	lr.heldEvents.Store(0)
}

// pausedUntil is the end of key's pause here, and with fleet on any relay
// of the fleet.
func (p *Pipeline) pausedUntil(key []byte, fleet bool) time.Time {
	u := p.thr.PausedUntil(key)
	if fleet {
		if uu, _ := p.fl.pauses.PausedUntil(key); uu.After(u) {
			u = uu
		}
	}
	return u
}

// sharePauses writes pauses to the fleet (a no-op locally), so that a relay
// taking a partition over honours them; on failure they hold here only.
func (p *Pipeline) sharePauses(ctx context.Context, keys []string, until time.Time) {
	if p.fl == nil || p.fl.pauses == nil || len(keys) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	for _, k := range keys {
		if err := p.fl.pauses.Pause(ctx, []byte(k), until); err != nil {
			p.log.Warn("share a pause with the fleet; it holds on this relay only", zap.Error(err))
			return
		}
	}
}

// laneStopChanged applies a fleet-wide stop or resume of lane to this
// relay's runners of it (every partition) and to those started later.
func (p *Pipeline) laneStopChanged(lane storage.LaneKey, stopped bool, reason string) {
	fl := p.fl
	fl.smu.Lock()
	if stopped {
		fl.stops[lane] = reason
	} else {
		delete(fl.stops, lane)
	}
	fl.smu.Unlock()
	for _, lr := range p.runnerList() {
		if lr.key == lane {
			p.applyStop(lr)
		}
	}
}

// applyStop puts the fleet-wide stop state of lr's lane on lr. It is read
// and put under smu, so that an older state never lands after a newer one
// (a fleet runner's StopSwitch has no Lane: nothing is called out under
// the lock).
func (p *Pipeline) applyStop(lr *laneRunner) {
	fl := p.fl
	fl.smu.Lock()
	reason, stop := fl.stops[lr.key]
	changed := lr.stop.Set(stop, reason)
	fl.smu.Unlock()
	if changed {
		lr.stopChanged(stop, reason)
	}
}

// sharedLaneTimeout bounds an operator's stop or resume in the cluster.
const sharedLaneTimeout = 5 * time.Second

// operatorStop is the stop reason of StopLane.
const operatorStop = "stopped by operator"

// controlShared is StopLane (stop) or ResumeLane of fleet runner lr: its
// lane is stopped or resumed on every relay, or here only when the cluster
// does not answer.
func (p *Pipeline) controlShared(lr *laneRunner, stop bool) {
	fl := p.fl
	if fl.lanes != nil {
		ctx, cancel := context.WithTimeout(context.Background(), sharedLaneTimeout)
		var err error
		if stop {
			err = fl.lanes.StopLane(ctx, lr.key, operatorStop)
		} else {
			err = fl.lanes.ResumeLane(ctx, lr.key)
		}
		cancel()
		if err == nil {
			p.laneStopChanged(lr.key, stop, operatorStop)
			return
		}
		p.log.Warn("lane stop or resume not shared with the fleet: it holds on this relay only, until its partitions move",
			zap.String("lane", lr.label), zap.Error(err))
	}
	lr.setStop(stop, operatorStop)
}
