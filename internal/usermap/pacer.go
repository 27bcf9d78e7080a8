package usermap

import (
	"context"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/svcrelay/relay/internal/ratelimit"
)

// pacer is the delivery.Pacer of mapping calls: a ratelimit.Limiter keyed
// by organization whose calls wait for their turn however long it is (the
// lane runner only expects an error when its context ends).
type pacer struct {
	lim    *ratelimit.Limiter
	keyOf  func(apiKey string) string
	waited prometheus.Counter // may be nil
}

// newPacer returns a pacer of limit calls per window; keyOf maps an api_key
// to its organization key.
func newPacer(limit int, window time.Duration, keyOf func(string) string, waited prometheus.Counter) (*pacer, error) {
	lim, err := ratelimit.New(ratelimit.Config{Name: "usermap", Limit: limit, Window: window,
		MaxWait: 100 * 365 * 24 * time.Hour, MaxWaiting: math.MaxInt}, nil)
	if err != nil {
		return nil, err
	}
	return &pacer{lim: lim, keyOf: keyOf, waited: waited}, nil
}

// Acquire blocks until n calls of apiKey's organization fit the window and
// admits them; release must be called when the answer arrived (or the
// request was abandoned). n above the limit is an error.
func (p *pacer) Acquire(ctx context.Context, apiKey string, n int) (release func(), err error) {
	start := time.Now()
	release, err = p.lim.Acquire(ctx, p.keyOf(apiKey), n)
	if err == nil && p.waited != nil {
		p.waited.Add(time.Since(start).Seconds())
	}
	return release, err
}
