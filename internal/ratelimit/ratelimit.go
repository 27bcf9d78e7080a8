package ratelimit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Config configures a Limiter. Every bound is per key.
type Config struct {
	// Name labels the limiter's metrics ("scim", "taxonomy"); required when
	// a Registerer is given.
	Name string
	// Limit is the cost allowed in any Window; 0 means no period limit.
	Limit int
	// Window is the sliding window of Limit; 0 means DefaultWindow.
	Window time.Duration
	// MaxInFlight is the cost allowed in flight at once; 0 means no limit.
	MaxInFlight int
	// MaxWait is the longest a call waits for its turn. A call whose turn is
	// estimated further away is refused at once (ErrLimited with a
	// Retry-After); a call still waiting at MaxWait is refused then. 0 means
	// DefaultMaxWait; negative means never wait (refuse whenever the call
	// cannot go at once).
	MaxWait time.Duration
	// MaxWaiting bounds the calls waiting per key; more are refused. 0 means
	// DefaultMaxWaiting.
	MaxWaiting int
}

// Defaults of Config's zero values.
const (
	DefaultWindow     = time.Minute
	DefaultMaxWait    = 10 * time.Second
	DefaultMaxWaiting = 1000
)

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Limit < 0:
		return fmt.Errorf("ratelimit %s: Limit %d < 0", c.Name, c.Limit)
	case c.Window < 0:
		return fmt.Errorf("ratelimit %s: Window %v < 0", c.Name, c.Window)
	case c.MaxInFlight < 0:
		return fmt.Errorf("ratelimit %s: MaxInFlight %d < 0", c.Name, c.MaxInFlight)
	case c.MaxWaiting < 0:
		return fmt.Errorf("ratelimit %s: MaxWaiting %d < 0", c.Name, c.MaxWaiting)
	}
	return nil
}

func (c Config) withDefaults() Config {
	c.Window = cmp.Or(c.Window, DefaultWindow)
	c.MaxWait = cmp.Or(c.MaxWait, DefaultMaxWait)
	c.MaxWaiting = cmp.Or(c.MaxWaiting, DefaultMaxWaiting)
	return c
}

// ErrLimited is returned (wrapped in a *LimitedError) when a call is refused:
// its turn is further away than Config.MaxWait, too many calls wait, or its
// cost is above a bound.
var ErrLimited = errors.New("client-side limit reached")

// LimitedError says how long the caller should wait before trying again.
type LimitedError struct {
	// RetryAfter is the estimated wait, at least one second.
	RetryAfter time.Duration
	// Reason says which bound refused the call.
	Reason string
}

func (e *LimitedError) Error() string {
	return fmt.Sprintf("%v (%s): retry after %v", ErrLimited, e.Reason, e.RetryAfter)
}

// Unwrap makes errors.Is(err, ErrLimited) hold.
func (e *LimitedError) Unwrap() error { return ErrLimited }

// RetryAfterSeconds is RetryAfter rounded up to whole seconds (at least 1),
// for the Retry-After header.
func (e *LimitedError) RetryAfterSeconds() int {
	return max(int((e.RetryAfter+time.Second-1)/time.Second), 1)
}

// Limiter admits calls per key within a sliding-window cost limit and a
// bound of cost in flight. See the package doc for the rule.
type Limiter struct {
	cfg   Config
	mu    sync.Mutex
	keys  map[string]*keyState
	calls int // Acquire calls since the last sweep of idle keys
	m     metrics
}

type metrics struct {
	admitted prometheus.Counter
	refused  *prometheus.CounterVec
	waited   prometheus.Histogram
}

// grant is one admitted or queued call.
type grant struct {
	cost    int
	planned time.Time // estimated start while queued
	started bool
	done    bool
	end     time.Time // when done: when the upstream's answer arrived
}

type keyState struct {
	grants []*grant      // in admission order
	wake   chan struct{} // closed and replaced when a grant ends or leaves
	paused time.Time     // no call starts before (Pause)
}

