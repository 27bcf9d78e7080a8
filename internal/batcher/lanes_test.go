package batcher

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/throttle"
)

// scraper scrapes a /metrics handler on 127.0.0.1 in a loop until stopped:
// the issue-19 deadlock hung a scrape for good, so every scrape has a
// deadline and one that misses it fails the test.
type scraper struct {
	t       *testing.T
	url     string
	n       atomic.Int64
	maxSize atomic.Int64
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	err     error
}

func startScraper(t *testing.T, h http.Handler) *scraper {
	srv := httptest.NewServer(h) // 127.0.0.1
	s := &scraper{t: t, url: srv.URL, stop: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-s.done:
			srv.Close()
		default:
			// A hung scrape: Close would wait for it for ever.
			srv.CloseClientConnections()
		}
	})
	cli := &http.Client{Timeout: 20 * time.Second}
	go func() {
		defer close(s.done)
		for i := 0; i < 100000; i++ { // bounded; stopped long before
			select {
			case <-s.stop:
				return
			default:
			}
			resp, err := cli.Get(s.url)
			if err == nil {
				var b []byte
				b, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				if err == nil && resp.StatusCode != 200 {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
				s.maxSize.Store(max(s.maxSize.Load(), int64(len(b))))
			}
			if err != nil {
				s.mu.Lock()
				s.err = fmt.Errorf("scrape %d: %w", i, err)
				s.mu.Unlock()
				return
			}
			s.n.Add(1)
		}
	}()
	return s
}

// finish stops the loop and returns its error; a scrape that hangs fails.
func (s *scraper) finish() error {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		return errors.New("a scrape hung")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Issue 19, item 1: /metrics is scraped in a loop while thousands of lanes
// are created, stopped, resumed and the pipeline restarted. No scrape may
// hang, and every lane created during the scrapes must start and deliver.
// Before the fix, Run held the pipeline's mutex while creating a lane's
// relay_lane_stopped series, and a scrape's gauge waited for that mutex
// while holding the series vector's lock: scrapes, the admin API and every
// lane created afterwards hung for good.
func TestMetricsScrapeWhileLanesChurn(t *testing.T) {
	h := newHarness(t, sim.Config{}, Config{ShardsPerLane: 2}, throttle.Config{})
	sc := startScraper(t, promhttp.HandlerFor(h.reg, promhttpOpts()))
	fail := func(format string, args ...any) {
		t.Helper()
		if err := sc.finish(); err != nil {
			t.Errorf("after %d scrapes: %v", sc.n.Load(), err)
		}
		t.Fatalf(format, args...)
	}
	h.start()
	lanes := 3000
	if raceEnabled {
		lanes = 800
	}
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; i < lanes; i++ {
		key := fmt.Sprintf("churn-key-%04d", i)
		h.add(key, ev{Device: "dev-1"})
		switch {
		case i%250 == 100:
			// Stop and resume a lane the pipeline runs (both touch
			// relay_lane_stopped), from another goroutine like the
			// admin API.
			id := h.lane(fmt.Sprintf("churn-key-%04d", i-50), "").ID()
			go func() {
				if err := h.p.StopLane(id); err == nil {
					_ = h.p.ResumeLane(id)
				}
			}()
		case i == lanes/2:
			// Restart delivery: every lane's runner starts again.
			h.cancel()
			select {
			case <-h.done:
			case <-time.After(20 * time.Second):
				h.cancel = nil // hung: the cleanup must not wait for it again
				fail("Run did not return within 20s")
			}
			h.start()
		}
		if time.Now().After(deadline) {
			fail("creating lanes took over 60s (%d of %d)", i, lanes)
		}
	}
	for h.sim.Count() < int64(lanes) {
		if time.Now().After(deadline) {
			fail("%d of %d events delivered; %d scrapes", h.sim.Count(), lanes, sc.n.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := sc.finish(); err != nil {
		t.Fatalf("after %d scrapes: %v", sc.n.Load(), err)
	}
	if sc.n.Load() < 5 {
		t.Fatalf("only %d scrapes ran", sc.n.Load())
	}
	for _, st := range h.p.LaneStatus() {
		if st.Stopped {
			t.Errorf("lane %s left stopped: %+v", st.Label, st)
		}
	}
	h.stop()
	h.check(nil)
	t.Logf("%d lanes, %d scrapes, largest %d bytes", lanes, sc.n.Load(), sc.maxSize.Load())
}

func promhttpOpts() promhttp.HandlerOpts {
	return promhttp.HandlerOpts{Timeout: 0}
}
