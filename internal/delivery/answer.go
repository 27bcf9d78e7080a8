package delivery

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/svcrelay/relay/internal/upstream"
)

// outcome is what an upstream answer means for the records of the request
// it answered.
type outcome uint8

const (
	// delivered: the upstream took every record (200); they are done.
	delivered outcome = iota
	// resend: the records verdict.dead names are dead letters and the
	// others are sent again at once (those of keys the answer paused are
	// held by the next build).
	resend
	// split: the request was refused as a whole (a 400 naming no record, a
	// 413): a lone record is a dead letter with verdict.reason; more are
	// sent again in halves (order kept), so the bad one ends up alone.
	split
	// wait: nothing was taken and nothing named in the answer is in the
	// request: send the records again after the retry wait, at least
	// verdict.wait.
	wait
	// stop: the upstream refuses the lane itself (its api_key, the URL or
	// credentials): the lane stops with verdict.reason until resumed.
	stop
)

// Reasons of dead letters and lane stops the answer rule gives.
const (
	reasonBadRequest    = "bad_request"
	reasonTooLarge      = "too_large"
	reasonSilenced      = "silenced"
	reasonInvalidAPIKey = "invalid API key"
	reasonExpired       = "expired" // not delivered from max age on
)

// Key prefixes of event.Event.OrderKey.
const (
	devicePrefix = "d:"
	userPrefix   = "u:"
)

// verdict is a decided answer.
type verdict struct {
	outcome outcome
	// reason is the dead-letter reason of a lone record (split) or why the
	// lane stops (stop).
	reason string
	// dead maps the index of a record of the request to its dead-letter
	// reason (resend).
	dead map[int]string
	// pause are the keys to pause for ThrottlePause, quota those to pause
	// until the next UTC midnight; any outcome may carry them.
	pause, quota []string
	// wait is the least wait before the records are sent again: a clamped
	// Retry-After, or a form kind's ThrottleWait after a 429 without one.
	wait time.Duration
}

// decide is the answer rule of every kind (the contract's Delivery
// section): what res, the answer to a request of batch, means for its
// records. 200 delivers. A 400 naming invalid records by index
// dead-letters them; any other 400 or a 413 splits. A 429 or a 400 naming
// silenced or throttled devices, users or events pauses them (events; a
// device over its daily quota until midnight, silenced events and devices
// are dead letters), and waits when none of them is in the request; a
// form request names no key, so there a 429 waits and a silenced answer is
// a 400 like any other. An invalid API key, or an answer saying the URL or
// credentials are wrong, stops the lane. The rest waits. A 200 allocates
// nothing.
func (p *Pipeline) decide(res *upstream.Result, batch []item) verdict {
	n := len(batch)
	clamped := min(res.RetryAfter, p.cfg.MaxRetryAfter)
	switch res.Kind {
	case upstream.OK:
		return verdict{outcome: delivered}
	case upstream.Throttled, upstream.Silenced:
		if p.form != nil {
			if res.Kind == upstream.Silenced {
				return verdict{outcome: split, reason: reasonBadRequest}
			}
			if res.RetryAfter <= 0 {
				clamped = p.form.ThrottleWait
			}
			return verdict{outcome: wait, wait: clamped}
		}
		return throttled(res, batch, clamped)
	case upstream.Invalid:
		var dead map[int]string
		for i, r := range res.InvalidEvents {
			if i >= 0 && i < n {
				if dead == nil {
					dead = make(map[int]string, len(res.InvalidEvents))
				}
				dead[i] = r
			}
		}
		if dead != nil {
			return verdict{outcome: resend, dead: dead}
		}
		return verdict{outcome: split, reason: reasonBadRequest}
	case upstream.BadRequest:
		return verdict{outcome: split, reason: reasonBadRequest}
	case upstream.TooLarge:
		return verdict{outcome: split, reason: reasonTooLarge}
	case upstream.InvalidAPIKey:
		return verdict{outcome: stop, reason: reasonInvalidAPIKey}
	case upstream.Fatal:
		return verdict{outcome: stop, reason: "upstream answered " + string(res.Answer)}
	default: // Retryable
		return verdict{outcome: wait, wait: clamped}
	}
}

// throttled is decide for an events request answered 429 or silenced:
// silenced events and devices are dead letters; the devices and users the
// answer names are paused (its event indexes only when it names none),
// devices over their daily quota until midnight; the rest is sent again at
// once when any of them is in the request (the next build holds it), else
// after the wait.
func throttled(res *upstream.Result, batch []item, clamped time.Duration) verdict {
	n := len(batch)
	v := verdict{outcome: wait, wait: clamped, dead: map[int]string{}}
	if res.Kind == upstream.Silenced {
		for _, i := range res.SilencedEvents {
			if i >= 0 && i < n {
				v.dead[i] = reasonSilenced
			}
		}
		if len(res.SilencedDevices) > 0 {
			set := make(map[string]bool, len(res.SilencedDevices))
			for _, k := range prefixed(devicePrefix, res.SilencedDevices) {
				set[k] = true
			}
			for i := range batch {
				if set[string(batch[i].rec.OrderKey)] {
					v.dead[i] = reasonSilenced
				}
			}
		}
		v.quota = prefixed(devicePrefix, res.QuotaDevices)
	}
	v.pause = append(prefixed(devicePrefix, res.ThrottledDevices), prefixed(userPrefix, res.ThrottledUsers)...)
	if len(v.pause) == 0 {
		for _, i := range res.ThrottledEvents {
			if _, dead := v.dead[i]; !dead && i >= 0 && i < n {
				v.pause = append(v.pause, string(batch[i].rec.OrderKey))
			}
		}
	}
	named := make(map[string]bool, len(v.pause)+len(v.quota))
	for _, k := range append(v.quota, v.pause...) {
		named[k] = true
	}
	progress := len(v.dead) > 0
	for i := 0; i < n && !progress; i++ {
		r := &batch[i].rec
		progress = named[string(r.OrderKey)] || len(r.UserID) > 0 && named[userPrefix+string(r.UserID)]
	}
	if progress {
		v.outcome = resend
	}
	return v
}

func prefixed(prefix string, ids []string) []string {
	if len(ids) == 0 {
		return nil
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = prefix + id
	}
	return out
}

// Retry is the retry policy of every lane kind: exponential backoff
// (backoff/v4, factor 2, jitter ±50%, capped, never giving up: a record's
// max age bounds the retries). It is not safe for concurrent use.
type Retry struct {
	bo  *backoff.ExponentialBackOff
	max time.Duration
}

// NewRetry returns a Retry whose waits start near initial and grow to most
// (at least initial).
func NewRetry(initial, most time.Duration) *Retry {
	most = max(most, initial)
	return &Retry{max: most, bo: backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(initial),
		backoff.WithMaxInterval(most),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.5),
		backoff.WithMaxElapsedTime(0),
	)}
}

// Next returns the next backoff wait (at most max) and advances it.
func (r *Retry) Next() time.Duration { return min(r.bo.NextBackOff(), r.max) }

// Reset starts the backoff again (after a success).
func (r *Retry) Reset() { r.bo.Reset() }

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
