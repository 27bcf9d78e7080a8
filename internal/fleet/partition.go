package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
)

// Message is one stored message as its partition's owner reads it: records
// of one lane from one request.
type Message struct {
	Partition int
	Seq       uint64 // stream sequence: increasing within a partition
	Lane      storage.LaneKey
	Accepted  time.Time
	// Records alias the message's body; valid until Ack.
	Records []storage.Record
	// Delivered counts deliveries, this one included: above 1, an earlier
	// owner (or this one, after a lost acknowledgement) read it before and
	// may have sent some of its records.
	Delivered uint64

	msg jetstream.Msg
}

// Partition is a partition this relay owns, handed to Run's deliver
// function. Next has one caller at a time; Ack and Nak may be called from
// any goroutine.
type Partition struct {
	f    *Fleet
	kind storage.Kind
	id   int
	ctx  context.Context // ends when ownership ends
	it   jetstream.MessagesContext
	cons jetstream.Consumer
	log  *zap.Logger
	// limits: the partition's stream has limits retention (fleet.go,
	// ensureStream), read by a consumer of one replica; otherwise a
	// work-queue stream of before, by one of the stream's replicas.
	limits bool

	// delivery is the consumer sequence Next expects next (see
	// openPartition, Deliveries); broken is set once one did not match.
	// Next's alone (one caller at a time).
	delivery uint64
	broken   bool

	mu  sync.Mutex
	out map[uint64]jetstream.Msg // handed out by Next, not yet acked (kept alive)
	// undone are the stream sequences handed out by Next and not yet
	// acknowledged (Nak'd ones included), ascending; last is the highest
	// sequence Next handed out. The removal floor (see Ack) is undone's
	// first, or last+1.
	undone []uint64
	last   uint64
	// spilled are handed out, not yet acked, whose bodies were dropped
	// (spill.go): their reply subjects, kept alive as out's.
	spilled map[uint64]string

	stopKeep chan struct{}
	keepDone chan struct{}

	rm remover
}

// Kind is the lane kind whose stream the partition belongs to.
func (p *Partition) Kind() storage.Kind { return p.kind }

// ID is the partition number, 0 to P-1.
func (p *Partition) ID() int { return p.id }

// pullExpiry bounds one pull request of a partition reader (see openPartition).
const pullExpiry = 4 * time.Second

func consumerName(id int) string { return "p" + strconv.Itoa(id) }

// openPartition makes this relay the partition's reader: it deletes the
// partition's consumer (fencing the previous owner, whose acknowledgements
// are refused from now on) and creates it anew at the partition's first
// message, which in a work-queue stream is the oldest unacknowledged one.
//
// Deliveries: the reader must see every message the consumer delivers, in
// order, or a later message of a key overtakes an earlier one. A pull
// consumer's delivery can be lost: the server hands a message to a pull
// request whose reply dies on the way (the reader's NATS server killed,
// its connection moving to another) and then waits AckWait before giving
// it again, while it goes on delivering the partition's later messages.
// And a create can answer with a consumer that outlived the delete (a
// consumer name is reused): its earlier deliveries went to the previous
// owner. Both show in the consumer sequence, which the server increments
// on every delivery (redeliveries included) from 1 for a new consumer:
// openPartition refuses a consumer that delivered before (see
// createConsumer), and Next expects 1, 2, 3...; on any other, it hands
// nothing more out and returns ErrLost, so the deliver function finishes
// what it sent and returns, the lease is given up, and the partition is
// opened again (by this relay, or the one now assigned): the reset
// consumer delivers every unacknowledged message again, in stream order.
func (f *Fleet) openPartition(ctx, owned context.Context, k storage.Kind, id int) (*Partition, error) {
	stream, name := f.n.streamOf(k, id), consumerName(id)
	if err := f.js.DeleteConsumer(ctx, stream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("fleet: reset consumer %s/%s: %w", stream, name, unavailable(err))
	}
	cons, err := f.createConsumer(ctx, k, id)
	if err != nil {
		return nil, err
	}
	return f.readPartition(owned, k, id, cons)
}

// errStaleConsumer: a create answered with a consumer that delivered
// before (see openPartition, Deliveries).
var errStaleConsumer = errors.New("consumer not reset (it delivered before)")

