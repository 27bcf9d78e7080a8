package usermap

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

// TestPacerWindow: many lanes of two organizations acquire concurrently with
// varying latency; wherever in [admission, release] the upstream sees a
// request arrive, no window of an organization holds more than the limit,
// and the pacer keeps the rate close to it (it does not starve).
func TestPacerWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit, window = 1500, 30 * time.Second
		org := map[string]string{"a1": "A", "a2": "A", "a3": "A", "b1": "B"}
		p, _ := newPacer(limit, window, func(k string) string { return org[k] }, nil)
		var mu sync.Mutex
		var early, late []sim.MappingBatch // arrival at admission / at release
		var wg sync.WaitGroup
		start := time.Now()
		for key := range org {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(len(key)), uint64(key[1])))
				for range 40 {
					n := 1 + rng.IntN(400)
					rel, err := p.Acquire(context.Background(), key, n)
					if err != nil {
						t.Error(err)
						return
					}
					admitted := time.Now()
					time.Sleep(time.Duration(rng.IntN(3000)) * time.Millisecond)
					mu.Lock()
					early = append(early, sim.MappingBatch{Time: admitted, Org: org[key], N: n})
					late = append(late, sim.MappingBatch{Time: time.Now(), Org: org[key], N: n})
					mu.Unlock()
					rel()
				}
			}()
		}
		wg.Wait()
		// Mixed: some requests arrive early, some late.
		mixed := make([]sim.MappingBatch, len(early))
		for i := range early {
			mixed[i] = early[i]
			if i%2 == 1 {
				mixed[i] = late[i]
			}
		}
		for name, bs := range map[string][]sim.MappingBatch{"admission": early, "release": late, "mixed": mixed} {
			if got := simtest.MaxWindowCount(bs, window); got > limit {
				t.Errorf("arrival at %s: %d calls in one window, limit %d", name, got, limit)
			}
		}
		// Org A sent 3*40 requests of ~200 = ~24000 calls: at 1500 per 30 s
		// that needs ~16 windows; allow for the release margin, not more
		// than 3x.
		totalA := 0
		for _, b := range early {
			if b.Org == "A" {
				totalA += b.N
			}
		}
		minWindows := time.Duration(totalA/limit-1) * window
		if el := time.Since(start); el < minWindows || el > 3*minWindows+10*window {
			t.Errorf("org A: %d calls took %v (min %v)", totalA, el, minWindows)
		}
	})
}

func TestPacerRefusesOverLimitAndCancels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _ := newPacer(10, time.Second, func(k string) string { return k }, nil)
		if _, err := p.Acquire(context.Background(), "k", 11); err == nil {
			t.Fatal("11 > limit admitted")
		}
		rel, err := p.Acquire(context.Background(), "k", 10)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, err := p.Acquire(ctx, "k", 1); err == nil {
			t.Fatal("admitted above the limit while in flight")
		}
		rel()
		t0 := time.Now()
		if _, err := p.Acquire(context.Background(), "k", 1); err != nil {
			t.Fatal(err)
		}
		if w := time.Since(t0); w != time.Second {
			t.Fatalf("waited %v, want exactly the window after the release", w)
		}
		// Another key is its own organization.
		if _, err := p.Acquire(context.Background(), "other", 10); err != nil {
			t.Fatal(err)
		}
	})
}
