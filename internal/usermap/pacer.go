package usermap

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Pacer is a sliding-window limiter of mapping calls per organization,
// shared by the lanes of one organization: within any window of length
// Window, the calls of an organization that may have reached the upstream
// sum to at most Limit.
//
// A call counts from the moment it is admitted until Window after its answer
// arrived (release). The upstream counts a call at its arrival, which lies
// between the two, so no upstream window can see more than Limit even with
// several lanes in flight and varying latency.
type Pacer struct {
	limit  int
	window time.Duration
	keyOf  func(apiKey string) string
	now    func() time.Time
	waited prometheus.Counter // may be nil

	mu   sync.Mutex
	orgs map[string]*orgWindow
}

type call struct {
	n   int
	end time.Time // zero while in flight
}

type orgWindow struct {
	calls   []*call
	changed chan struct{} // closed and replaced when a call ends
}

// NewPacer returns a pacer of limit calls per window; keyOf maps an api_key
// to its organization key; now nil means time.Now.
func NewPacer(limit int, window time.Duration, keyOf func(string) string, now func() time.Time) *Pacer {
	if now == nil {
		now = time.Now
	}
	return &Pacer{limit: limit, window: window, keyOf: keyOf, now: now, orgs: map[string]*orgWindow{}}
}

// Acquire blocks until n calls of apiKey's organization fit the window and
// admits them; release must be called when the answer arrived (or the
// request was abandoned). n above the limit is an error.
func (p *Pacer) Acquire(ctx context.Context, apiKey string, n int) (release func(), err error) {
	if n > p.limit {
		return nil, fmt.Errorf("usermap: %d mappings in one request exceed the rate limit %d", n, p.limit)
	}
	key := p.keyOf(apiKey)
	start := p.now()
	for {
		p.mu.Lock()
		w := p.orgs[key]
		if w == nil {
			w = &orgWindow{changed: make(chan struct{})}
			p.orgs[key] = w
		}
		now := p.now()
		wait, ok := w.admitLocked(now, p.window, p.limit, n)
		if ok {
			c := &call{n: n}
			w.calls = append(w.calls, c)
			p.mu.Unlock()
			if p.waited != nil {
				p.waited.Add(now.Sub(start).Seconds())
			}
			return func() {
				p.mu.Lock()
				c.end = p.now()
				close(w.changed)
				w.changed = make(chan struct{})
				p.mu.Unlock()
			}, nil
		}
		changed := w.changed
		p.mu.Unlock()
		var timer <-chan time.Time
		var t *time.Timer
		if wait > 0 {
			t = time.NewTimer(wait)
			timer = t.C
		}
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-changed:
		case <-timer:
		}
		if t != nil {
			t.Stop()
		}
		if err != nil {
			return nil, err
		}
	}
}

// admitLocked drops calls that ended a window ago and reports whether n more
// fit; if not, wait is how long until enough ended calls leave the window
// (0: wait for an in-flight call to end).
func (w *orgWindow) admitLocked(now time.Time, window time.Duration, limit, n int) (wait time.Duration, ok bool) {
	keep := w.calls[:0]
	sum := 0
	for _, c := range w.calls {
		if !c.end.IsZero() && !c.end.Add(window).After(now) {
			continue
		}
		keep = append(keep, c)
		sum += c.n
	}
	for i := len(keep); i < len(w.calls); i++ {
		w.calls[i] = nil
	}
	w.calls = keep
	if sum+n <= limit {
		return 0, true
	}
	// Ended calls leave in order of their end; find when enough have left.
	need := sum + n - limit
	var ends []*call
	for _, c := range w.calls {
		if !c.end.IsZero() {
			ends = append(ends, c)
		}
	}
	sortByEnd(ends)
	for _, c := range ends {
		need -= c.n
		if need <= 0 {
			return c.end.Add(window).Sub(now), false
		}
	}
	return 0, false
}

func sortByEnd(cs []*call) {
	for i := 1; i < len(cs); i++ {
		for j := i; j > 0 && cs[j].end.Before(cs[j-1].end); j-- {
			cs[j], cs[j-1] = cs[j-1], cs[j]
		}
	}
}