// createConsumer creates the partition's consumer, reading from the
// partition's first message; it fails (unavailable) when the server
// answers with an existing consumer that delivered before: a create of an
// existing durable with the same configuration returns it, and the
// previous owner's unacknowledged messages would then wait for AckWait.
// The caller retries, delete included.
func (f *Fleet) createConsumer(ctx context.Context, k storage.Kind, id int) (jetstream.Consumer, error) {
	stream, name := f.n.streamOf(k, id), consumerName(id)
	// A consumer of one replica on a limits stream: its state is needed by
	// nobody but its reader (see doc.go, Streams), so it is kept on one
	// node, in memory, without a Raft group of its own: no proposal per
	// delivery and acknowledgement on every node. The server refuses one
	// replica on a work-queue stream: that keeps the stream's.
	replicas := 0
	if f.limits[stream] {
		replicas = 1
	}
	cons, err := f.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable:       name,
		Replicas:      replicas,
		FilterSubject: f.n.subject(k, id),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       f.cfg.AckWait,
		MaxAckPending: f.cfg.MaxAckPending,
		MaxDeliver:    -1,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		// The consumer's state in memory (its Raft log included): no
		// file write and fsync per acknowledgement. Nothing depends on
		// that state outliving the servers: what is done is gone from
		// the stream itself (see remove.go), and every owner resets the
		// consumer to the partition's first message anyway (see
		// openPartition).
		MemoryStorage: true,
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: create consumer %s/%s: %w", stream, name, unavailable(err))
	}
	if ci := cons.CachedInfo(); ci == nil || ci.Delivered.Consumer != 0 || ci.NumAckPending != 0 {
		var d uint64
		if ci != nil {
			d = ci.Delivered.Consumer
		}
		f.log.Warn("partition consumer not reset; retrying", zap.String("stream", stream), zap.String("consumer", name), zap.Uint64("delivered", d))
		return nil, fmt.Errorf("fleet: create consumer %s/%s: %w (%d deliveries): %w", stream, name, errStaleConsumer, d, ErrUnavailable)
	}
	return cons, nil
}

// readPartition starts reading cons, a consumer just created (see
// openPartition, Deliveries).
func (f *Fleet) readPartition(owned context.Context, k storage.Kind, id int, cons jetstream.Consumer) (*Partition, error) {
	stream, name := f.n.streamOf(k, id), consumerName(id)
	// A short pull expiry: a pull sent to a consumer just created whose
	// leader is not elected yet is lost, and the iterator notices only
	// after two missed heartbeats (expiry/2 each): with the default 30 s
	// expiry a partition just taken could sit idle for 30 s.
	it, err := cons.Messages(jetstream.PullMaxMessagesWithBytesLimit(256, 8<<20), jetstream.PullExpiry(pullExpiry))
	if err != nil {
		return nil, fmt.Errorf("fleet: read %s/%s: %w", stream, name, unavailable(err))
	}
	p := &Partition{
		f: f, kind: k, id: id, ctx: owned, it: it, cons: cons, limits: f.limits[stream],
		log:      f.log.With(zap.String("stream", stream), zap.Int("partition", id)),
		delivery: 1,
		out:      make(map[uint64]jetstream.Msg),
		stopKeep: make(chan struct{}),
		keepDone: make(chan struct{}),
	}
	f.addReader(slot{k, id}, 1)
	go p.keepAlive()
	return p, nil
}

// close stops reading and the keep-alive and waits for the removal of the
// acknowledged messages. Unacknowledged messages stay for the next owner.
func (p *Partition) close() {
	p.it.Stop()
	p.f.addReader(slot{p.kind, p.id}, -1)
	close(p.stopKeep)
	<-p.keepDone
	p.removed(true)
	p.mu.Lock()
	p.f.m.held.Add(-int64(len(p.out) + len(p.spilled)))
	clear(p.out)
	clear(p.spilled)
	p.mu.Unlock()
}

// keepAlive sends InProgress for every handed-out message every AckWait/3,
// so that the server never redelivers a message its owner still holds (a
// paused key's, one in a request that is retried).
func (p *Partition) keepAlive() {
	defer close(p.keepDone)
	t := time.NewTicker(p.f.cfg.AckWait / 3)
	defer t.Stop()
	var held []jetstream.Msg
	var replies []string
	for {
		select {
		case <-p.stopKeep:
			return
		case <-t.C:
		}
		p.kickLate()
		p.mu.Lock()
		for _, m := range p.out {
			held = append(held, m)
		}
		for _, r := range p.spilled {
			replies = append(replies, r)
		}
		p.mu.Unlock()
		for _, m := range held {
			if err := m.InProgress(); err != nil {
				p.log.Debug("keep message alive", zap.Error(err))
			}
		}
		for _, r := range replies {
			if err := p.f.nc.Publish(r, ackProgress); err != nil {
				p.log.Debug("keep spilled message alive", zap.Error(err))
			}
		}
		clear(held)
		held = held[:0]
		clear(replies)
		replies = replies[:0]
	}
}

