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

// AtLeast returns the next wait when the upstream asked for retryAfter:
// the longer of the backoff and retryAfter clamped to clamp. The events
// pipeline waits so (a Retry-After never shortens its backoff).
func (r *Retry) AtLeast(retryAfter, clamp time.Duration) time.Duration {
	return max(r.Next(), ClampRetryAfter(retryAfter, clamp))
}

// Honour returns the next wait when the upstream asked for retryAfter:
// retryAfter clamped to clamp when the answer had one, else the backoff
// (which advances either way). Group identify and user mappings wait so.
func (r *Retry) Honour(retryAfter, clamp time.Duration) time.Duration {
	d := r.Next()
	if retryAfter > 0 {
		return ClampRetryAfter(retryAfter, clamp)
	}
	return d
}

// ClampRetryAfter is retryAfter bounded to [0, clamp].
func ClampRetryAfter(retryAfter, clamp time.Duration) time.Duration {
	return max(0, min(retryAfter, clamp))
}

// Sleep waits d or until ctx ends; it reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
