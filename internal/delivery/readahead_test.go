package delivery

import (
	"fmt"
	"runtime"
	rtmetrics "runtime/metrics"
	"testing"
	"testing/synctest"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/internal/throttle"
	"go.uber.org/zap/zapcore"
)

// A device paused until tomorrow has one event in each of many large
// chunks; everything else is delivered. The held events must not keep their
// chunks' buffers alive: the read-ahead then accounts only the held copies,
// and the heap does not grow by the chunks' size (before held events were
// copied out, the 100 chunks of ~200 KB stayed reachable: +19 MB).
func TestHeldEventsDoNotPinChunks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			chunks   = 100
			perChunk = 100 // one held, 99 delivered
			pad      = 2000
		)
		h := newSyncHarness(t, sim.Config{CountOnly: simtest.CountEvents},
			Config{Live: Live{MaxBatchEvents: 200}, MaxReadAheadBytes: 1 << 20, ShardsPerLane: 2}, throttle.Config{})
		h.thr.PauseUntilNextDay([]string{"d:quota-device"})
		var heldData int64
		cold := devs("cold-", perChunk)
		for c := 0; c < chunks; c++ {
			evs := []ev{{Device: "quota-device", User: "quota-user", Pad: 10}}
			for i := 1; i < perChunk; i++ {
				evs = append(evs, ev{Device: cold[i], Pad: pad})
			}
			ids := h.add("key", evs...)
			heldData += int64(len(h.data[ids[0]]) + len("d:quota-device") + len("quota-user"))
		}
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)

		h.start()
		want := int64(chunks * (perChunk - 1))
		deadline := time.Now().Add(polltest.Max)
		for simtest.Counted(h.sim) < want {
			if time.Now().After(deadline) {
				t.Fatalf("delivered %d of %d; lanes %+v", simtest.Counted(h.sim), want, h.p.LaneStatus())
			}
			time.Sleep(10 * time.Millisecond)
		}
		// The last 200 answers may still be being handled: wait for the
		// read-ahead to settle on the held events.
		var st LaneStatus
		maxHeld := heldData + chunks*itemBytes
		for {
			st = h.p.LaneStatus()[0]
			if st.HeldEvents == chunks && st.ReadAheadBytes <= maxHeld {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("read-ahead %d bytes with %d events held, want at most %d (the held copies): %+v",
					st.ReadAheadBytes, st.HeldEvents, maxHeld, st)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if st.ReadAheadBytes < heldData {
			t.Fatalf("read-ahead %d bytes, below the %d bytes of the held events", st.ReadAheadBytes, heldData)
		}
		if got := h.p.budget.Used(); got != st.ReadAheadBytes {
			t.Fatalf("pipeline read-ahead %d, lane %d", got, st.ReadAheadBytes)
		}

		// The kept body buffers (bodyPool: up to 8 of MaxBatchBytes, whatever
		// the chunks) are dropped as the relay does when it goes idle. Twice:
		// released chunk buffers wait in the spool's sync.Pools, which the first
		// collection only moves to their victim caches.
		h.p.ReleaseMemory()
		runtime.GC()
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
		// Allowed: the shards' body buffers in use and the upstream client's
		// (up to MaxBatchBytes each), queues, the sim's connections; not the
		// chunks.
		pinned := int64(chunks * (perChunk - 1) * pad)
		t.Logf("heap grew %d KiB (chunks: %d KiB); read-ahead %d bytes for %d held events", grew>>10, pinned>>10, st.ReadAheadBytes, st.HeldEvents)
		if grew > pinned/2 {
			t.Fatalf("heap grew %d KiB while only %d events are held: chunk buffers (%d KiB) still reachable?", grew>>10, st.HeldEvents, pinned>>10)
		}
		if len(h.sim.Requests()) == 0 || simtest.Counted(h.sim) != want {
			t.Fatalf("sim counted %d, want %d (the paused device must not be sent)", simtest.Counted(h.sim), want)
		}
	})
}