// New returns a Limiter. reg may be nil.
func New(cfg Config, reg prometheus.Registerer) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	l := &Limiter{cfg: cfg, keys: map[string]*keyState{}}
	cl, f := prometheus.Labels{"limiter": cfg.Name}, promauto.With(reg)
	l.m = metrics{
		admitted: f.NewCounter(prometheus.CounterOpts{Name: "relay_client_limit_admitted_total",
			Help: "Calls admitted by a client-side limiter.", ConstLabels: cl}),
		refused: f.NewCounterVec(prometheus.CounterOpts{Name: "relay_client_limit_refused_total",
			Help: "Calls refused by a client-side limiter (answered 429 locally), by reason.", ConstLabels: cl}, []string{"reason"}),
		waited: f.NewHistogram(prometheus.HistogramOpts{Name: "relay_client_limit_wait_seconds",
			Help: "How long admitted calls waited for their turn.", ConstLabels: cl,
			Buckets: []float64{0, .01, .1, .5, 1, 2, 5, 10, 30, 60}}),
	}
	return l, nil
}

// Config returns the configuration in effect (defaults filled in).
func (l *Limiter) Config() Config { return l.cfg }

// Acquire waits for the turn of a call of cost for key and returns the
// function to call once the upstream's answer has arrived (or the call was
// abandoned): from then on its cost leaves the in-flight bound, and it
// counts against Limit for Window from that moment. It returns a
// *LimitedError (errors.Is ErrLimited) when the call is refused, or ctx's
// error when ctx ends while waiting; release is nil then.
func (l *Limiter) Acquire(ctx context.Context, key string, cost int) (release func(), err error) {
	if cost < 1 {
		cost = 1
	}
	if (l.cfg.Limit > 0 && cost > l.cfg.Limit) || (l.cfg.MaxInFlight > 0 && cost > l.cfg.MaxInFlight) {
		return nil, l.refuse("cost", time.Hour)
	}
	start := time.Now()
	deadline := start.Add(max(l.cfg.MaxWait, 0))
	l.mu.Lock()
	if l.calls++; l.calls >= sweepEvery {
		l.sweepLocked(start)
	}
	ks := l.keyLocked(key)
	l.pruneLocked(ks, start)
	g := &grant{cost: cost}
	if ok, _ := l.admissibleLocked(ks, len(ks.grants), g, start); ok { // none waits ahead
		return l.startLocked(key, ks, g, start), nil
	}
	est := later(l.estimateLocked(ks, len(ks.grants), cost, start), ks.paused)
	switch {
	case est.Sub(start) > l.cfg.MaxWait:
		l.dropIfEmptyLocked(key, ks)
		l.mu.Unlock()
		return nil, l.refuse("wait", est.Sub(start))
	case l.waitingLocked(ks) >= l.cfg.MaxWaiting:
		l.mu.Unlock()
		return nil, l.refuse("queue", est.Sub(start))
	}
	g.planned = est
	ks.grants = append(ks.grants, g)
	for {
		now := time.Now()
		l.pruneLocked(ks, now)
		i := slices.Index(ks.grants, g)
		ok, next := l.admissibleLocked(ks, i, g, now)
		if ok {
			return l.startLocked(key, ks, g, start), nil
		}
		if !now.Before(deadline) {
			ks.grants = slices.Delete(ks.grants, i, i+1)
			l.wakeLocked(ks)
			retry := later(l.estimateLocked(ks, i, cost, now), ks.paused).Sub(now)
			l.dropIfEmptyLocked(key, ks)
			l.mu.Unlock()
			return nil, l.refuse("wait", retry)
		}
		wake := ks.wake
		l.mu.Unlock()
		wait := min(deadline.Sub(now), max(next.Sub(now), time.Millisecond))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-wake:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			l.mu.Lock()
			if i := slices.Index(ks.grants, g); i >= 0 {
				ks.grants = slices.Delete(ks.grants, i, i+1)
				l.wakeLocked(ks)
			}
			l.dropIfEmptyLocked(key, ks)
			l.mu.Unlock()
			return nil, ctx.Err()
		}
		l.mu.Lock()
	}
}

// Pause keeps every call of key from starting for d (clamped to at most
// Window): the upstream answered 429 with Retry-After d. Calls whose turn
// then lies beyond MaxWait are refused at once with the remaining time.
func (l *Limiter) Pause(key string, d time.Duration) {
	if d <= 0 {
		return
	}
	d = min(d, l.cfg.Window)
	until := time.Now().Add(d)
	l.mu.Lock()
	defer l.mu.Unlock()
	if ks := l.keyLocked(key); until.After(ks.paused) {
		ks.paused = until
	}
}

