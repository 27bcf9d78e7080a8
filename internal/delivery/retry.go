package delivery

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Retry is the retry policy of every lane kind: exponential backoff
// (backoff/v4, factor 2, jitter ±50%, capped, never giving up: a record's
// max age bounds the retries, not a count) and the upstream's Retry-After,
// honoured but clamped. One Retry belongs to one sender (a shard, a lane);
// it is not safe for concurrent use.
type Retry struct {
	bo  *backoff.ExponentialBackOff
	max time.Duration
}

// NewRetry returns a Retry whose waits start near initial and grow to max.
// max below initial is raised to initial.
func NewRetry(initial, max time.Duration) *Retry {
	if max < initial {
		max = initial
	}
	return &Retry{max: max, bo: backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(initial),
		backoff.WithMaxInterval(max),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.5),
		backoff.WithMaxElapsedTime(0),
	)}
}

// Next returns the next backoff wait (at most max) and advances it.
func (r *Retry) Next() time.Duration { return min(r.bo.NextBackOff(), r.max) }

// Reset starts the backoff again (after a success).
func (r *Retry) Reset() { r.bo.Reset() }

// Wait returns the next wait when the upstream asked for retryAfter (zero
// when it did not): the longer of the backoff and retryAfter clamped to
// clamp. Every kind waits so: a Retry-After is honoured (nothing is sent
// before it) but never shortens the backoff, so an upstream answering
// "Retry-After: 1" to every request still sees retries spread out.
func (r *Retry) Wait(retryAfter, clamp time.Duration) time.Duration {
	return max(r.Next(), min(retryAfter, clamp))
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
