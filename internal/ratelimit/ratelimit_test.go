package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func newLimiter(t *testing.T, cfg Config) *Limiter {
	t.Helper()
	l, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{{Limit: -1}, {Window: -1}, {MaxInFlight: -1}, {MaxWaiting: -1}} {
		if c.Validate() == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if err := (Config{}).Validate(); err != nil {
		t.Error(err)
	}
	l := newLimiter(t, Config{})
	if c := l.Config(); c.Window != DefaultWindow || c.MaxWait != DefaultMaxWait || c.MaxWaiting != DefaultMaxWaiting {
		t.Errorf("defaults %+v", c)
	}
}

// TestWindowNeverExceeded: at most Limit calls are admitted in any window,
// counted from their release; calls whose turn is far are refused at once
// with a Retry-After, near ones wait.
func TestWindowNeverExceeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, Config{Limit: 10, Window: time.Minute, MaxWait: 30 * time.Second})
		var mu sync.Mutex
		var starts []time.Time
		var refused []*LimitedError
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * 2 * time.Second) // one call every 2 s for 100 s
				rel, err := l.Acquire(context.Background(), "org:a", 1)
				if err != nil {
					var le *LimitedError
					if !errors.As(err, &le) || !errors.Is(err, ErrLimited) {
						t.Errorf("err %v", err)
						return
					}
					mu.Lock()
					refused = append(refused, le)
					mu.Unlock()
					return
				}
				mu.Lock()
				starts = append(starts, time.Now())
				mu.Unlock()
				time.Sleep(100 * time.Millisecond) // the upstream answers
				rel()
			})
		}
		wg.Wait()
		for i := range starts {
			n := 0
			for j := range starts {
				if !starts[j].Before(starts[i]) && starts[j].Sub(starts[i]) < time.Minute {
					n++
				}
			}
			if n > 10 {
				t.Fatalf("%d calls started within a minute of %v", n, starts[i])
			}
		}
		if len(starts) < 10 || len(refused) == 0 {
			t.Fatalf("%d admitted, %d refused", len(starts), len(refused))
		}
		for _, le := range refused {
			if le.RetryAfter < time.Second || le.RetryAfterSeconds() < 1 {
				t.Errorf("retry after %v", le.RetryAfter)
			}
		}
	})
}

// TestWindowCountsFromRelease: a slow answer keeps its call in the window
// until Window after the answer, so the next call waits for that.
func TestWindowCountsFromRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, Config{Limit: 1, Window: 10 * time.Second, MaxWait: time.Minute})
		t0 := time.Now()
		rel, err := l.Acquire(context.Background(), "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			time.Sleep(5 * time.Second)
			rel()
		}()
		rel2, err := l.Acquire(context.Background(), "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		rel2()
		if got := time.Since(t0); got != 15*time.Second {
			t.Fatalf("second call started after %v, want 15s (release at 5s + window)", got)
		}
	})
}

func TestRefusedAtOnceWhenTurnIsFar(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, Config{Limit: 2, Window: time.Minute, MaxWait: 5 * time.Second})
		for range 2 {
			rel, err := l.Acquire(context.Background(), "k", 1)
			if err != nil {
				t.Fatal(err)
			}
			rel()
		}
		t0 := time.Now()
		_, err := l.Acquire(context.Background(), "k", 1)
		var le *LimitedError
		if !errors.As(err, &le) || le.Reason != "wait" || le.RetryAfterSeconds() != 60 {
			t.Fatalf("err %v", err)
		}
		if time.Since(t0) != 0 {
			t.Errorf("refusal waited %v", time.Since(t0))
		}
		// Other keys are independent.
		if rel, err := l.Acquire(context.Background(), "other", 1); err != nil {
			t.Fatal(err)
		} else {
			rel()
		}
		// After the window the key is free again.
		time.Sleep(time.Minute)
		if rel, err := l.Acquire(context.Background(), "k", 1); err != nil {
			t.Fatal(err)
		} else {
			rel()
		}
	})
}

