package delivery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
)

// deliverPartition delivers one owned partition until ownership ends
// (owned) or the relay stops (stop): see the package doc's Fleet mode.
// drained is called once its runners returned and their acknowledgements
// were sent. A partition of another kind is left to that kind's delivery.
func (p *Pipeline) deliverPartition(stop, owned context.Context, r storage.Reader, drained func()) error {
	name := p.queueName(r)
	if !strings.HasPrefix(name, p.lanes.String()+"-") && strings.Contains(name, "-") {
		drained()
		<-owned.Done()
		return nil
	}
	// lctx ends with ownership or the relay's stop: no new work.
	lctx, cancel := context.WithCancel(owned)
	defer cancel()
	pt := &partition{p: p, name: name, r: r, owned: owned, end: cancel, room: make(chan struct{}, 1),
		feeds: map[storage.LaneKey]*Feed{}, awake: make(chan struct{}, 1)}
	if s, ok := r.(spiller); ok {
		pt.spill, pt.maxSpilled = s, int64(max(s.MaxSpilled(), 1))
	}
	defer context.AfterFunc(stop, cancel)()
	// The acker's acks run on a context of their own: neither the relay's
	// stop nor the end of ownership cuts one short (see sendAcks).
	finish, ackDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ackDone)
		pt.ackLoop(context.WithoutCancel(owned), finish)
	}()

	var err error
	for err == nil {
		// The bytes read and not yet taken by a lane's runner are bounded.
		if !pt.waitRoom(lctx, max(int64(p.cfg.MaxReadAheadBytes)/8, 1)) {
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
			if !sleep(lctx, time.Second) {
				err = lctx.Err()
			}
		}
	}
	cancel()
	pt.wg.Wait() // the runners are done: feeds needs no lock
	for _, f := range pt.feeds {
		f.run.abandon()
	}
	// Stop the acker once its acks in flight are sent, then send what is
	// still queued: after ownership ended an ack is harmless (refused once
	// the next owner took over).
	close(finish)
	<-ackDone
	pt.sendAcks(context.WithoutCancel(owned))
	drained()
	if stop.Err() != nil {
		// Hold the lease until the store's Run ends (after every
		// partition drained), or it would be taken again here.
		<-owned.Done()
	}
	return nil
}

// partition is one owned partition's delivery.
type partition struct {
	p     *Pipeline
	name  string // "events-3", for labels and logs
	r     storage.Reader
	owned context.Context
	end   context.CancelFunc // ends the partition's delivery (a spilled message lost)

	// queued is the size of the messages read and not yet taken by a
	// lane's runner (the runners' own budgets bound what they took).
	queued atomic.Int64
	room   chan struct{}

	// spill is nil when the store cannot spill; spilled counts the
	// messages spilled and not read again, at most about maxSpilled.
	spill      spiller
	spilled    atomic.Int64
	maxSpilled int64

	fmu   sync.Mutex
	feeds map[storage.LaneKey]*Feed // written by the reader goroutine, and by a runner that retires
	wg    sync.WaitGroup            // the runners

	amu   sync.Mutex
	acks  []*storage.Message
	awake chan struct{}
}

// waitRoom waits until the messages queued for the lanes are under max
// (and fewer than maxSpilled are spilled). When the queue stays full for
// spillAfter (its lanes take nothing: stopped, or their read-ahead full of
// paused keys' events), the largest lanes' queued messages are spilled.
func (pt *partition) waitRoom(ctx context.Context, max int64) bool {
	var grace *time.Timer // not stopped on return: an unreferenced timer is collected (Go 1.23)
	for {
		full := pt.queued.Load() >= max
		over := pt.spill != nil && pt.spilled.Load() >= pt.maxSpilled
		if !full && !over {
			return ctx.Err() == nil
		}
		var tc <-chan time.Time
		if full && !over && pt.spill != nil {
			if grace == nil {
				grace = time.NewTimer(spillAfter)
			}
			tc = grace.C
		}
		select {
		case <-pt.room:
		case <-tc:
			pt.evict(max)
			grace = nil
		case <-ctx.Done():
			return false
		}
	}
}

