package delivery

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/throttle"
)

// Fleet mode's delivery (NewFleet: partitions handed by a storage.Owner,
// demultiplexed by lane into feeds) over the local spool behind the seam
// (spool.Backend hands each lane as a queue): the harness's checks (every
// record delivered or dead-lettered, in order per key, acknowledged) hold
// as in local mode. The fleet itself is tested in cmd/relay (fleet_test.go).

func newSeamHarness(t *testing.T, simCfg sim.Config, cfg Config, thrCfg throttle.Config) *harness {
	t.Helper()
	return overSeam(t, newHarness(t, simCfg, cfg, thrCfg))
}

// overSeam makes h's pipeline a fleet-mode one over the local spool.
func overSeam(t *testing.T, h *harness) *harness {
	t.Helper()
	h.reg = prometheus.NewRegistry()
	var err error
	h.p, err = NewFleet(h.cfg, spool.NewBackend(h.sp), nil, nil, h.send, h.thr, zaptest.NewLogger(t), h.reg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestFleetModeOverSeam(t *testing.T) {
	t.Run("basic", func(t *testing.T) {
		h := newSeamHarness(t, sim.Config{}, Config{Live: Live{MaxBatchEvents: 50, MaxBatchBytes: 8000}, ShardsPerLane: 3}, throttle.Config{})
		for range 10 {
			var evs []ev
			for _, d := range devs("device-", 20) {
				evs = append(evs, ev{Device: d, User: "user-" + d})
			}
			h.add("key-one", evs...)
		}
		h.start()
		polltest.Until(t, "Ready", func() bool { return h.p.Ready() == nil })
		for range 5 { // a queue handed over at run time
			h.add("key-two", ev{User: "only-user-1"}, ev{Device: "device-x"})
		}
		h.waitDrained(20*time.Second, 0)
		if n := len(h.p.LaneStatus()); n != 2 {
			t.Errorf("%d runners, want 2: %+v", n, h.p.LaneStatus())
		}
		h.stop()
		if dead := h.check(nil); len(dead) != 0 {
			t.Fatalf("dead letters: %v", dead)
		}
		if got := h.metric("relay_delivery_events_delivered_total"); got != 210 {
			t.Fatalf("delivered metric %v", got)
		}
		if used := h.p.budget.Used(); used != 0 {
			t.Fatalf("read-ahead %d after the stop", used)
		}
	})
	t.Run("silenced-and-faults", func(t *testing.T) {
		h := newSeamHarness(t, sim.Config{}, Config{Live: Live{MaxBatchEvents: 10}}, throttle.Config{})
		simtest.Silence(h.sim, "silent-device")
		for i := range 40 {
			h.sim.Inject([]simtest.Fault{{Status: 503}, {}, {Status: 500}, {}}[i%4])
		}
		h.start()
		for range 10 {
			var evs []ev
			for _, d := range devs("device-", 10) {
				evs = append(evs, ev{Device: d}, ev{Device: "silent-device"})
			}
			h.add("key", evs...)
		}
		h.waitDrained(30*time.Second, 0)
		h.stop()
		if dead := h.check(nil); len(dead) != 100 {
			t.Fatalf("%d dead letters, want the 100 silenced", len(dead))
		}
	})
	t.Run("read-ahead-bounded", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			const max = 20_000
			h := overSeam(t, newSyncHarness(t, sim.Config{}, Config{MaxReadAheadBytes: max, ShardsPerLane: 2}, throttle.Config{}))
			h.checkReadAheadBackPressure(max)
		})
	})
}

// TestFleetRunnersRetire: a fleet-mode lane runner with nothing queued or
// unacknowledged for feedIdle ends and is forgotten (its goroutines and
// status go); the lane's next message makes a new one. Fake time.
func TestFleetRunnersRetire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSyncHarness(t, sim.Config{}, Config{}, throttle.Config{})
		h.reg = prometheus.NewRegistry()
		var err error
		h.p, err = NewFleet(h.cfg, spool.NewBackend(h.sp), nil, nil, h.send, h.thr, nil, h.reg)
		if err != nil {
			t.Fatal(err)
		}
		h.add("key", ev{Device: "device-1"}, ev{Device: "device-2"})
		h.start()
		h.waitDrained(10*time.Second, 0)
		if n := len(h.p.LaneStatus()); n != 1 {
			t.Fatalf("%d runners while delivering, want 1", n)
		}
		time.Sleep(feedIdle + time.Second)
		synctest.Wait()
		if st := h.p.LaneStatus(); len(st) != 0 {
			t.Fatalf("runners left after %v idle: %+v", feedIdle, st)
		}
		h.add("key", ev{Device: "device-1"})
		h.waitDrained(10*time.Second, 0)
		if n := len(h.p.LaneStatus()); n != 1 {
			t.Fatalf("%d runners after new events, want 1", n)
		}
		h.stop()
		if dead := h.check(nil); len(dead) != 0 {
			t.Fatalf("dead letters: %v", dead)
		}
	})
}

// leasedStore hands out the local spool's queues with a lease the test
// runs out and renews (as the fleet's partitions: storage.WithLease).
type leasedStore struct {
	*spool.Backend
	held atomic.Bool
}

func (s *leasedStore) Run(ctx context.Context, deliver storage.DeliverFunc) error {
	return s.Backend.Run(ctx, func(owned context.Context, r storage.Reader) error {
		return deliver(storage.WithLease(owned, s.held.Load), r)
	})
}

// TestFleetLeaseRunOut: while a queue's lease has run out by the clock,
// its context not cancelled (a relay resumed after a stop, its timers not
// yet run), the pipeline sends nothing of it; when a renewal extends the
// lease instead, everything is delivered (the shards waited, they did not
// end).
func TestFleetLeaseRunOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSyncHarness(t, sim.Config{}, Config{Live: Live{MaxBatchEvents: 10}, ShardsPerLane: 2}, throttle.Config{})
		st := &leasedStore{Backend: spool.NewBackend(h.sp)}
		h.reg = prometheus.NewRegistry()
		var err error
		h.p, err = NewFleet(h.cfg, st, nil, nil, h.send, h.thr, zaptest.NewLogger(t), h.reg)
		if err != nil {
			t.Fatal(err)
		}
		for range 5 {
			h.add("key", devEvents(10)...)
		}
		h.start()
		polltest.Until(t, "the lane's runner to read the queue", func() bool {
			for _, ls := range h.p.LaneStatus() {
				if ls.ReadAheadBytes > 0 {
					return true
				}
			}
			return false
		})
		// The shards had their flush interval several times over to send.
		time.Sleep(20 * h.cfg.FlushInterval)
		if n := h.send.calls.Load(); n != 0 {
			t.Fatalf("%d requests sent while the lease had run out", n)
		}
		st.held.Store(true)
		h.waitDrained(polltest.Max, 0)
		h.stop()
		if dead := h.check(nil); len(dead) != 0 {
			t.Fatalf("dead letters: %v", dead)
		}
	})
}

func devEvents(n int) []ev {
	var evs []ev
	for _, d := range devs("device-", n) {
		evs = append(evs, ev{Device: d})
	}
	return evs
}
