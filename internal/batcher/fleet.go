package batcher

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/throttle"
)

// Fleet mode (issue 22). The store hands this relay the partitions it owns
// (storage.Owner.Run), one storage.Reader each; a partition carries the
// records of many lanes, each Message those of one lane. For each partition
// a reader goroutine (deliverPartition) reads messages in order and hands
// each to the lane runner of its lane in that partition (a laneRunner as in
// local mode, whose source is a feed instead of a spool lane), made on first
// sight and forgotten when idle or when the partition goes. A key lives in
// one partition, so its records go, in order, to one runner and one shard:
// per-key order holds as in local mode. A message is acknowledged (by an
// acker goroutine of the partition, so that no shard waits for the round
// trip) once every record of it was answered 200 or is a committed dead
// letter. When the partition goes (the lease moved), its runners stop at
// once, abandoning requests in flight; what was not acknowledged comes back,
// in order, to the next owner (who may send some records again: the
// upstream deduplicates by insert_id). When Run's context ends (the relay
// stops), every partition stops taking new work, requests in flight finish
// within Config.DrainTimeout and their acknowledgements are sent, and only
// then are the leases given up, so that a standby takes over at once with
// few records to send again.

// FleetStore is the fleet's store as the batcher uses it (fleet.Backend).
type FleetStore interface {
	storage.Owner
	DeadWriter
}

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

// feedIdle is how long a fleet lane runner with nothing to send lives.
const feedIdle = time.Minute

// NewFleet returns a pipeline for fleet mode: it delivers the events
// partitions st hands it (other kinds' partitions are left alone), stores
// dead letters in st and shares pauses through pauses (may be nil). log
// and reg may be nil; thr may be nil.
func NewFleet(cfg Config, st FleetStore, pauses SharedPauses, send Sender, thr *throttle.Throttle, log *zap.Logger, reg prometheus.Registerer) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if st == nil || send == nil {
		return nil, errors.New("batcher: fleet store and sender are required")
	}
	p, err := newPipeline(cfg, send, thr, log)
	if err != nil {
		return nil, err
	}
	p.dead = st
	p.fl = &fleetState{st: st, pauses: pauses, lanes: map[uint64]*laneRunner{}}
	m, err := newMetrics(reg, p)
	if err != nil {
		return nil, err
	}
	p.m = m
	return p, nil
}

// fleetState is a fleet-mode pipeline's: its runners by id, for the lane
// control and the metrics.
type fleetState struct {
	st     FleetStore
	pauses SharedPauses
	nextID atomic.Uint64

	mu      sync.Mutex
	lanes   map[uint64]*laneRunner
	running bool
}

func (fl *fleetState) ready() error {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if !fl.running {
		return ErrNotRunning
	}
	return nil
}

func (fl *fleetState) lane(id uint64) *laneRunner {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.lanes[id]
}

func (fl *fleetState) runners() []*laneRunner {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	rs := make([]*laneRunner, 0, len(fl.lanes))
	for _, lr := range fl.lanes {
		rs = append(rs, lr)
	}
	return rs
}

func (fl *fleetState) control(id uint64, f func(*laneRunner)) error {
	lr := fl.lane(id)
	if lr == nil {
		return fmt.Errorf("batcher: lane %d: %w", id, delivery.ErrUnknownLane)
	}
	f(lr)
	return nil
}

func (fl *fleetState) add(lr *laneRunner) {
	fl.mu.Lock()
	fl.lanes[lr.id] = lr
	fl.mu.Unlock()
}