// spillAfter is how long a partition's full queue waits for its lanes
// before it spills (a healthy lane takes its messages within a request's
// time; spilled ones cost a read each again).
const spillAfter = 2 * time.Second

// evict spills the queued messages of the lanes queuing the most until the
// queue is under max or maxSpilled are spilled.
func (pt *partition) evict(max int64) {
	pt.fmu.Lock()
	fs := make([]*Feed, 0, len(pt.feeds))
	for _, f := range pt.feeds {
		fs = append(fs, f)
	}
	pt.fmu.Unlock()
	for pt.queued.Load() >= max && pt.spilled.Load() < pt.maxSpilled {
		var big *Feed
		var most int64
		for _, f := range fs {
			f.mu.Lock()
			n := f.loaded
			f.mu.Unlock()
			if n > most {
				big, most = f, n
			}
		}
		if big == nil {
			return
		}
		big.spillQueued()
	}
}

func (pt *partition) took(n int64) {
	pt.queued.Add(-n)
	poke(pt.room)
}

// route hands m to its lane's feed, starting a runner if there is none.
func (pt *partition) route(ctx, owned context.Context, m *storage.Message) {
	if m.Lane.Kind != pt.p.lanes {
		pt.p.log.Error("message of another kind in a partition: left in the stream",
			zap.String("partition", pt.name), zap.Stringer("kind", m.Lane.Kind))
		return
	}
	n := MessageBytes(m)
	pt.queued.Add(n)
	pt.fmu.Lock()
	f := pt.feeds[m.Lane]
	pt.fmu.Unlock()
	if f != nil && f.push(m, n) {
		return
	}
	key := m.Lane // not m: the goroutine must not keep the message alive
	f = &Feed{pt: pt, key: key, wake: make(chan struct{}, 1), out: map[uint64]*storage.Message{}}
	f.run = pt.p.startFeed(f, pt.name)
	f.push(m, n)
	pt.fmu.Lock()
	pt.feeds[key] = f
	pt.fmu.Unlock()
	pt.wg.Go(func() {
		if err := f.run.Run(ctx, owned); errors.Is(err, storage.ErrRetired) {
			pt.p.forget(f.run.id, f.run)
			pt.fmu.Lock()
			if pt.feeds[key] == f {
				delete(pt.feeds, key)
			}
			pt.fmu.Unlock()
		}
	})
}

// MessageBytes is what a message's records take.
func MessageBytes(m *storage.Message) int64 {
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
	poke(pt.awake)
}

// ackLoop acknowledges what the runners finished until finish is closed.
func (pt *partition) ackLoop(ctx context.Context, finish <-chan struct{}) {
	for {
		select {
		case <-pt.awake:
		case <-finish:
			return
		}
		pt.sendAcks(ctx)
	}
}

// sendAcks acknowledges the queued messages, each try bounded by 5s; a
// failed ack is retried a few times (while the partition is owned), then
// given up: the message is read again by the next owner. No bound on the
// whole: a loaded cluster may take longer than any fixed one to confirm a
// backlog of acks, and every one it confirms is a message not read again.
// The store's lease bounds it instead: once it ran out (storage.Leased),
// what is left is given up.
func (pt *partition) sendAcks(ctx context.Context) {
	pt.amu.Lock()
	ms := pt.acks
	pt.acks = nil
	pt.amu.Unlock()
	for i, m := range ms {
		if !storage.Leased(pt.owned) {
			pt.p.log.Warn("acknowledge messages: the lease ran out, they will be read again", zap.String("partition", pt.name),
				zap.Int("messages", len(ms)-i))
			return
		}
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
			sleep(ctx, time.Duration(100<<try)*time.Millisecond)
		}
	}
}

// Feed is a lane's messages of one partition, as its runner reads them
// (a storage.Lane).
type Feed struct {
	pt  *partition
	key storage.LaneKey
	run *laneRunner

	mu       sync.Mutex
	q        []fentry                    // read, not taken by the runner, in stream order
	loaded   int64                       // bytes of q counted in pt.queued
	nspilled int                         // entries of q spilled
	out      map[uint64]*storage.Message // taken, not acknowledged
	retired  bool
	wake     chan struct{}

	// The records and bytes (MessageBytes) of the messages pushed and not
	// acknowledged yet: queued, spilled or taken (see Waiting).
	waitRecords, waitBytes atomic.Int64
}

