package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// Removal by purge. A message leaves a limits stream only when removed,
// and each removal is a proposal of the stream's leader to the stream's
// Raft group: one Raft entry (a log write, and under sync_interval always
// an fsync, on every node), which a work queue paid for every
// acknowledged message. The owner of a partition removes what it is done
// with by a purge of the partition's subject below a floor instead: the
// oldest message handed out and not acknowledged, or the one after the last
// handed out (Partition.floorLocked). Every message of the subject below the
// floor was handed out to this owner, in stream order, and acknowledged by
// it (the consumer delivers the subject in order from its first message,
// and Next hands out nothing after a missed delivery), so the purge removes
// nothing undelivered; one purge, one Raft entry, removes every message
// acknowledged since the last one, and clears them from the consumer's
// pending acknowledgements too (the server does so on a purge).
//
// The purges of a partition are group committed: one in flight at a time,
// in a goroutine of the partition's (close waits for it), at most one
// every removeEvery; the acknowledgements that arrive meanwhile share the
// next one. The delivery
// engine acknowledges a partition's messages one after the other, each
// waiting for the last, so an acknowledgement at the floor returns once its
// removal is asked for, not done: as with the local spool, whose
// acknowledgements reach its file with the next checkpoint, a relay killed
// before the purge leaves those messages to be read again by the next
// owner (the upstream drops the copies by insert_id); nothing is lost. A
// message acknowledged while an older one is still held (a paused key's)
// cannot be purged yet: the reader's acknowledgement (ackLater) leaves it
// to a later purge for a removal round (removeLater), Ack and what that
// purge did not reach are deleted alone (deleteAcked; the server takes
// that as its acknowledgement to the consumer), or in a work-queue stream
// of before acknowledged to the consumer, which deletes it.
//
// A purge after ownership ended (the relay stopped past its lease) is
// harmless: it removes only messages this owner delivered and acknowledged;
// the next owner may have them in flight too, and its own purge of them
// finds them gone. On a work-queue stream of before, a relay of before
// (which removes by purge too, or acknowledges every message) and this one
// may own a kind's partitions at once (a rolling upgrade), each removing
// what it is done with.
type remover struct {
	mu   sync.Mutex
	want uint64        // the highest floor asked for
	done uint64        // the highest floor confirmed
	busy chan struct{} // while a removal goroutine runs; closed when it returns
	shut bool          // the partition closed: no removal starts
	// late are messages acknowledged above the floor and left to the
	// purge (removeLater), each with the removal round it was left in.
	late  []lateAck
	round uint64 // removal rounds begun
}

type lateAck struct{ seq, round uint64 }

// removeLater leaves seq, acknowledged above the floor, to the removal
// goroutine: the purge removes it once the floor passes it; when it has
// not after a whole round (removeEvery), or the partition is closing, it
// is deleted alone (deleteAcked), long before the consumer could deliver
// it again (AckWait after its last keep-alive). False when the partition
// closed: the caller deletes it.
func (p *Partition) removeLater(seq uint64) bool {
	r := &p.rm
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shut {
		return false
	}
	r.late = append(r.late, lateAck{seq, r.round})
	if r.busy == nil {
		r.busy = make(chan struct{})
		go p.removing(r.busy)
	}
	return true
}

// removeBelow asks for the partition's messages below floor to be removed,
// starting the removal goroutine unless it runs (or the partition closed:
// what stays is read again by the next owner).
func (p *Partition) removeBelow(floor uint64) {
	r := &p.rm
	r.mu.Lock()
	defer r.mu.Unlock()
	r.want = max(r.want, floor)
	if r.busy != nil || r.shut || r.done >= r.want {
		return
	}
	r.busy = make(chan struct{})
	go p.removing(r.busy)
}

// removeEvery is the least time between two purges of a partition: each
// is a Raft entry (and, under sync_interval always, an fsync) on every
// node, and a loaded partition's acknowledgements would otherwise start
// one per round trip. At 100 ms the purges of three loaded partitions
// were about one Raft entry of the events stream in eight; at 500 ms the
// stream's entries per request fell by that much. A relay killed
// meanwhile leaves at most that much more of what it acknowledged to be
// read, and delivered again under the same insert_ids, by the next
// owner; a partition given up is purged at once.
const removeEvery = 500 * time.Millisecond