// Next returns the partition's next message, in stream order, blocking
// until there is one. It returns ErrLost once ownership ended (the deliver
// function should then return) or a delivery was missed (see
// openPartition, Deliveries; the partition is then opened again), and ctx.Err() when ctx ends. A message that
// cannot be decoded is dead-lettered whole (reason "damaged") and skipped.
func (p *Partition) Next(ctx context.Context) (*Message, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(p.ctx, cancel)
	defer stop()
	for {
		if p.ctx.Err() != nil || p.broken {
			// Fenced: a message already buffered must not be handed out.
			return nil, ErrLost
		}
		m, err := p.it.Next(jetstream.NextContext(ctx))
		if err == nil && p.ctx.Err() != nil {
			return nil, ErrLost
		}
		if err != nil {
			if p.ctx.Err() != nil {
				return nil, ErrLost
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
				// Another relay took the partition over.
				return nil, ErrLost
			}
			if errors.Is(err, jetstream.ErrNoHeartbeat) {
				// The pull's heartbeats were late (a busy server, a leader
				// election): the iterator has already sent a new pull, and
				// a delivery lost meanwhile is caught by the sequence check.
				// A consumer of one replica has no other node to move to:
				// when its node is gone it stays silent until the node
				// comes back, so when it does not answer an info request
				// either, the partition is opened again (its consumer made
				// anew on a node that is up). A busy node's late heartbeat
				// is no reason: it answers.
				if p.limits && !p.consumerAnswers(ctx) {
					if ctx.Err() != nil {
						return nil, ctx.Err()
					}
					p.broken = true
					p.log.Warn("partition consumer silent; reopening the partition", zap.Error(err))
					return nil, ErrLost
				}
				p.log.Debug("partition pull heartbeat missed; pulling again", zap.Error(err))
				continue
			}
			return nil, fmt.Errorf("fleet: read partition %d: %w", p.id, unavailable(err))
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, fmt.Errorf("fleet: read partition %d: %w", p.id, err)
		}
		if md.Sequence.Consumer != p.delivery {
			// A delivery missed (or repeated): see openPartition.
			p.broken = true
			p.log.Warn("partition delivery missed; reopening the partition",
				zap.Uint64("want_delivery", p.delivery), zap.Uint64("delivery", md.Sequence.Consumer), zap.Uint64("seq", md.Sequence.Stream))
			return nil, ErrLost
		}
		p.delivery++
		var plain [][]byte
		if hd := m.Headers(); hd != nil {
			plain = p.f.recent.take(hd.Get(nats.MsgIdHdr), m.Data())
		}
		h, recs, err := decodeWith(m.Data(), plain)
		if err != nil {
			p.corrupt(ctx, m, md, err)
			continue
		}
		seq := md.Sequence.Stream
		p.mu.Lock()
		if _, ok := p.out[seq]; !ok {
			p.f.m.held.Add(1)
		}
		p.out[seq] = m
		if i, found := slices.BinarySearch(p.undone, seq); !found {
			p.undone = slices.Insert(p.undone, i, seq)
		}
		p.last = max(p.last, seq)
		p.mu.Unlock()
		return &Message{
			Partition: p.id, Seq: md.Sequence.Stream, Lane: h.lane, Accepted: h.accepted,
			Records: recs, Delivered: md.NumDelivered, msg: m,
		}, nil
	}
}

// consumerInfoWait bounds consumerAnswers: a loaded node answers within
// it, and a reopen for nothing costs a consumer's re-creation, not a loss.
const consumerInfoWait = 5 * time.Second

// consumerAnswers asks the partition's consumer for its info: false when
// it does not answer within consumerInfoWait (its node is gone, or the
// consumer is), or ctx ended.
func (p *Partition) consumerAnswers(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, consumerInfoWait)
	defer cancel()
	_, err := p.cons.Info(ctx)
	return err == nil
}

// corrupt dead-letters an undecodable message (its checksum fails, or it
// was not written by this package) whole, with reason damaged as the local
// spool's damaged chunks, and acknowledges it; when that fails the message
// stays (and is read again by the next owner). Both run on a context of
// their own: Next's may have ended (the partition moving, the relay
// stopping), and the message would then come back for ever.
func (p *Partition) corrupt(ctx context.Context, m jetstream.Msg, md *jetstream.MsgMetadata, cause error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	p.log.Error("undecodable message dead-lettered", zap.Uint64("seq", md.Sequence.Stream), zap.Error(cause))
	dl := []storage.DeadLetter{{
		Lane:     storage.LaneKey{Kind: p.kind},
		Reason:   "damaged",
		Answer:   []byte(cause.Error()),
		Accepted: md.Timestamp,
		Died:     time.Now(),
		Record:   storage.Record{Data: m.Data()},
	}}
	if err := p.f.PutDead(ctx, dl); err != nil {
		p.log.Error("dead-letter undecodable message", zap.Error(err))
		return
	}
	if p.limits {
		p.deleteAcked(ctx, md.Sequence.Stream) // see Ack
		return
	}
	if err := m.DoubleAck(ctx); err != nil {
		p.log.Error("acknowledge undecodable message", zap.Error(err))
	}
}