// TestCostBudget: taxonomy's rule, 4 cost in flight and a period budget.
func TestCostBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, Config{Limit: 12, Window: time.Hour, MaxInFlight: 4, MaxWait: 10 * time.Second})
		var mu sync.Mutex
		inFlight, peak, admitted, refused := 0, 0, 0, 0
		var wg sync.WaitGroup
		for i := range 10 {
			cost := 1 + i%2 // GET 1, PUT/POST/DELETE 2
			wg.Go(func() {
				rel, err := l.Acquire(context.Background(), "project:p", cost)
				if err != nil {
					if !errors.Is(err, ErrLimited) {
						t.Error(err)
					}
					mu.Lock()
					refused++
					mu.Unlock()
					return
				}
				mu.Lock()
				inFlight += cost
				peak = max(peak, inFlight)
				admitted += cost
				mu.Unlock()
				time.Sleep(time.Second)
				mu.Lock()
				inFlight -= cost
				mu.Unlock()
				rel()
			})
		}
		wg.Wait()
		if peak > 4 {
			t.Errorf("peak cost in flight %d > 4", peak)
		}
		if admitted > 12 || refused == 0 {
			t.Errorf("admitted cost %d (limit 12), refused %d", admitted, refused)
		}
	})
}

func TestInFlightWaitRefusedAtMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, Config{MaxInFlight: 2, MaxWait: 3 * time.Second})
		rel, err := l.Acquire(context.Background(), "k", 2)
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		_, err = l.Acquire(context.Background(), "k", 1)
		if !errors.Is(err, ErrLimited) || time.Since(t0) != 3*time.Second {
			t.Fatalf("err %v after %v", err, time.Since(t0))
		}
		go func() { time.Sleep(time.Second); rel() }()
		t0 = time.Now()
		rel2, err := l.Acquire(context.Background(), "k", 1)
		if err != nil || time.Since(t0) != time.Second {
			t.Fatalf("err %v after %v", err, time.Since(t0))
		}
		rel2()
		rel2() // twice is harmless
		if _, err := l.Acquire(context.Background(), "k", 3); !errors.Is(err, ErrLimited) {
			t.Errorf("cost above MaxInFlight admitted: %v", err)
		}
	})
}

func TestContextCancelLeavesQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, Config{MaxInFlight: 1, MaxWait: time.Minute})
		rel, _ := l.Acquire(context.Background(), "k", 1)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := l.Acquire(ctx, "k", 1); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err %v", err)
		}
		rel()
		rel2, err := l.Acquire(context.Background(), "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		rel2()
		l.mu.Lock()
		n := len(l.keys["k"].grants)
		l.mu.Unlock()
		if n != 2 {
			t.Errorf("%d grants remembered, want the 2 admitted", n)
		}
	})
}

func TestNeverWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, Config{MaxInFlight: 1, MaxWait: -1})
		rel, _ := l.Acquire(context.Background(), "k", 1)
		if _, err := l.Acquire(context.Background(), "k", 1); !errors.Is(err, ErrLimited) {
			t.Fatalf("err %v", err)
		}
		rel()
	})
}

func BenchmarkAcquireRelease(b *testing.B) {
	l, _ := New(Config{Limit: 1 << 30, MaxInFlight: 1 << 20, Window: time.Nanosecond}, nil)
	b.ReportAllocs()
	for b.Loop() {
		rel, err := l.Acquire(context.Background(), "k", 1)
		if err != nil {
			b.Fatal(err)
		}
		rel()
	}
}

func TestPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, Config{Limit: 100, Window: time.Minute, MaxWait: 5 * time.Second})
		l.Pause("k", 30*time.Second)
		_, err := l.Acquire(context.Background(), "k", 1)
		var le *LimitedError
		if !errors.As(err, &le) || le.RetryAfterSeconds() != 30 {
			t.Fatalf("paused key: %v", err)
		}
		if rel, err := l.Acquire(context.Background(), "other", 1); err != nil {
			t.Fatal(err)
		} else {
			rel()
		}
		time.Sleep(27 * time.Second)
		t0 := time.Now()
		rel, err := l.Acquire(context.Background(), "k", 1) // waits the last 3 s
		if err != nil || time.Since(t0) != 3*time.Second {
			t.Fatalf("err %v after %v", err, time.Since(t0))
		}
		rel()
		l.Pause("k", time.Hour) // clamped to the window
		_, err = l.Acquire(context.Background(), "k", 1)
		if !errors.As(err, &le) || le.RetryAfterSeconds() != 60 {
			t.Fatalf("clamp: %v", err)
		}
	})
}

func TestIdleKeysForgotten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, Config{Limit: 10, Window: time.Second})
		for i := range 2 * sweepEvery {
			rel, err := l.Acquire(context.Background(), fmt.Sprint("key", i), 1)
			if err != nil {
				t.Fatal(err)
			}
			rel()
			if i == sweepEvery-1 {
				time.Sleep(2 * time.Second)
			}
		}
		l.mu.Lock()
		n := len(l.keys)
		l.mu.Unlock()
		if n > sweepEvery+1 {
			t.Fatalf("%d keys remembered", n)
		}
	})
}
