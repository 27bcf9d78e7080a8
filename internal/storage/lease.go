package storage

import (
	"context"
	"time"
)

type leaseKey struct{}

// WithLease returns ctx carrying held, which says, by the clock, whether
// the store still lets the holder of a queue deliver it (the fleet: the
// partition's lease has not run out). A sender asks Leased right before
// each request: the context's own cancellation runs on a timer, and a
// process stopped (SIGSTOP, a paused VM) past its lease and resumed runs
// the goroutines its expired timers woke, a shard's flush among them,
// before that cancellation.
func WithLease(ctx context.Context, held func() bool) context.Context {
	return context.WithValue(ctx, leaseKey{}, held)
}

// LeaseRecheck is how long a sender that found its lease run out waits
// before it looks again, when its context was not cancelled meanwhile (a
// renewal in flight extended the lease).
const LeaseRecheck = 10 * time.Millisecond

// Leased reports whether ctx's lease, if it carries one, is still held.
func Leased(ctx context.Context) bool {
	held, _ := ctx.Value(leaseKey{}).(func() bool)
	return held == nil || held()
}