// Events held for a paused device (moved into their own copies while their
// chunks' other events are delivered) are delivered byte for byte, in
// order, after the pause ends, and only then.
func TestHeldEventsDeliveredIntactAfterPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const pause = time.Second
		h := newSyncHarness(t, sim.Config{}, Config{Live: Live{MaxBatchEvents: 50}, ShardsPerLane: 2}, throttle.Config{})
		for c := 0; c < 20; c++ {
			var evs []ev
			for i := 0; i < 3; i++ {
				evs = append(evs, ev{Device: "paused-device", User: "user-" + string(rune('a'+c%26)), Pad: 50 + 37*c + i})
			}
			for _, d := range devs("other-", 20) {
				evs = append(evs, ev{Device: d, Pad: 300})
			}
			h.add("key", evs...)
		}
		until := time.Now().Add(pause)
		h.thr.Pause([]string{"d:paused-device"}, until)
		h.start()

		// During the pause: the others are delivered, the paused device's
		// events are held, in their own copies only.
		deadline := time.Now().Add(polltest.Max)
		for h.sim.Count() < 20*20 {
			if time.Now().After(deadline) {
				t.Fatalf("others not delivered: %d", h.sim.Count())
			}
			time.Sleep(5 * time.Millisecond)
		}
		var st LaneStatus
		for time.Now().Before(until.Add(-50 * time.Millisecond)) {
			if st = h.p.LaneStatus()[0]; st.HeldEvents == 60 && st.ReadAheadBytes < 60*(1024+itemBytes) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if time.Now().Before(until) && (st.HeldEvents != 60 || st.ReadAheadBytes >= 60*(1024+itemBytes)) {
			t.Fatalf("during the pause: %+v, want 60 events held in their own copies", st)
		}

		h.waitDrained(10*time.Second, 0)
		h.stop()
		h.check(nil) // order, exactly once, byte for byte
		at := map[int64]time.Time{}
		for _, r := range h.sim.Requests() {
			at[r.Seq] = r.Time
		}
		n := 0
		for _, e := range h.sim.AllEvents() {
			if e.DeviceID != "paused-device" {
				continue
			}
			n++
			if at[e.Request].Before(until) {
				t.Errorf("event %s of the paused device sent at %v, before the pause ended (%v)", e.InsertID, at[e.Request], until)
			}
		}
		if n != 60 {
			t.Fatalf("paused device: %d events delivered, want 60", n)
		}
	})
}

// The total read-ahead is shared: a lane whose events are all held (a
// device over its daily quota) fills its own budget and the total; another
// lane then still reads, one chunk at a time while it has nothing read
// ahead, and drains completely; the totals stay bounded; everything read
// is released when delivered.
func TestTotalReadAheadNoStarvation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit = 32 << 10
		h := newSyncHarness(t, sim.Config{}, Config{MaxReadAheadBytes: limit, MaxReadAheadTotalBytes: limit, ShardsPerLane: 2}, throttle.Config{})
		h.thr.PauseUntilNextDay([]string{"d:quota-device"})
		for c := 0; c < 100; c++ {
			h.add("stuck-key", ev{Device: "quota-device", Pad: 500}, ev{Device: "quota-device", Pad: 500})
		}
		h.start()
		deadline := time.Now().Add(polltest.Max)
		for h.p.budget.Used() < shareOf(limit) {
			if time.Now().After(deadline) {
				t.Fatalf("the stuck lane did not fill its share of the total: %d; %+v", h.p.budget.Used(), h.p.LaneStatus())
			}
			time.Sleep(5 * time.Millisecond)
		}
		// Now the other lane: 50 chunks of ~10 KB, 15 times the total.
		for c := 0; c < 50; c++ {
			var evs []ev
			for _, d := range devs("dev-", 20) {
				evs = append(evs, ev{Device: d, Pad: 400})
			}
			h.add("ok-key", evs...)
		}
		for h.sim.Count() < 50*20 {
			if time.Now().After(deadline) {
				t.Fatalf("other lane starved: %d of 1000 delivered; %+v", h.sim.Count(), h.p.LaneStatus())
			}
			// The stuck lane's share and what the other lane reads while it
			// holds nothing: the total, passed by at most one read's
			// rounding (a buffer size class, a record's item).
			if used := h.p.budget.Used(); used > limit+limit/4+2*(600+itemBytes) {
				t.Fatalf("total read-ahead %d, limit %d: %+v", used, limit, h.p.LaneStatus())
			}
			time.Sleep(2 * time.Millisecond)
		}
		stuckID, okID := h.lane("stuck-key", "").ID(), h.lane("ok-key", "").ID()
		status := func(id uint64) LaneStatus {
			for _, st := range h.p.LaneStatus() {
				if st.ID == id {
					return st
				}
			}
			t.Fatalf("no lane %d", id)
			return LaneStatus{}
		}
		for status(okID).ReadAheadBytes != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("delivered lane still accounts read-ahead: %+v", status(okID))
			}
			time.Sleep(5 * time.Millisecond)
		}
		if st := status(stuckID); st.HeldEvents == 0 || st.ReadAheadBytes > limit+limit/8+2*(600+itemBytes) {
			t.Fatalf("stuck lane: %+v (limit %d)", st, limit)
		}
		h.stop()
		stuck := map[string]bool{}
		for id, se := range h.appended {
			if se.apiKey == "stuck-key" {
				stuck[id] = true
			}
		}
		h.check(stuck)
	})
}

