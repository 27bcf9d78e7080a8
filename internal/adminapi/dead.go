package adminapi

import (
	"context"
	"fmt"
	"iter"
	"strconv"
	"time"

	"github.com/svcrelay/relay/internal/storage"
)

// The dead-letter routes' calls into RelayConfig.Store: the same in local
// and in fleet mode.

// storeCallTimeout bounds one call to the store.
const storeCallTimeout = 30 * time.Second

// deadLetters yields the dead letters matching f with after < ID <= upto,
// by ID, reading the store n at a time, each read bounded in time and by
// Close; a read's error is yielded last. It is the routes' only way through
// the store's dead letters.
func (a *Relay) deadLetters(f storage.DeadFilter, after, upto uint64, n int) iter.Seq2[storage.DeadLetter, error] {
	return func(yield func(storage.DeadLetter, error) bool) {
		for after < upto {
			ctx, cancel := context.WithTimeout(a.stopCtx, storeCallTimeout)
			page, err := a.cfg.Store.ListDead(ctx, f, after, n)
			cancel()
			if err != nil {
				yield(storage.DeadLetter{}, err)
				return
			}
			for _, d := range page {
				if d.ID > upto || !yield(d, nil) {
					return
				}
				after = d.ID
			}
			if len(page) < n {
				return // the store's end
			}
		}
	}
}

// deadTotal is the number of dead letters in the store; -1 when it cannot
// say.
func (a *Relay) deadTotal() int64 {
	c, ok := a.cfg.Store.(interface {
		DeadCount(ctx context.Context) (int64, error)
	})
	if !ok {
		return -1
	}
	ctx, cancel := context.WithTimeout(a.stopCtx, storeCallTimeout)
	defer cancel()
	n, err := c.DeadCount(ctx)
	if err != nil {
		return -1
	}
	return n
}

// replayLane appends dls's records to lane k, in requests of at most
// replayChunkCount records (and about replayChunkBytes), deleting each
// request's dead letters once it is stored. A request's id is made of its
// dead letters' ids, so a replay retried (or run by two relays at once)
// within the fleet's deduplication window is stored once.
func (a *Relay) replayLane(ctx context.Context, k storage.LaneKey, dls []storage.DeadLetter, counts map[string]*laneCount, out *replayJSON) error {
	label := k.Label()
	for len(dls) > 0 {
		n, size := 0, 0
		for n < len(dls) && n < replayChunkCount && (n == 0 || size < replayChunkBytes) {
			size += len(dls[n].Record.Data)
			n++
		}
		var b storage.Batch
		ids := make([]uint64, n)
		for i := range n {
			b.Add(dls[i].Record)
			ids[i] = dls[i].ID
		}
		req := storage.Request{
			ID:   "replay-" + strconv.FormatUint(ids[0], 10) + "-" + strconv.FormatUint(ids[n-1], 10) + "-" + strconv.Itoa(n),
			Kind: k.Kind, APIKey: []byte(k.APIKey), Options: []byte(k.Options), Batch: &b,
		}
		if err := a.cfg.Store.Append(ctx, req); err != nil {
			return fmt.Errorf("append to lane %s: %w", label, err)
		}
		// The records are stored: now the dead letters must go, even if
		// the call is being stopped (a context of its own). A crash between
		// the two leaves both (a later replay would send the record twice;
		// the upstream dedups events by insert_id).
		dctx, dcancel := context.WithTimeout(context.Background(), storeCallTimeout)
		err := a.cfg.Store.DeleteDead(dctx, ids)
		dcancel()
		if err != nil {
			return fmt.Errorf("delete replayed dead letters: %w", err)
		}
		c := counts[label]
		if c == nil {
			c = &laneCount{Lane: label, Kind: k.Kind.String()}
			counts[label] = c
		}
		c.Records += n
		out.Replayed += n
		a.replayed.Add(float64(n))
		dls = dls[n:]
	}
	return nil
}