func (fl *fleetState) remove(lr *laneRunner) {
	fl.mu.Lock()
	if fl.lanes[lr.id] == lr {
		delete(fl.lanes, lr.id)
	}
	fl.mu.Unlock()
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

// runFleet is Run in fleet mode.
func (p *Pipeline) runFleet(ctx context.Context) error {
	fl := p.fl
	fl.mu.Lock()
	if fl.running {
		fl.mu.Unlock()
		return ErrAlreadyRunning
	}
	fl.running = true
	fl.mu.Unlock()
	defer func() {
		fl.mu.Lock()
		fl.running = false
		fl.mu.Unlock()
	}()
	// The store's Run outlives ctx by the drain: the leases stay held
	// (renewed) while requests in flight finish and are acknowledged.
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
	err := fl.st.Run(runCtx, func(owned context.Context, r storage.Reader) error {
		dr.add(1)
		drained := sync.OnceFunc(func() { dr.add(-1) })
		defer drained()
		return p.deliverPartition(ctx, owned, r, drained)
	})
	cancelRun()
	<-stopped
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// queueName names a store's queue for labels and logs: the fleet's
// "events-3", or a number.
func (p *Pipeline) queueName(r storage.Reader) string {
	if n, ok := r.(interface{ Name() string }); ok {
		return n.Name()
	}
	return "q" + strconv.FormatUint(p.fl.nextID.Add(1), 10)
}

// partition is one owned partition's delivery.
type partition struct {
	p     *Pipeline
	r     storage.Reader
	name  string
	owned context.Context

	// queued is the size of the messages read and not yet taken by a
	// lane's reader; the partition's reader waits while it is at
	// maxQueued (the lanes' read-ahead budgets bound what they took).
	queued atomic.Int64
	room   chan struct{}

	fmu   sync.Mutex
	feeds map[spool.LaneKey]*feed // written by the reader goroutine, and by a runner that retires
	wg    sync.WaitGroup          // the runners

	amu   sync.Mutex
	acks  []*storage.Message
	awake chan struct{}
}

// deliverPartition delivers one owned partition until ownership ends
// (owned) or the pipeline stops (stop): see the fleet mode above. drained
// is called once its requests in flight are done and acknowledged.
func (p *Pipeline) deliverPartition(stop, owned context.Context, r storage.Reader, drained func()) error {
	name := p.queueName(r)
	if !strings.HasPrefix(name, spool.KindEvents.String()+"-") && strings.Contains(name, "-") {
		// Another kind's partition (group identify, user mappings): not
		// delivered in fleet mode yet; its messages stay in the stream.
		drained()
		<-owned.Done()
		return nil
	}
	pt := &partition{p: p, r: r, name: name, owned: owned, room: make(chan struct{}, 1),
		feeds: map[spool.LaneKey]*feed{}, awake: make(chan struct{}, 1)}
	// lctx ends with ownership or the pipeline's stop: no new work.
	lctx, cancel := context.WithCancel(owned)
	defer cancel()
	defer context.AfterFunc(stop, cancel)()
	ackCtx, stopAcks := context.WithCancel(context.WithoutCancel(owned))
	ackDone := make(chan struct{})
	go func() {
		defer close(ackDone)
		pt.ackLoop(ackCtx)
	}()

	var err error
	maxQueued := max(int64(p.cfg.MaxReadAheadBytes)/8, 1)
	for err == nil {
		if !pt.waitRoom(lctx, maxQueued) {
			break
		}
		var m *storage.Message
		m, err = r.Next(lctx)
		switch {
		case err == nil:
			pt.route(lctx, owned, m)
		case lctx.Err() != nil || errors.Is(err, storage.ErrLost):
		default:
			p.log.Warn("read partition; retrying in 1s", zap.String("partition", name), zap.Error(err))
			err = nil
			select {
			case <-time.After(time.Second):
			case <-lctx.Done():
				err = lctx.Err()
			}
		}
	}
	cancel()
	// The runners' requests in flight finished (or were abandoned with
	// the lease); with the runners done, feeds needs no lock.
	pt.wg.Wait()
	for _, f := range pt.feeds {
		p.fl.remove(f.lr)
		f.lr.abandon()
	}
	// Send what is acknowledged, then stop the acker: after ownership
	// ended an ack is harmless (refused once the next owner took over).
	pt.flushAcks()
	stopAcks()
	<-ackDone
	drained()
	if stop.Err() != nil {
		// Hold the lease until the store's Run ends (after every
		// partition drained), or it would be taken again here.
		<-owned.Done()
	}
	return nil
}

// waitRoom waits until the messages queued for the lanes are under max.
func (pt *partition) waitRoom(ctx context.Context, max int64) bool {
	for pt.queued.Load() >= max {
		select {
		case <-pt.room:
		case <-ctx.Done():
			return false
		}
	}
	return ctx.Err() == nil
}

// took is called by a feed when its reader took n bytes of messages.
func (pt *partition) took(n int64) {
	pt.queued.Add(-n)
	select {
	case pt.room <- struct{}{}:
	default:
	}
}

// route hands m to its lane's runner, starting one if there is none.
func (pt *partition) route(ctx, owned context.Context, m *storage.Message) {
	if m.Lane.Kind != spool.KindEvents {
		pt.p.log.Error("message of another kind in an events partition: left in the stream",
			zap.String("partition", pt.name), zap.Stringer("kind", m.Lane.Kind))
		return
	}
	n := messageBytes(m)
	pt.queued.Add(n)
	pt.fmu.Lock()
	f := pt.feeds[m.Lane]
	pt.fmu.Unlock()
	if f != nil && f.push(m, n) {
		return
	}
	p := pt.p
	f = &feed{pt: pt, wake: make(chan struct{}, 1), out: map[uint64]*storage.Message{}}
	id := p.fl.nextID.Add(1)
	f.lr = newRunner(p, f, id, spool.LabelOf(m.Lane)+"-"+pt.name, m.Lane)
	f.push(m, n)
	key := m.Lane // not m: the goroutine must not keep the message alive
	pt.fmu.Lock()
	pt.feeds[key] = f
	pt.fmu.Unlock()
	p.fl.add(f.lr)
	pt.wg.Go(func() {
		if err := f.lr.Run(ctx, owned); errors.Is(err, spool.ErrRetired) {
			p.fl.remove(f.lr)
			pt.fmu.Lock()
			if pt.feeds[key] == f {
				delete(pt.feeds, key)
			}
			pt.fmu.Unlock()
		}
	})
}

// messageBytes is what a message's records take.
func messageBytes(m *storage.Message) int64 {
	n := int64(0)
	for i := range m.Records {
		r := &m.Records[i]
		n += int64(len(r.OrderKey) + len(r.UserID) + len(r.Data))
	}
	return n
}

// ack queues m's acknowledgement for the acker.
func (pt *partition) ack(m *storage.Message) {
	pt.amu.Lock()
	pt.acks = append(pt.acks, m)
	pt.amu.Unlock()
	select {
	case pt.awake <- struct{}{}:
	default:
	}
}

// ackLoop acknowledges what the runners finished until ctx ends.
func (pt *partition) ackLoop(ctx context.Context) {
	for {
		select {
		case <-pt.awake:
		case <-ctx.Done():
			return
		}
		pt.sendAcks(ctx)
	}
}

// flushAcks sends the acknowledgements still queued, bounded in time.
func (pt *partition) flushAcks() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pt.sendAcks(ctx)
}

// sendAcks acknowledges the queued messages; a failed ack is retried a few
// times (while the partition is owned), then given up: the message is read
// again by the next owner.
func (pt *partition) sendAcks(ctx context.Context) {
	pt.amu.Lock()
	ms := pt.acks
	pt.acks = nil
	pt.amu.Unlock()
	for _, m := range ms {
		for try := 0; ; try++ {
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := pt.r.Ack(actx, m)
			cancel()
			if err == nil {
				break
			}
			if try >= 4 || ctx.Err() != nil || pt.owned.Err() != nil {
				pt.p.log.Warn("acknowledge message: it will be read again", zap.String("partition", pt.name),
					zap.Uint64("seq", m.Seq), zap.Error(err))
				break
			}
			select {
			case <-time.After(time.Duration(100<<try) * time.Millisecond):
			case <-ctx.Done():
			}
		}
	}
}

// feed is a lane's messages of one partition, as its runner reads them.
type feed struct {
	pt *partition
	lr *laneRunner

	mu      sync.Mutex
	q       []*storage.Message          // read, not taken by the runner
	out     map[uint64]*storage.Message // taken, not acknowledged
	retired bool
	wake    chan struct{}
}

// push queues m (n bytes); false when the feed retired (a new runner is
// needed).
func (f *feed) push(m *storage.Message, n int64) bool {
	f.mu.Lock()
	if f.retired {
		f.mu.Unlock()
		return false
	}
	f.q = append(f.q, m)
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
	return true
}

// Wait is source.Wait: a feed with nothing queued or unacknowledged for
// feedIdle retires.
func (f *feed) Wait(ctx context.Context, onIdle func()) error {
	var idle *time.Timer
	defer func() {
		if idle != nil {
			idle.Stop()
		}
	}()
	for {
		f.mu.Lock()
		if len(f.q) > 0 {
			f.mu.Unlock()
			return nil
		}
		empty := len(f.out) == 0
		f.mu.Unlock()
		if onIdle != nil {
			onIdle()
			onIdle = nil
		}
		var tc <-chan time.Time
		if empty && !f.lr.stop.Stopped() {
			if idle == nil {
				idle = time.NewTimer(feedIdle)
			}
			tc = idle.C
		}
		select {
		case <-f.wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-tc:
			f.mu.Lock()
			if len(f.q) == 0 && len(f.out) == 0 {
				f.retired = true
				f.mu.Unlock()
				return fmt.Errorf("lane %s: %w", f.lr.label, spool.ErrRetired)
			}
			f.mu.Unlock()
			idle = nil
		}
	}
}

// NextPart is source.NextPart: whole messages, at least one, up to
// maxBytes (a message is at most the fleet's message size, 512 KiB by
// default).
func (f *feed) NextPart(ctx context.Context, maxBytes int, recs []spool.Record) ([]spool.Chunk, []spool.Record, error) {
	var chunks []spool.Chunk
	var total int64
	f.mu.Lock()
	for len(f.q) > 0 {
		m := f.q[0]
		n := messageBytes(m)
		if len(chunks) > 0 && total+n > int64(maxBytes) {
			break
		}
		f.q[0] = nil
		f.q = f.q[1:]
		f.out[m.Seq] = m
		total += n
		chunks = append(chunks, spool.Chunk{Seq: m.Seq, Accepted: m.Accepted, Records: m.Records, Size: int(n), Total: len(m.Records)})
	}
	if len(f.q) == 0 {
		f.q = nil
	}
	f.mu.Unlock()
	if len(chunks) == 0 {
		if ctx.Err() != nil {
			return nil, recs, ctx.Err()
		}
		return nil, recs, context.Canceled
	}
	f.pt.took(total)
	return chunks, recs, nil
}

// Ack is source.Ack: the message goes to the partition's acker.
func (f *feed) Ack(seq uint64) {
	f.mu.Lock()
	m := f.out[seq]
	delete(f.out, seq)
	idle := len(f.out) == 0 && len(f.q) == 0
	f.mu.Unlock()
	if m != nil {
		f.pt.ack(m)
	}
	if idle { // Wait starts its idle clock
		select {
		case f.wake <- struct{}{}:
		default:
		}
	}
}

// abandon releases the read-ahead a runner that will not run again holds
// (its partition went: what it held is read again by the next owner).
func (lr *laneRunner) abandon() {
	lr.bmu.Lock()
	n := lr.inflight
	lr.bmu.Unlock()
	lr.release(n)
	lr.heldKeys.Store(0)
	lr.heldEvents.Store(0)
}

// pausedShared is the end of key's pause on any relay of the fleet.
func (p *Pipeline) pausedShared(key []byte) time.Time {
	if p.fl == nil || p.fl.pauses == nil {
		return time.Time{}
	}
	u, _ := p.fl.pauses.PausedUntil(key)
	return u
}

// sharePauses writes pauses to the fleet (a no-op locally), so that a relay
// taking a partition over honours them; bounded in time, logged on failure
// (the pause then holds on this relay only).
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