// While the upstream is down (every shard retrying), the lane stops
// reading: from the start it reads one chunk, not its budget; when the
// upstream goes down later it keeps what it had read and reads no more (the
// window opens with progress only). Once the upstream is back everything is
// delivered.
func TestOutageStopsReadAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit = 1 << 20
		h := newSyncHarness(t, sim.Config{}, Config{Live: Live{MaxBatchEvents: 50}, MaxReadAheadBytes: limit, ShardsPerLane: 2,
			RetryInitial: 100 * time.Millisecond}, throttle.Config{})
		for i, mode := range []simtest.DownMode{simtest.Down503, simtest.DownRefuse} {
			h.down(mode, time.Minute)
			for c := 0; c < 100; c++ { // 100 chunks of ~25 KB: twice the budget
				var evs []ev
				for _, d := range devs("dev-", 20) {
					evs = append(evs, ev{Device: d, Pad: 1000})
				}
				h.add("key", evs...)
			}
			if i == 0 {
				h.start()
			}
			deadline := time.Now().Add(polltest.Max)
			for lr := h.p.lane(h.lane("key", "").ID()); lr == nil || lr.failing.Load() < 2; lr = h.p.lane(h.lane("key", "").ID()) {
				if time.Now().After(deadline) {
					t.Fatalf("%s: the shards did not start retrying", mode)
				}
				time.Sleep(5 * time.Millisecond)
			}
			first := h.p.LaneStatus()[0].ReadAheadBytes
			time.Sleep(300 * time.Millisecond) // three retries
			st := h.p.LaneStatus()[0]
			const chunk = minWindow + 8<<10 // the least window, passed by one record's rounding
			switch {
			case i == 0 && st.ReadAheadBytes > chunk:
				t.Fatalf("%s from the start: read-ahead %d bytes, want about the least window (%d)", mode, st.ReadAheadBytes, chunk)
			case st.ReadAheadBytes != first || st.ReadAheadBytes > limit+limit/8+chunk:
				t.Fatalf("%s: read-ahead %d bytes, then %d during the outage, want no more reading (budget %d)", mode, first, st.ReadAheadBytes, limit)
			}
			h.up()
			h.waitDrained(20*time.Second, 0)
		}
		h.stop()
		h.check(nil)
	})
}

// A read-ahead budget smaller than the shards' batches: the reader waits
// for the budget while every shard waits for a full batch. The shards must
// send what they have then, not once per flush interval (20 s here: the
// ~1 MB below would take over 4 minutes that way, against a few seconds
// and at most one interval for the last partial batches: waitDrained's
// polltest.Max, in fake time, tells the two apart).
func TestSmallBudgetDoesNotWaitForFlush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSyncHarness(t, sim.Config{}, Config{Live: Live{MaxBatchEvents: 1000, FlushInterval: 20 * time.Second},
			MaxReadAheadBytes: 64 << 10, ShardsPerLane: 4}, throttle.Config{})
		for c := 0; c < 100; c++ {
			var evs []ev
			for _, d := range devs(fmt.Sprintf("dev-%d-", c), 20) {
				evs = append(evs, ev{Device: d, Pad: 400})
			}
			h.add("key", evs...)
		}
		start := time.Now()
		h.start()
		h.waitDrained(polltest.Max, 0)
		t.Logf("delivered in %v", time.Since(start))
		h.stop()
		h.check(nil)
	})
}