// removing purges below the floor asked for until it is reached. On a
// failure it gives up: the next acknowledgement asks again, and what stays
// is read again by the next owner.
func (p *Partition) removing(busy chan struct{}) {
	defer close(busy)
	r := &p.rm
	for {
		r.mu.Lock()
		k := r.want
		if r.done >= k && len(r.late) == 0 {
			r.busy = nil
			r.mu.Unlock()
			return
		}
		purge := r.done < k
		r.round++
		r.mu.Unlock()
		var err error
		if purge {
			ctx, cancel := context.WithTimeout(context.Background(), p.f.cfg.PublishTimeout)
			err = p.purge(ctx, k)
			cancel()
		}
		// The late acknowledgements the purges have not removed: all of
		// them after a failed purge (the goroutine ends, and nothing may
		// be left for the consumer to deliver again) or once closing,
		// otherwise those left a whole round ago.
		closing := false
		select {
		case <-p.stopKeep:
			closing = true
		default:
		}
		r.mu.Lock()
		if err == nil {
			r.done = max(r.done, k)
		}
		var due []uint64
		keep := r.late[:0]
		for _, l := range r.late {
			switch {
			case l.seq < r.done:
			case err != nil || closing || l.round+1 < r.round:
				due = append(due, l.seq)
			default:
				keep = append(keep, l)
			}
		}
		clear(r.late[len(keep):])
		r.late = keep
		r.mu.Unlock()
		for _, seq := range due {
			ctx, cancel := context.WithTimeout(context.Background(), p.f.cfg.PublishTimeout)
			p.deleteAcked(ctx, seq)
			cancel()
		}
		if err != nil {
			// Late acknowledgements left meanwhile wait for the next
			// removal, or the keep-alive's kick (kickLate).
			r.mu.Lock()
			r.busy = nil
			r.mu.Unlock()
			p.log.Warn("remove acknowledged messages: they stay until the next removal, or are read again by the next owner", zap.Uint64("below", k), zap.Error(err))
			return
		}
		// Paced: the acknowledgements of the next removeEvery share one
		// purge (until the partition closes, which removes at once).
		t := time.NewTimer(removeEvery)
		select {
		case <-t.C:
		case <-p.stopKeep:
			t.Stop()
		}
	}
}

// kickLate starts the removal goroutine when late acknowledgements wait
// and it does not run (it ended on a failed purge).
func (p *Partition) kickLate() {
	r := &p.rm
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.late) > 0 && r.busy == nil && !r.shut {
		r.busy = make(chan struct{})
		go p.removing(r.busy)
	}
}

// removed waits for the removal goroutine (each purge bounded by
// PublishTimeout); shut, no other starts after it.
func (p *Partition) removed(shut bool) {
	p.rm.mu.Lock()
	busy := p.rm.busy
	p.rm.shut = p.rm.shut || shut
	p.rm.mu.Unlock()
	if busy != nil {
		<-busy
	}
}

// purgeAnswer is JetStream's answer to a stream purge.
type purgeAnswer struct {
	Success bool                `json:"success"`
	Purged  uint64              `json:"purged"`
	Error   *jetstream.APIError `json:"error"`
}

// purge removes the partition's messages below seq (a purge of its
// subject, "seq": keep seq and after), asked again while unanswered.
func (p *Partition) purge(ctx context.Context, seq uint64) error {
	f := p.f
	stream := f.n.streamOf(p.kind, p.id)
	body, err := json.Marshal(struct {
		Filter string `json:"filter"`
		Seq    uint64 `json:"seq"`
	}{f.n.subject(p.kind, p.id), seq})
	if err != nil {
		return err
	}
	_, err = asked(ctx, f, func(ctx context.Context) (struct{}, error) {
		resp, err := f.nc.RequestWithContext(ctx, "$JS.API.STREAM.PURGE."+stream, body)
		if err != nil {
			return struct{}{}, err
		}
		var a purgeAnswer
		if err := json.Unmarshal(resp.Data, &a); err != nil {
			return struct{}{}, fmt.Errorf("jetstream: unreadable purge answer: %w", err)
		}
		if a.Error != nil {
			return struct{}{}, a.Error
		}
		if !a.Success {
			return struct{}{}, fmt.Errorf("jetstream: purge not done")
		}
		return struct{}{}, nil
	})
	if err != nil {
		return fmt.Errorf("fleet: remove partition %d below seq %d: %w", p.id, seq, unavailable(err))
	}
	return nil
}

// deleteAcked removes seq, acknowledged above the floor (an older message
// is still held), from a limits stream, where an acknowledgement removes
// nothing (a work queue's does): one stream Raft entry, as the work queue
// paid for every acknowledgement, paid here only for messages acknowledged
// while an older one is held (a paused key's, a stopped lane's, one whose
// request is still in flight), so that the stream still holds exactly the
// backlog that MaxBytes bounds and the lanes API reports. The server takes
// the deletion as the message's acknowledgement to the consumer. On a failure the message stays until the floor
// passes it (the purge removes it then) or is read again by the next
// owner; nothing is lost either way.
func (p *Partition) deleteAcked(ctx context.Context, seq uint64) {
	if !p.limits {
		return
	}
	f := p.f
	stream := f.n.streamOf(p.kind, p.id)
	body, err := json.Marshal(struct {
		Seq     uint64 `json:"seq"`
		NoErase bool   `json:"no_erase"`
	}{seq, true})
	if err != nil {
		return
	}
	// One attempt: the Ack waits for it, and what it fails to remove the
	// purge removes later; retried, a closed connection would hold the
	// Ack (and the partition's close) for its caller's whole context.
	actx, cancel := f.attemptCtx(ctx)
	defer cancel()
	resp, err := f.nc.RequestWithContext(actx, "$JS.API.STREAM.MSG.DELETE."+stream, body)
	if err == nil {
		var a purgeAnswer
		if err = json.Unmarshal(resp.Data, &a); err != nil {
			err = fmt.Errorf("jetstream: unreadable delete answer: %w", err)
		} else if a.Error != nil && a.Error.ErrorCode != jetstream.JSErrCodeMessageNotFound {
			err = a.Error
		}
	}
	if err != nil {
		p.log.Warn("delete acknowledged message: it stays until the floor passes it", zap.Uint64("seq", seq), zap.Error(err))
	}
}
