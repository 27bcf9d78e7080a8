package spool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"

	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
)

// Backend is the spool behind the storage seam: a queue is a lane.
type Backend struct {
	sp  *Spool
	log *zap.Logger
}

var (
	_ storage.Backend    = (*Backend)(nil)
	_ storage.DeadWriter = (*Spool)(nil)
)

// NewBackend adapts sp; log (nil: no-op) gets the errors of deliver
// functions. Close closes sp.
func NewBackend(sp *Spool, log *zap.Logger) *Backend {
	if log == nil {
		log = zap.NewNop()
	}
	return &Backend{sp: sp, log: log}
}

// Spool is the adapted spool (for what the seam does not cover: lane
// statistics, the upstream guard, Refusing).
func (l *Backend) Spool() *Spool { return l.sp }

// Append writes req's batch as one chunk of its lane, taking the batch's
// memory over (no copy). A refusal for space (ErrFull, ErrDiskLow, a
// write that found the filesystem full: nothing of it is replayed) also
// matches storage.ErrFull; another failed write also matches
// storage.ErrUnavailable; the spool's error stays in the chain (errors.Is(err,
// ErrTooManyLanes) holds).
func (l *Backend) Append(ctx context.Context, req storage.Request) error {
	if req.Batch == nil || req.Batch.Bytes() == 0 {
		return nil
	}
	lane, err := l.lane(ctx, &req)
	if err != nil {
		return fmt.Errorf("storage: lane: %w", err)
	}
	err = l.sp.Append(ctx, lane, req.Batch)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrFull), errors.Is(err, ErrDiskLow),
		errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%w: %w", storage.ErrFull, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	default:
		return fmt.Errorf("%w: %w", storage.ErrUnavailable, err)
	}
}

// lane returns req's lane: the spool finds a live one from the request's
// bytes without allocating (and without a cache here, which would keep
// retired lanes).
func (l *Backend) lane(ctx context.Context, req *storage.Request) (*Lane, error) {
	return l.sp.LaneBytes(ctx, req.Kind, req.APIKey, req.Options)
}

// Run calls deliver for every lane, and for every lane created later,
// until ctx ends; it returns after every deliver returned. A deliver that
// returns before ctx ends (its error logged) leaves its lane unread until
// the next Run: the engine's loop is to return only when ctx ends or Next
// fails with storage.ErrLost (the spool closed).
func (l *Backend) Run(ctx context.Context, deliver storage.DeliverFunc) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	started := make(map[uint64]bool)
	for {
		lanes, changed := l.sp.LanesFrom(0)
		for _, lane := range lanes {
			if started[lane.ID()] {
				continue
			}
			started[lane.ID()] = true
			r := &laneReader{sp: l.sp, lane: lane, key: lane.Key(), bufs: make(map[uint64]storage.Buffer)}
			wg.Go(func() {
				if err := deliver(ctx, r); err != nil && ctx.Err() == nil {
					l.log.Error("deliver lane", zap.String("lane", lane.Key().Label()), zap.Error(err))
				}
			})
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// laneReader reads one lane a chunk at a time; the chunk's buffer is
// released on Ack.
type laneReader struct {
	sp   *Spool
	lane *Lane
	key  storage.LaneKey

	mu   sync.Mutex
	bufs map[uint64]storage.Buffer // read, not acknowledged
}

func (r *laneReader) Next(ctx context.Context) (*storage.Message, error) {
	chunks, err := r.lane.Next(ctx, 0)
	if err != nil {
		if errors.Is(err, ErrClosed) {
			return nil, fmt.Errorf("%w: %w", storage.ErrLost, err)
		}
		return nil, err
	}
	c := chunks[0]
	r.mu.Lock()
	r.bufs[c.Seq] = c.Buffer
	r.mu.Unlock()
	return &storage.Message{Seq: c.Seq, Lane: r.key, Accepted: c.Accepted, Records: c.Records}, nil
}

func (r *laneReader) Ack(_ context.Context, m *storage.Message) error {
	r.sp.Ack(r.lane, m.Seq)
	r.mu.Lock()
	b, ok := r.bufs[m.Seq]
	delete(r.bufs, m.Seq)
	r.mu.Unlock()
	if ok {
		b.Release()
	}
	return nil
}

// PutDead commits dead letters (see Spool.PutDead).
func (l *Backend) PutDead(ctx context.Context, dls []storage.DeadLetter) error {
	return l.sp.PutDead(ctx, dls)
}

// ListDead lists dead letters (see Spool.ListDead); limit <= 0 means
// no limit.
func (l *Backend) ListDead(ctx context.Context, f storage.DeadFilter, after uint64, limit int) ([]storage.DeadLetter, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return l.sp.ListDead(f, after, limit)
}

// DeleteDead removes dead letters (see Spool.DeleteDead).
func (l *Backend) DeleteDead(ctx context.Context, ids []uint64) error {
	return l.sp.DeleteDead(ctx, ids)
}

// Close closes the
func (l *Backend) Close() error { return l.sp.Close() }

// DeadCount is the number of dead letters (Spool.DeadCount: counted
// as the store holds them, so never fewer than a list read before it).
func (l *Backend) DeadCount(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return l.sp.DeadCount()
}