// fentry is a message queued for a feed's runner: whole (m), or spilled
// (m nil: only its sequence is kept; the runner reads it again).
type fentry struct {
	m       *storage.Message
	seq     uint64
	n       int64 // m's bytes
	counted bool  // n is counted in pt.queued (false: read again by the runner)
	// spilling: m is dropped but the store is not told yet; the runner
	// must not ask the store to read it again before (see spilt).
	spilling bool
}

// spiller is what a partition's reader may also do (the fleet's): drop the
// body of a message read and not acknowledged and read it again by
// sequence. A spilled message stays read: unacknowledged, kept alive, in
// the store's count of unacknowledged messages. With it, a lane that takes
// nothing does not stop its partition's other lanes.
type spiller interface {
	Spill(seq uint64)
	Reread(ctx context.Context, seq uint64) (*storage.Message, error)
	// MaxSpilled bounds the messages spilled at once in the partition.
	MaxSpilled() int
}

// push queues m (n bytes); false when the feed retired (a new runner is
// needed). m is spilled at once when the feed has spilled messages queued
// or its lane is stopped.
func (f *Feed) push(m *storage.Message, n int64) bool {
	pt := f.pt
	stopped := pt.spill != nil && f.run.stop.Stopped()
	f.mu.Lock()
	if f.retired {
		f.mu.Unlock()
		return false
	}
	f.waitRecords.Add(int64(len(m.Records)))
	f.waitBytes.Add(n)
	if pt.spill != nil && (f.nspilled > 0 || stopped) {
		f.q = append(f.q, fentry{seq: m.Seq, spilling: true})
		f.nspilled++
		f.mu.Unlock()
		pt.queued.Add(-n)
		pt.spilled.Add(1)
		f.spilt([]uint64{m.Seq})
	} else {
		f.q = append(f.q, fentry{m: m, seq: m.Seq, n: n, counted: true})
		f.loaded += n
		f.mu.Unlock()
	}
	// Wake the runner: also for a spilled message (it reads it again).
	poke(f.wake)
	return true
}

// spillQueued spills the feed's queued whole messages.
func (f *Feed) spillQueued() {
	pt := f.pt
	var seqs []uint64
	var n int64
	f.mu.Lock()
	for i := range f.q {
		e := &f.q[i]
		if e.m == nil || !e.counted {
			continue
		}
		seqs = append(seqs, e.seq)
		n += e.n
		*e = fentry{seq: e.seq, spilling: true}
		f.nspilled++
	}
	f.loaded -= n
	f.mu.Unlock()
	pt.spilled.Add(int64(len(seqs)))
	pt.took(n)
	if len(seqs) > 0 {
		f.spilt(seqs)
		pt.p.log.Info("lane takes nothing: its queued messages spilled (read again when it can take them)",
			zap.String("lane", f.run.label), zap.Int("messages", len(seqs)))
	}
}

// spilt tells the store that the queue's entries marked spilling (seqs)
// are spilled, then lets the runner read them again. Only the partition's
// reader goroutine spills (route, evict), and the runner takes no entry
// marked, so the entries marked are seqs'.
func (f *Feed) spilt(seqs []uint64) {
	for _, s := range seqs {
		f.pt.spill.Spill(s)
	}
	f.mu.Lock()
	for i, left := len(f.q)-1, len(seqs); i >= 0 && left > 0; i-- {
		if f.q[i].spilling {
			f.q[i].spilling = false
			left--
		}
	}
	f.mu.Unlock()
	poke(f.wake)
}