// keyLocked returns the state of key, made when there is none.
func (l *Limiter) keyLocked(key string) *keyState {
	ks := l.keys[key]
	if ks == nil {
		ks = &keyState{wake: make(chan struct{})}
		l.keys[key] = ks
	}
	return ks
}

func (l *Limiter) refuse(reason string, retry time.Duration) error {
	l.m.refused.WithLabelValues(reason).Inc()
	return &LimitedError{RetryAfter: max(retry, time.Second), Reason: reason}
}

// startLocked admits g (appending it when new), unlocks and returns its
// release.
func (l *Limiter) startLocked(key string, ks *keyState, g *grant, since time.Time) func() {
	if !slices.Contains(ks.grants, g) {
		ks.grants = append(ks.grants, g)
	} else {
		l.wakeLocked(ks) // the calls behind it may go now
	}
	g.started = true
	l.mu.Unlock()
	l.m.admitted.Inc()
	l.m.waited.Observe(time.Since(since).Seconds())
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			g.done, g.end = true, time.Now()
			l.wakeLocked(ks)
			l.mu.Unlock()
		})
	}
}

func (l *Limiter) wakeLocked(ks *keyState) {
	close(ks.wake)
	ks.wake = make(chan struct{})
}

// pruneLocked forgets ended grants that no longer count in the window.
func (l *Limiter) pruneLocked(ks *keyState, now time.Time) {
	ks.grants = slices.DeleteFunc(ks.grants, func(g *grant) bool {
		return g.done && !g.end.After(now.Add(-l.cfg.Window))
	})
}

// sweepEvery is how many Acquire calls pass between sweeps of idle keys.
const sweepEvery = 1024

// sweepLocked forgets keys with nothing counted and no pause.
func (l *Limiter) sweepLocked(now time.Time) {
	l.calls = 0
	for k, ks := range l.keys {
		l.pruneLocked(ks, now)
		l.dropIfEmptyLocked(k, ks)
	}
}

func (l *Limiter) dropIfEmptyLocked(key string, ks *keyState) {
	if len(ks.grants) == 0 && l.keys[key] == ks && !ks.paused.After(time.Now()) {
		delete(l.keys, key)
	}
}

func (l *Limiter) waitingLocked(ks *keyState) int {
	n := 0
	for _, g := range ks.grants {
		if !g.started {
			n++
		}
	}
	return n
}

// admissibleLocked reports whether g may start now given the grants ahead
// of it (indexes below i); when not, next is when to look again.
func (l *Limiter) admissibleLocked(ks *keyState, i int, g *grant, now time.Time) (ok bool, next time.Time) {
	if ks.paused.After(now) {
		return false, ks.paused
	}
	inFlight, inWindow := 0, 0
	for _, o := range ks.grants[:i] {
		if !o.started {
			return false, now.Add(l.cfg.Window) // one ahead still waits: its start wakes us
		}
		if !o.done {
			inFlight += o.cost
		}
		inWindow += o.cost // pruned: every remaining grant counts in the window
	}
	if l.cfg.MaxInFlight > 0 && inFlight+g.cost > l.cfg.MaxInFlight {
		return false, now.Add(l.cfg.Window) // woken by a release
	}
	if l.cfg.Limit > 0 && inWindow+g.cost > l.cfg.Limit {
		return false, l.estimateLocked(ks, i, g.cost, now)
	}
	return true, now
}

// estimateLocked estimates when a call of cost behind the first i grants
// may start: each grant ahead is taken to end at its end (done), now (in
// flight) or its planned start (queued), and counts for Window after that.
func (l *Limiter) estimateLocked(ks *keyState, i int, cost int, now time.Time) time.Time {
	if l.cfg.Limit == 0 {
		return now
	}
	type ce struct {
		end  time.Time
		cost int
	}
	ends := make([]ce, 0, i)
	total := 0
	for _, o := range ks.grants[:i] {
		e := now
		switch {
		case o.done:
			e = o.end
		case !o.started && o.planned.After(now):
			e = o.planned
		}
		ends = append(ends, ce{e, o.cost})
		total += o.cost
	}
	if total+cost <= l.cfg.Limit {
		return now
	}
	slices.SortFunc(ends, func(a, b ce) int { return a.end.Compare(b.end) })
	for _, e := range ends {
		total -= e.cost
		if total+cost <= l.cfg.Limit {
			return later(now, e.end.Add(l.cfg.Window))
		}
	}
	return now.Add(l.cfg.Window)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