// 40 lanes, each with one request far larger than a
// lane's read-ahead, and the upstream down: the lanes read their chunks in
// parts, the total stays within its budget (passed by at most a read's
// rounding per lane), the heap does not hold the chunks, and the same after
// a restart; once the upstream is back every event is delivered once, in
// order (a chunk is acknowledged after its last part's records).
func TestLargeChunksStayInBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lanes, perChunk, pad = 40, 1200, 1000 // ~1.3 MB per chunk, ~50 MB in all
		const laneLimit, total = 256 << 10, 1 << 20
		defer func(l zapcore.Level) { harnessLogLevel = l }(harnessLogLevel)
		harnessLogLevel = zapcore.ErrorLevel
		// Batches of 50 events (~50 KB): the 80 shards' bodies in flight are
		// ~4 MB, well apart from the ~50 MB the chunks would hold.
		h := newSyncHarness(t, sim.Config{}, Config{MaxReadAheadBytes: laneLimit, MaxReadAheadTotalBytes: total, ShardsPerLane: 2,
			Live: Live{MaxBatchEvents: 50}, RetryInitial: 50 * time.Millisecond}, throttle.Config{})
		if err := h.sim.Down(simtest.Down503, 10*time.Minute); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < lanes; i++ {
			evs := make([]ev, perChunk)
			for j := range evs {
				evs[j] = ev{Device: fmt.Sprintf("dev-%d", j%50), Pad: pad}
			}
			h.add(fmt.Sprintf("big-%02d", i), evs...)
		}
		bound := int64(total + total/4)
		// heap is the live heap as the last GC marked it: HeapInuse (or
		// HeapAlloc) read after runtime.GC also counts what the 80 retrying
		// shards allocated since, which beside two CPU hogs (the test's
		// goroutine descheduled between the two calls) came to 17-33 MiB
		// while heap profiles showed the live objects 5-7 MB larger.
		heap := func() uint64 {
			runtime.GC()
			runtime.GC() // and the pools' victims
			live := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
			rtmetrics.Read(live)
			return live[0].Value.Uint64()
		}
		time.Sleep(time.Second) // the spool moves the chunks from memory to bbolt
		base := heap()          // the test's own copies of the events are most of it
		check := func(when string, base uint64) {
			t.Helper()
			deadline := time.Now().Add(polltest.Max)
			for h.send.calls.Load() < 2*lanes && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			for range 20 { // a second of sampling while every lane retries
				if used := h.p.budget.Used(); used > bound {
					t.Fatalf("%s: read-ahead %d bytes, budget %d (bound %d)", when, used, total, bound)
				}
				for _, st := range h.p.LaneStatus() {
					if st.ReadAheadBytes > laneLimit+laneLimit/4 {
						t.Fatalf("%s: lane %s holds %d bytes, its budget %d", when, st.Label, st.ReadAheadBytes, laneLimit)
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			live := heap()
			t.Logf("%s: read-ahead %d bytes, live heap %d MiB (%d MiB before delivery started)", when, h.p.budget.Used(), live>>20, base>>20)
			// The chunks are ~50 MB; holding one each (as before) would grow
			// the heap by that much. The bound is half of it.
			if live > base+25<<20 {
				t.Errorf("%s: live heap %d MiB, %d MiB before: the chunks are held", when, live>>20, base>>20)
			}
		}
		h.start()
		check("upstream down", base)
		h.restart()
		// The reopened spool's own structures are not the delivery's holding.
		base = heap()
		h.start()
		check("after a restart", base)
		if err := h.sim.Up(); err != nil {
			t.Fatal(err)
		}
		// ~50 MB through a 1 MB read-ahead: 15 s on a quiet machine, over
		// 2 minutes at a load average of 30 under the race detector; a lane
		// that stalls never drains.
		h.waitDrained(2*polltest.Max, 0)
		h.stop()
		h.check(nil)
	})
}