// reread reads the spilled message at the head of the queue again; false
// when ctx ended or the partition went.
func (f *Feed) reread(ctx context.Context, seq uint64) bool {
	pt := f.pt
	for {
		m, err := pt.spill.Reread(ctx, seq)
		if err == nil {
			f.mu.Lock()
			if len(f.q) > 0 && f.q[0].seq == seq && f.q[0].m == nil {
				f.q[0] = fentry{m: m, seq: seq, n: MessageBytes(m)}
				f.nspilled--
			}
			f.mu.Unlock()
			pt.spilled.Add(-1)
			poke(pt.room)
			return true
		}
		if ctx.Err() != nil || errors.Is(err, storage.ErrLost) {
			// The partition is no longer this relay's to read, or the
			// message is gone from it while the lease holds: the
			// partition's delivery ends, as storage.ErrLost asks, so that
			// the store hands it out again and what was not acknowledged
			// is read again. Waiting for the lease to end would hold the
			// lane (the message at its head) for good.
			if pt.owned.Err() == nil {
				pt.p.log.Warn("a spilled message is lost: the partition is read again", zap.String("partition", pt.name),
					zap.Uint64("seq", seq), zap.Error(err))
			}
			pt.end()
			return false
		}
		pt.p.log.Warn("read a spilled message again; retrying in 1s", zap.String("partition", pt.name),
			zap.Uint64("seq", seq), zap.Error(err))
		if !sleep(ctx, time.Second) {
			return false
		}
	}
}

// Wait is storage.Lane's: it returns an error wrapping storage.ErrRetired
// when the feed had nothing queued or unacknowledged for feedIdle and its
// lane is not stopped (onIdle's answer is not used).
func (f *Feed) Wait(ctx context.Context, onIdle func() bool) error {
	var idle *time.Timer // not stopped on return: an unreferenced timer is collected (Go 1.23)
	for {
		f.mu.Lock()
		if len(f.q) > 0 && !f.q[0].spilling {
			head := f.q[0]
			f.mu.Unlock()
			if head.m == nil && !f.reread(ctx, head.seq) { // spilled: read it again first
				return cmp.Or(ctx.Err(), context.Canceled)
			}
			return nil
		}
		empty := len(f.q) == 0 && len(f.out) == 0
		f.mu.Unlock()
		if onIdle != nil {
			onIdle()
			onIdle = nil
		}
		var tc <-chan time.Time
		if empty && !f.run.stop.Stopped() {
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
				return fmt.Errorf("lane %s: %w", f.run.label, storage.ErrRetired)
			}
			f.mu.Unlock()
			idle = nil
		}
	}
}

// NextPart takes whole messages, at least one, up to maxBytes, as chunks
// (Seq: the message's); recs is returned as is. With nothing queued it
// returns ctx.Err(), or context.Canceled when ctx is live.
func (f *Feed) NextPart(ctx context.Context, maxBytes int, recs []storage.Record) ([]storage.Chunk, []storage.Record, error) {
	var chunks []storage.Chunk
	var total, counted int64
	f.mu.Lock()
	for len(f.q) > 0 && f.q[0].m != nil { // up to a spilled one (Wait reads it again)
		e := f.q[0]
		m, n := e.m, e.n
		if len(chunks) > 0 && total+n > int64(maxBytes) {
			break
		}
		f.q[0] = fentry{}
		f.q = f.q[1:]
		f.out[m.Seq] = m
		total += n
		if e.counted {
			counted += n
		}
		chunks = append(chunks, storage.Chunk{Seq: m.Seq, Accepted: m.Accepted, Records: m.Records, Size: int(n), Total: len(m.Records)})
	}
	if len(f.q) == 0 {
		f.q = nil
	}
	f.loaded -= counted
	f.mu.Unlock()
	if len(chunks) == 0 {
		return nil, recs, cmp.Or(ctx.Err(), context.Canceled)
	}
	f.pt.took(counted)
	return chunks, recs, nil
}

// Waiting returns the records and bytes of the lane's messages read from
// the partition and not acknowledged yet (queued, spilled or being sent).
func (f *Feed) Waiting() (records, bytes int64) {
	return f.waitRecords.Load(), f.waitBytes.Load()
}

// Ack hands the message seq, whose every record is done, to the
// partition's acker.
func (f *Feed) Ack(seq uint64) {
	f.mu.Lock()
	m := f.out[seq]
	delete(f.out, seq)
	idle := len(f.out) == 0 && len(f.q) == 0
	f.mu.Unlock()
	if m != nil {
		f.waitRecords.Add(-int64(len(m.Records)))
		f.waitBytes.Add(-MessageBytes(m))
		f.pt.ack(m)
	}
	if idle { // Wait starts its idle clock
		poke(f.wake)
	}
}
