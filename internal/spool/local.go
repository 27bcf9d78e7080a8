package spool

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
)

// Backend is the spool behind the storage seam: a queue is a lane. Its
// PutDead, ListDead, DeleteDead and Close are the Spool's.
type Backend struct {
	*Spool
	kinds []storage.Kind // Only's; empty: every kind
}

var _ storage.Backend = (*Backend)(nil)

// NewBackend adapts sp; the spool's logger gets the deliver functions'
// errors.
func NewBackend(sp *Spool) *Backend { return &Backend{Spool: sp} }

// Append writes req's batch as one chunk of its lane, taking its memory
// over. A refusal for space (ErrFull, ErrDiskLow, a full filesystem) also
// matches storage.ErrFull, another failure storage.ErrUnavailable; the
// spool's error stays in the chain.
func (l *Backend) Append(ctx context.Context, req storage.Request) error {
	if req.Batch == nil || req.Batch.Bytes() == 0 {
		return nil
	}
	// No cache here: it would keep retired lanes. Finding a live one
	// allocates nothing.
	lane := findLane(&l.byKey, req.Kind, req.APIKey, req.Options)
	if lane == nil {
		var err error
		if lane, err = l.Lane(ctx, req.Lane()); err != nil {
			return fmt.Errorf("storage: lane: %w", err)
		}
	}
	err := l.Spool.Append(ctx, lane, req.Batch)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrFull), errors.Is(err, ErrDiskLow), noSpace(err):
		return fmt.Errorf("%w: %w", storage.ErrFull, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	default:
		return fmt.Errorf("%w: %w", storage.ErrUnavailable, err)
	}
}

// Only returns a Backend whose Run hands deliver only the lanes of kinds
// (as the fleet's Backend.Only); the rest is shared with b.
func (l *Backend) Only(kinds ...storage.Kind) *Backend {
	o := *l
	o.kinds = kinds
	return &o
}

// Run calls deliver for every lane (of Only's kinds), now and created later,
// until ctx ends, and returns after every deliver returned; each queue is a
// storage.LaneQueue. A deliver that returns storage.ErrIdle is called again
// at the lane's next record; one that returns otherwise (an error is
// logged) leaves its lane unread until the next Run.
func (l *Backend) Run(ctx context.Context, deliver storage.DeliverFunc) error {
	r := &run{b: l, ctx: ctx, deliver: deliver}
	var next uint64 // each wake-up looks only at the lanes created since
	for {
		lanes, changed := l.lanesFrom(next)
		for _, lane := range lanes {
			next = lane.ID() + 1
			if len(l.kinds) == 0 || slices.Contains(l.kinds, lane.Key().Kind) {
				r.start(lane)
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			r.mu.Lock()
			r.stopping = true // nothing starts from now on (whenWork)
			r.mu.Unlock()
			r.wg.Wait()
			return nil
		}
	}
}

// run is one Run's: its deliver goroutines.
type run struct {
	b       *Backend
	ctx     context.Context
	deliver storage.DeliverFunc

	mu       sync.Mutex
	stopping bool
	wg       sync.WaitGroup
}

// start calls deliver for lane in a goroutine, unless the Run is over.
func (r *run) start(lane *Lane) {
	r.mu.Lock()
	if r.stopping {
		r.mu.Unlock()
		return
	}
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		err := r.deliver(r.ctx, laneReader{lane})
		switch {
		case errors.Is(err, storage.ErrIdle):
			lane.whenWork(func() { r.start(lane) })
		case err != nil && r.ctx.Err() == nil && !errors.Is(err, storage.ErrRetired) && !errors.Is(err, storage.ErrLost):
			r.b.Spool.log.Error("deliver lane", zap.String("lane", lane.Key().Label()), zap.Error(err))
		}
	}()
}

// laneReader is one lane as a storage.LaneQueue, read with read-ahead
// through Lane. Next and Ack read a chunk at a time (the conformance
// suite's way): its buffer is left to the garbage collector, not reused.
type laneReader struct{ lane *Lane }

var _ storage.LaneQueue = laneReader{}

func (r laneReader) Lane() storage.QueueLane { return r.lane }

func (r laneReader) Next(ctx context.Context) (*storage.Message, error) {
	chunks, _, err := r.lane.NextPart(ctx, 0, nil) // one whole chunk, its Records fresh
	if err != nil {
		return nil, err // ErrClosed wraps storage.ErrLost
	}
	c := chunks[0]
	return &storage.Message{Seq: c.Seq, Lane: r.lane.key, Accepted: c.Accepted, Records: c.Records}, nil
}

func (r laneReader) Ack(_ context.Context, m *storage.Message) error {
	r.lane.Ack(m.Seq)
	return nil
}

// DeadCount is the number of dead letters as the file holds them now, so
// never fewer than a ListDead before it returned (Stats().Dead follows a
// moment later).
func (l *Backend) DeadCount(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var n int64
	err := l.view(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyDead); len(v) == 16 {
			n = int64(binary.BigEndian.Uint64(v))
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("count dead letters: %w", err)
	}
	return n, nil
}
