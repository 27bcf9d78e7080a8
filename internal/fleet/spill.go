package fleet

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/svcrelay/relay/internal/storage"
)

// Spilling (delivery's head-of-line guard, see delivery/fleet.go): a
// partition's messages are read in stream order and demultiplexed by lane;
// a lane that cannot take its messages (stopped, or its read-ahead full of
// a paused device's events) must not make the others wait. The engine then
// spills the lane's messages: it drops their bodies and keeps their
// sequences; the messages stay handed out (unacknowledged, kept alive,
// counted against the consumer's MaxAckPending) and are read again by
// sequence from the stream when the lane can take them. A spilled message
// costs its reply subject here (about 100 bytes) and an InProgress every
// AckWait/3.

// spillAckPendingShare is the share of MaxAckPending a partition may spill:
// the rest is for the messages read and not spilled (the read-ahead of
// every lane), so the consumer keeps delivering while a lane is held.
const spillAckPendingShare = 4

// ackAck and ackProgress are the JetStream acknowledgement bodies (the
// client's own, for the messages whose client handle was dropped).
var (
	ackAck      = []byte("+ACK")
	ackProgress = []byte("+WPI")
)

// spill drops the client handle (and with it the body) of the handed-out
// message seq, keeping its reply subject: it stays handed out and kept
// alive. False when seq is not handed out.
func (p *Partition) spill(seq uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, ok := p.out[seq]
	if !ok {
		return false
	}
	if p.spilled == nil {
		p.spilled = make(map[uint64]string)
	}
	p.spilled[seq] = m.Reply()
	delete(p.out, seq) // still held: the held metric is unchanged
	return true
}

// ackSpilled acknowledges the spilled message seq as DoubleAck does: it
// returns once the server confirmed.
func (p *Partition) ackSpilled(ctx context.Context, seq uint64) error {
	p.mu.Lock()
	reply, ok := p.spilled[seq]
	p.mu.Unlock()
	if !ok {
		return fmt.Errorf("fleet: ack partition %d seq %d: not held", p.id, seq)
	}
	if _, err := p.f.nc.RequestWithContext(ctx, reply, ackAck); err != nil {
		return fmt.Errorf("fleet: ack partition %d seq %d: %w", p.id, seq, unavailable(err))
	}
	p.forget(seq)
	return nil
}

// reread reads the spilled message seq again from the stream (asked
// again while unanswered, see asked). The message stays handed out.
func (p *Partition) reread(ctx context.Context, st jetstream.Stream, seq uint64) (*Message, error) {
	if p.ctx.Err() != nil {
		return nil, ErrLost
	}
	raw, err := asked(ctx, p.f, func(ctx context.Context) (*jetstream.RawStreamMsg, error) { return st.GetMsg(ctx, seq) })
	if err != nil {
		if p.ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgNotFound) {
			// Gone from the stream: acknowledged by the next owner.
			return nil, ErrLost
		}
		return nil, fmt.Errorf("fleet: reread partition %d seq %d: %w", p.id, seq, unavailable(err))
	}
	h, recs, err := decode(raw.Data)
	if err != nil {
		// Next decoded it once: not expected.
		return nil, fmt.Errorf("fleet: reread partition %d seq %d: %w", p.id, seq, err)
	}
	return &Message{Partition: p.id, Seq: seq, Lane: h.lane, Accepted: h.accepted, Records: recs}, nil
}

// Spill drops the body of the message seq read from r and not acknowledged:
// it stays read (unacknowledged, kept alive) and Reread reads it again.
func (r *partitionReader) Spill(seq uint64) {
	r.mu.Lock()
	m, ok := r.out[seq]
	if ok {
		m.Records, m.msg = nil, nil
	}
	r.mu.Unlock()
	if ok {
		r.p.spill(seq)
	}
}

// Reread reads the spilled message seq again, whole.
func (r *partitionReader) Reread(ctx context.Context, seq uint64) (*storage.Message, error) {
	r.mu.Lock()
	_, ok := r.out[seq]
	st := r.stream
	r.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("fleet: reread partition %d seq %d: not read from this reader", r.p.id, seq)
	}
	// Until the partition is lost: then the next owner has the message.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(r.p.ctx, cancel)()
	if st == nil {
		var err error
		if st, err = r.p.f.stream(ctx, r.p.f.n.streamOf(r.p.kind, r.p.id)); err != nil {
			if r.p.ctx.Err() != nil {
				return nil, ErrLost
			}
			return nil, fmt.Errorf("fleet: reread partition %d: %w", r.p.id, unavailable(err))
		}
		r.mu.Lock()
		r.stream = st
		r.mu.Unlock()
	}
	m, err := r.p.reread(ctx, st, seq)
	if err != nil {
		return nil, err
	}
	return &storage.Message{Seq: m.Seq, Lane: m.Lane, Accepted: m.Accepted, Records: m.Records}, nil
}

// MaxSpilled is how many messages the engine may spill at once in this
// partition: a quarter of the consumer's MaxAckPending.
func (r *partitionReader) MaxSpilled() int {
	return max(r.p.f.cfg.MaxAckPending/spillAckPendingShare, 1)
}