// Ack acknowledges m: every record of it was answered 200 or is a committed
// dead letter. When every message handed out before m is acknowledged, m
// is removed from the stream by a purge in the background (see remove.go:
// killed before it, the relay leaves m to be read again by the next
// owner); otherwise Ack returns once the consumer confirmed m's
// acknowledgement (in a limits stream, once m was deleted: see deleteAcked).
// Acknowledging after ownership ended is allowed and harmless: the purge
// and the deletion remove only messages this owner delivered and
// acknowledged; a consumer acknowledgement fails once the next owner reset
// the consumer, and the message is delivered again by that owner.
func (p *Partition) Ack(ctx context.Context, m *Message) error {
	return p.ack(ctx, m, false)
}

// ackLater is Ack, but a message of a limits stream acknowledged above the
// floor is not deleted before it returns: it is left to the purge, which
// removes it once the floor passes it, and deleted alone only when the
// floor has not passed it after a removal round (see removeLater). The
// delivery engine acknowledges messages out of stream order whenever their
// upstream requests end out of order (about a third of its
// acknowledgements under load), and each deletion is a Raft entry of the
// stream, on every node, as many as the publishes.
func (p *Partition) ackLater(ctx context.Context, m *Message) error {
	return p.ack(ctx, m, true)
}

func (p *Partition) ack(ctx context.Context, m *Message, later bool) error {
	p.mu.Lock()
	if i, found := slices.BinarySearch(p.undone, m.Seq); found {
		p.undone = slices.Delete(p.undone, i, i+1)
	}
	floor := p.floorLocked()
	p.mu.Unlock()
	if m.Seq < floor {
		p.removeBelow(floor)
		p.forget(m.Seq)
		return nil
	}
	if p.limits {
		// Not acknowledged to the consumer: its state is nobody's (see
		// doc.go), and the server takes a message deleted from the stream
		// as acknowledged (it frees its place in MaxAckPending). A
		// consumer that restarted on its node (its memory state lost)
		// answers no acknowledgement, and waiting for it would hold the
		// partition's delivery; its deliveries are caught by Next.
		p.forget(m.Seq)
		if !later || !p.removeLater(m.Seq) {
			p.deleteAcked(ctx, m.Seq)
		}
		return nil
	}
	if m.msg == nil { // spilled
		return p.ackSpilled(ctx, m.Seq)
	}
	if err := m.msg.DoubleAck(ctx); err != nil {
		return fmt.Errorf("fleet: ack partition %d seq %d: %w", p.id, m.Seq, unavailable(err))
	}
	p.forget(m.Seq)
	return nil
}

// floorLocked is the sequence below which every message of the partition
// was handed out and acknowledged: the oldest undone, or the one after the
// last handed out.
func (p *Partition) floorLocked() uint64 {
	if len(p.undone) > 0 {
		return p.undone[0]
	}
	return p.last + 1
}

// forget drops seq from the handed-out messages.
func (p *Partition) forget(seq uint64) {
	p.mu.Lock()
	if _, ok := p.out[seq]; ok {
		delete(p.out, seq)
		p.f.m.held.Add(-1)
	} else if _, ok := p.spilled[seq]; ok {
		delete(p.spilled, seq)
		p.f.m.held.Add(-1)
	}
	p.mu.Unlock()
}

// Nak gives m back to be read again after delay (zero: at once). Next will
// return it after messages read meanwhile, so use it only for messages
// whose keys the caller holds back itself (e.g. a lane stopped by a fatal
// answer); a paused key's message is simply kept (and kept alive) instead.
// m stays undone (nothing is removed past it) until it is acknowledged.
func (p *Partition) Nak(m *Message, delay time.Duration) error {
	if m.msg == nil {
		return fmt.Errorf("fleet: nak partition %d seq %d: spilled", p.id, m.Seq)
	}
	p.forget(m.Seq)
	var err error
	if delay > 0 {
		err = m.msg.NakWithDelay(delay)
	} else {
		err = m.msg.Nak()
	}
	if err != nil {
		return fmt.Errorf("fleet: nak partition %d seq %d: %w", p.id, m.Seq, unavailable(err))
	}
	return nil
}

// Held is the number of messages handed out and not yet acknowledged.
func (p *Partition) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.out) + len(p.spilled)
}
