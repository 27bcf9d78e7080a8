package batcher

import (
	"context"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// source is what a lane runner's reader reads: a spool lane (localSource)
// or, in fleet mode, the lane's messages of one partition (feed). The
// reader has the only caller of Wait and NextPart; Ack is called from the
// shards.
type source interface {
	// Wait returns nil when there may be something to read, ctx.Err()
	// when ctx ends, and an error wrapping spool.ErrRetired when the
	// source is gone for good (empty and idle): the runner then ends and
	// is forgotten. onIdle is called before a long wait; a spool lane
	// calls it every second of waiting and, when it returns true, returns
	// spool.ErrIdle (the runner ends until the lane has work: OnWork).
	Wait(ctx context.Context, onIdle func() bool) error
	// NextPart reads up to maxBytes (at least one record), as
	// spool.Lane.NextPart; with a done ctx it returns at once when there is
	// nothing to read.
	NextPart(ctx context.Context, maxBytes int, recs []storage.Record) ([]spool.Chunk, []storage.Record, error)
	// Ack says every record of the chunk seq is delivered or a committed
	// dead letter.
	Ack(seq uint64)
}

// DeadWriter stores dead letters durably (the local spool, the fleet's
// dead-letter stream): storage.DeadWriter, as the batcher uses it.
type DeadWriter interface {
	PutDead(ctx context.Context, dls []storage.DeadLetter) error
}

// localSource is a spool lane.
type localSource struct {
	sp *spool.Spool
	l  *spool.Lane
}

func (s localSource) Wait(ctx context.Context, onIdle func() bool) error {
	return s.l.Wait(ctx, onIdle)
}

func (s localSource) NextPart(ctx context.Context, maxBytes int, recs []storage.Record) ([]spool.Chunk, []storage.Record, error) {
	return s.l.NextPart(ctx, maxBytes, recs)
}

func (s localSource) Ack(seq uint64) { s.sp.Ack(s.l, seq) }
