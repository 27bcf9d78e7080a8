package fleet

import (
	"context"
	"time"

	"github.com/svcrelay/relay/internal/spool"
)

// The seam between the delivery engine and ingest on one side and a spool
// on the other, as the fleet backend implements it. By the house rule the
// engine declares these interfaces where it uses them (issue 21's storage
// seam); they are written here so that the fleet side of that contract is
// checked by the compiler and readable in one place.

// Appender is what the ingest needs: a request's records, durable as a
// whole before Append returns (ErrFull and ErrUnavailable mean 503).
type Appender interface {
	Append(ctx context.Context, req Request) error
}

// Owner is what the delivery engine needs to be handed the partitions this
// relay delivers: deliver runs once per owned partition, its context ending
// with ownership.
type Owner interface {
	Run(ctx context.Context, deliver DeliverFunc) error
}

// Reader is one owned partition as the engine's reader uses it: messages in
// stream order; Ack after the upstream's 200 or committed dead letters.
type Reader interface {
	Next(ctx context.Context) (*Message, error)
	Ack(ctx context.Context, m *Message) error
	Nak(m *Message, delay time.Duration) error
}

// DeadLetters is the dead-letter store, shared by the fleet.
type DeadLetters interface {
	PutDead(ctx context.Context, dls []spool.DeadLetter) error
	ListDead(ctx context.Context, f spool.DeadFilter, after uint64, limit int) ([]spool.DeadLetter, error)
	DeleteDead(ctx context.Context, ids []uint64) error
}

// Pauser holds keys (devices, users, pacing slots) on every relay.
type Pauser interface {
	Pause(ctx context.Context, key []byte, until time.Time) error
	PausedUntil(key []byte) (time.Time, bool)
}

var (
	_ Appender    = (*Fleet)(nil)
	_ Owner       = (*Fleet)(nil)
	_ DeadLetters = (*Fleet)(nil)
	_ Pauser      = (*Fleet)(nil)
	_ Reader      = (*Partition)(nil)
)
