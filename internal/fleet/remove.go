package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Removal by purge. In a work-queue stream an acknowledged message is
// removed by a proposal of the stream's leader to the stream's Raft group:
// one Raft entry (a log write, and under sync_interval always an fsync, on
// every node) per message. The owner of a partition removes what it is done
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
// The purges of a partition are group committed as the publishes are: one
// in flight at a time; the acknowledgements that arrive meanwhile share
// the next one. An acknowledgement returns once a purge at or above its
// message's sequence was confirmed. A message acknowledged while an older
// one is still held (a paused key's) cannot be purged yet: it is
// acknowledged to the consumer as before (which removes it and frees its
// place in MaxAckPending).
//
// A purge after ownership ended (the relay stopped past its lease) is
// harmless: it removes only messages this owner delivered and acknowledged;
// the next owner may have them in flight too, and its own purge of them
// finds them gone. The layout on the streams is unchanged: a relay of
// before, which acknowledges every message, and this one may own a kind's
// partitions at once (a rolling upgrade), each removing what it is done
// with.
type remover struct {
	mu   sync.Mutex
	want uint64 // the highest floor asked for
	done uint64 // the highest floor confirmed
	busy bool   // a purge in flight
	wake chan struct{}
}

// removeBelow returns once the partition's messages below need are removed: it
// asks for a purge below floor (>= need), or waits for the one in flight
// when that or a later one covers it.
func (p *Partition) removeBelow(ctx context.Context, floor, need uint64) error {
	r := &p.rm
	r.mu.Lock()
	r.want = max(r.want, floor)
	for {
		if r.done >= need {
			r.mu.Unlock()
			return nil
		}
		if r.wake == nil {
			r.wake = make(chan struct{})
		}
		if !r.busy {
			r.busy = true
			k := r.want
			r.mu.Unlock()
			err := p.purge(ctx, k)
			r.mu.Lock()
			r.busy = false
			if err == nil {
				r.done = max(r.done, k)
			}
			close(r.wake)
			r.wake = nil
			if err != nil {
				r.mu.Unlock()
				return err
			}
			continue
		}
		w := r.wake
		r.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			return fmt.Errorf("fleet: remove partition %d below %d: %w", p.id, need, unavailable(ctx.Err()))
		}
		r.mu.Lock()
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
