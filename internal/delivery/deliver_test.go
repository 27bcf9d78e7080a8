package delivery

import (
	"context"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/throttle"
	"github.com/svcrelay/relay/internal/upstream"
)

// Many devices over two lanes (one created while running), batches bounded
// in events and bytes, everything delivered in order and acked.
func TestDeliverBasic(t *testing.T) {
	h := newHarness(t, sim.Config{}, Config{Live: Live{MaxBatchEvents: 50, MaxBatchBytes: 8000, Gzip: true}, ShardsPerLane: 3}, throttle.Config{})
	for c := 0; c < 10; c++ {
		var evs []ev
		for _, d := range devs("device-", 20) {
			evs = append(evs, ev{Device: d, User: "user-" + d})
		}
		h.add("key-one", evs...)
	}
	h.start()
	for c := 0; c < 5; c++ { // a lane created at run time
		h.add("key-two", ev{User: "only-user-1"}, ev{User: "only-user-2"}, ev{Device: "device-x"})
	}
	h.waitDrained(10*time.Second, 0)
	h.stop()
	if dead := h.check(nil); len(dead) != 0 {
		t.Fatalf("dead letters: %v", dead)
	}
	if n := h.sim.Count(); n != 215 {
		t.Fatalf("sim stored %d events, want 215", n)
	}
	for _, r := range h.sim.Requests() {
		if r.Events > 50 || r.BodyBytes >= 8000 || !r.Gzip {
			t.Fatalf("request %d: %d events, %d bytes", r.Seq, r.Events, r.BodyBytes)
		}
	}
	if got := h.metric("relay_delivery_events_delivered_total"); got != 215 {
		t.Fatalf("delivered metric %v", got)
	}
}

// Hot devices above 30 events/s get 429s; they are paused and resent, the
// rest flows, nothing is lost or reordered.
// Under every reading of the rate rule the sim plays.
func TestHotDevices429(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reading sim.Config
	}{
		{"strict", sim.Config{}},
		{"lenient", sim.Config{LenientRate: true}},
		{"across-keys", sim.Config{RateAcrossKeys: true}},
		{"partial", sim.Config{PartialThrottle: true}},
		{"penalty-longer-than-pause", sim.Config{ThrottlePenalty: time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) { hotDevices429(t, tc.reading) })
	}
}

func hotDevices429(t *testing.T, reading sim.Config) {
	if reading.ThrottlePenalty == 0 {
		reading.ThrottlePenalty = 300 * time.Millisecond
	}
	reading.RateWindow = time.Second
	synctest.Test(t, func(t *testing.T) {
		h := newSyncHarness(t, reading,
			Config{Live: Live{MaxBatchEvents: 100, ThrottlePause: 400 * time.Millisecond}}, throttle.Config{})
		h.upstreamReorders = reading.PartialThrottle
		for c := 0; c < 6; c++ {
			var evs []ev
			for i := 0; i < 25; i++ {
				evs = append(evs, ev{Device: "hot-device-1"}, ev{Device: "hot-device-2", User: "hot-user"})
			}
			for _, d := range devs("cold-", 10) {
				evs = append(evs, ev{Device: d})
			}
			h.add("key", evs...)
		}
		h.start()
		h.waitDrained(20*time.Second, 0)
		h.stop()
		if dead := h.check(nil); len(dead) != 0 {
			t.Fatalf("dead letters: %d", len(dead))
		}
		if st := h.sim.Stats(); st.Throttled == 0 {
			t.Fatalf("no 429 happened: %+v", st)
		}
		if h.metric("relay_delivery_events_retried_total") == 0 {
			t.Fatal("retried metric 0")
		}
	})
}

// No request for a paused device or user arrives inside its pause window,
// while other devices are delivered during it.
func TestNoRequestDuringPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const pause = 700 * time.Millisecond
		h := newSyncHarness(t, sim.Config{EPSThreshold: 10, RateWindow: time.Second, ThrottlePenalty: -1},
			Config{Live: Live{MaxBatchEvents: 40, ThrottlePause: pause, FlushInterval: 10 * time.Millisecond}}, throttle.Config{})
		h.start()
		deadline := time.Now().Add(1500 * time.Millisecond)
		for time.Now().Before(deadline) {
			h.add("key", ev{Device: "hot-device", User: "someone"}, ev{Device: "hot-device", User: "someone"},
				ev{User: "hot-user"}, ev{User: "hot-user"},
				ev{Device: "cold-" + time.Now().Format("150405.000")})
			time.Sleep(20 * time.Millisecond)
		}
		h.waitDrained(20*time.Second, 0)
		h.stop()
		h.check(nil)

		reqs := h.sim.Requests()
		h.send.mu.Lock()
		pauses := h.send.pauses
		h.send.mu.Unlock()
		// inWindow: a 429 received before at named the device (user) less than
		// pause ago.
		inWindow := func(at time.Time, dev, user string) bool {
			for _, p := range pauses {
				if !at.After(p.at) || at.Sub(p.at) >= pause {
					continue
				}
				for _, d := range p.devices {
					if d == dev {
						return true
					}
				}
				for _, u := range p.users {
					if u == user {
						return true
					}
				}
			}
			return false
		}
		named := map[string]bool{}
		for _, p := range pauses {
			for _, d := range p.devices {
				named["d:"+d] = true
			}
			for _, u := range p.users {
				named["u:"+u] = true
			}
		}
		if !named["d:hot-device"] || !named["u:hot-user"] {
			t.Fatalf("429s named %v, want the hot device and the hot user", named)
		}
		coldDuring := 0
		for _, r := range reqs {
			for _, d := range r.Devices {
				if inWindow(r.Time, d, "") {
					t.Errorf("request %d (%v) for device %s inside its pause window", r.Seq, r.Time, d)
				}
			}
			for _, u := range r.Users {
				if inWindow(r.Time, "", u) {
					t.Errorf("request %d (%v) for user %s inside its pause window", r.Seq, r.Time, u)
				}
			}
			if r.Status == 200 && !slices.Contains(r.Devices, "hot-device") && !slices.Contains(r.Users, "hot-user") && inWindow(r.Time, "hot-device", "") {
				coldDuring++
			}
		}
		if coldDuring == 0 {
			t.Fatal("no other device was delivered during a pause window")
		}
	})
}

// Silenced devices' events become dead letters ("silenced"); devices over
// their daily quota wait for the next UTC day (held, not dropped, not
// hammered); everything else is delivered.
func TestSilencedAndQuota(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSyncHarness(t, sim.Config{}, Config{Live: Live{MaxBatchEvents: 30}}, throttle.Config{})
		simtest.Silence(h.sim, "silent-device")
		for c := 0; c < 4; c++ {
			var evs []ev
			for _, d := range devs("device-", 10) {
				evs = append(evs, ev{Device: d}, ev{Device: "silent-device"})
			}
			h.add("key", evs...)
		}
		h.start()
		h.waitDrained(10*time.Second, 0)
		dead := h.check(nil)
		if len(dead) != 40 {
			t.Fatalf("%d dead letters, want the 40 silenced", len(dead))
		}
		for id, d := range dead {
			if !strings.Contains(id, "silent-device") || d.Reason != "silenced" || !strings.Contains(string(d.Answer), "silenced") {
				t.Fatalf("dead letter %s: %s %s", id, d.Reason, d.Answer)
			}
		}

		// Daily quota: quota-device reaches it; its later events are held.
		simtest.SetDailyQuota(h.sim, 5)
		var quotaIDs []string
		for i := 0; i < 10; i++ {
			quotaIDs = append(quotaIDs, h.add("key", ev{Device: "quota-device"}, ev{Device: "fresh-" + string(rune('a'+i))})...)
			time.Sleep(30 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond)
		before := len(h.sim.Requests())
		time.Sleep(500 * time.Millisecond)
		for _, r := range h.sim.Requests()[before:] {
			if slices.Contains(r.Devices, "quota-device") {
				t.Fatalf("request %d for the over-quota device while it waits for the next day", r.Seq)
			}
		}
		var st LaneStatus
		for _, s := range h.p.LaneStatus() {
			st = s
		}
		if st.PausedKeys != 1 || st.HeldEvents == 0 {
			t.Fatalf("lane status %+v", st)
		}
		h.stop()
		pending := map[string]bool{}
		atSim := map[string]bool{}
		for _, e := range h.sim.AllEvents() {
			atSim[e.InsertID] = true
		}
		held := 0
		for _, id := range quotaIDs {
			if strings.Contains(id, "quota-device") && !atSim[id] {
				pending[id] = true
				held++
			}
		}
		if held != 5 {
			t.Fatalf("%d quota-device events held, want 5", held)
		}
		if d := h.check(pending); len(d) != 40 {
			t.Fatalf("quota events dead-lettered: %d", len(d))
		}
	})
}

// Invalid events in the middle of batches: exactly they are dead-lettered
// (the API names only the first bad event per field), the rest delivered.
func TestInvalidInMiddle(t *testing.T) {
	h := newHarness(t, sim.Config{}, Config{Live: Live{MaxBatchEvents: 100}, ShardsPerLane: 1}, throttle.Config{})
	var bad = map[string]string{}
	for c := 0; c < 3; c++ {
		var evs []ev
		for i := 0; i < 30; i++ {
			e := ev{Device: devs("device-", 5)[i%5]}
			switch i % 10 {
			case 3:
				e.Extra = `"time":"2024-01-01T00:00:00Z"` // duplicate key: the last wins at the sim
			case 7:
				e.Raw = `{"device_id":"device-missing","insert_id":"missing-` + string(rune('a'+c)) + `-` + string(rune('a'+i)) + `"}`
			}
			evs = append(evs, e)
		}
		ids := h.add("key", evs...)
		for i, id := range ids {
			switch i % 10 {
			case 3:
				bad[id] = "invalid_fields"
			case 7:
				delete(h.appended, id)
				id = "missing-" + string(rune('a'+c)) + "-" + string(rune('a'+i))
				h.appended[id] = sentEvent{apiKey: "key", orderKey: "d:device-missing", idx: c*100 + i}
				bad[id] = "missing_fields"
			}
		}
	}
	h.start()
	h.waitDrained(10*time.Second, 0)
	h.stop()
	dead := h.check(nil)
	if len(dead) != len(bad) {
		t.Fatalf("%d dead letters, want %d", len(dead), len(bad))
	}
	for id, reason := range bad {
		if dead[id].Reason != reason {
			t.Errorf("%s: reason %q, want %q", id, dead[id].Reason, reason)
		}
	}
	if h.sim.Count() != 90-int64(len(bad)) {
		t.Fatalf("sim stored %d", h.sim.Count())
	}
}

// A 400 naming no event (an element that is not an object) is bisected
// until the bad event is isolated.
func TestBadRequestBisect(t *testing.T) {
	h := newHarness(t, sim.Config{}, Config{Live: Live{MaxBatchEvents: 64}, ShardsPerLane: 1}, throttle.Config{})
	var evs []ev
	for i := 0; i < 64; i++ {
		evs = append(evs, ev{Device: "device-" + string(rune('a'+i%7))})
	}
	evs[37] = ev{Raw: `[1,2,3]`, Device: "device-z"}
	ids := h.add("key", evs...)
	delete(h.appended, ids[37])
	h.start()
	h.waitDrained(10*time.Second, 0)
	h.stop()
	dead := h.check(nil)
	if len(dead) != 1 || dead["raw:[1,2,3]"].Reason != "bad_request" {
		t.Fatalf("dead letters %v", dead)
	}
	if n := len(h.sim.Requests()); n > 20 {
		t.Fatalf("%d requests to isolate one bad event among 64", n)
	}
}

// 413: batches are split in halves; a single event too large for the
// upstream or over MaxBatchBytes is a "too_large" dead letter.
func TestTooLarge(t *testing.T) {
	h := newHarness(t, sim.Config{MaxBodyBytes: 20_000}, Config{Live: Live{MaxBatchEvents: 200, MaxBatchBytes: 60_000}, ShardsPerLane: 2}, throttle.Config{})
	var evs []ev
	for i := 0; i < 100; i++ {
		evs = append(evs, ev{Device: devs("device-", 8)[i%8], Pad: 500})
	}
	ids := h.add("key", evs...)
	upTooBig := h.add("key", ev{Device: "device-big", Pad: 30_000})[0]  // fits ours, not the sim's
	ourTooBig := h.add("key", ev{Device: "device-big", Pad: 70_000})[0] // over MaxBatchBytes
	h.add("key", ev{Device: "device-big"})
	h.start()
	h.waitDrained(10*time.Second, 0)
	h.stop()
	dead := h.check(nil)
	if len(dead) != 2 || dead[upTooBig].Reason != "too_large" || dead[ourTooBig].Reason != "too_large" {
		t.Fatalf("dead %v", dead)
	}
	st := h.sim.Stats()
	if st.ByStatus[413] == 0 {
		t.Fatal("no 413 seen")
	}
	_ = ids
}

// 5xx storms and dropped connections (also after ingest: duplicates that
// insert_id dedups): nothing lost, nothing stored twice, order kept.
func TestFaultStorm(t *testing.T) {
	h := newHarness(t, sim.Config{}, Config{Live: Live{MaxBatchEvents: 10}}, throttle.Config{})
	// The sim applies queued faults in order: a storm of 80 requests, about
	// 6 in 10 failing (one-request "passes" in between), mixed kinds.
	storm := []simtest.Fault{{Status: 500}, {Status: 502}, {Status: 503}, {Status: 504},
		{Drop: simtest.DropNoAnswer}, {Drop: simtest.DropAfterIngest}, {Drop: simtest.DropMidResponse},
		{Status: 503, Body: []byte("<html>unavailable</html>")}, {}, {}, {}, {}}
	for i := 0; i < 80; i++ {
		h.sim.Inject(storm[(i*7)%len(storm)])
	}
	h.start()
	for c := 0; c < 20; c++ {
		var evs []ev
		for _, d := range devs("device-", 15) {
			evs = append(evs, ev{Device: d})
		}
		h.add("key", evs...)
	}
	h.waitDrained(30*time.Second, 0)
	h.stop()
	if d := h.check(nil); len(d) != 0 {
		t.Fatalf("dead %d", len(d))
	}
	st := h.sim.Stats()
	faulted := 0
	for _, r := range h.sim.Requests() {
		if r.Fault != "" {
			faulted++
		}
	}
	if faulted < 30 {
		t.Fatalf("only %d faulted requests: %+v", faulted, st)
	}
	t.Logf("requests %d, faulted %d, duplicates deduped %d", st.Requests, faulted, st.Duplicates)
	for _, status := range []string{"200", "500", "502", "503", "504", "error"} {
		if h.metric("relay_upstream_requests_total", "status", status) == 0 {
			t.Errorf("relay_upstream_requests_total{status=%q} is 0", status)
		}
	}
	if h.metric("relay_delivery_events_retried_total") == 0 || h.metric("relay_delivery_events_delivered_total") < 300 {
		t.Error("delivery metrics")
	}
}

// A 10-minute outage (60s backoff cap) compressed 300x: 2s down with a
// 200ms cap (fake time). Requests during it are counted: capped backoff,
// no hammering.
func TestOutageCompressed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const shards = 4
		h := newSyncHarness(t, sim.Config{}, Config{Live: Live{MaxBatchEvents: 50}, ShardsPerLane: shards, RetryInitial: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond}, throttle.Config{})
		h.start()
		h.add("key", ev{Device: "warmup"})
		h.waitDrained(5*time.Second, 0)
		for _, mode := range []simtest.DownMode{simtest.Down503, simtest.DownRefuse} {
			before := h.send.calls.Load()
			h.down(mode, 2*time.Second)
			for c := 0; c < 10; c++ {
				var evs []ev
				for _, d := range devs("device-", 20) {
					evs = append(evs, ev{Device: d})
				}
				h.add("key", evs...)
			}
			time.Sleep(2 * time.Second)
			during := h.send.calls.Load() - before
			// Per shard: about log2(200/20)=4 growing waits, then one try per
			// 100..200ms (jitter 0.5, capped at 200ms): at most ~4+2s/100ms = 24;
			// uncapped hammering would be thousands.
			if max := int64(shards * 24); during > max {
				t.Fatalf("%s: %d requests during a 2s outage, want <= %d", mode, during, max)
			}
			t.Logf("%s: %d requests during the outage", mode, during)
			h.waitDrained(10*time.Second, 0)
		}
		h.stop()
		if d := h.check(nil); len(d) != 0 {
			t.Fatalf("dead %d", len(d))
		}
	})
}

// Invalid API key stops that lane without a retry loop and raises the alert
// gauge; other lanes flow; ResumeLane tries again (once).
func TestInvalidAPIKeyStopsLane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSyncHarness(t, sim.Config{APIKeys: []string{"good-key"}}, Config{ShardsPerLane: 2}, throttle.Config{})
		for i := 0; i < 5; i++ {
			h.add("bad-key", ev{Device: "device-a"}, ev{Device: "device-b"}, ev{Device: "device-c"})
			h.add("good-key", ev{Device: "device-a"})
		}
		h.start()
		time.Sleep(time.Second)
		badReqs := func() int {
			n := 0
			for _, r := range h.sim.Requests() {
				if r.KeyLabel == sim.KeyLabel("bad-key") {
					n++
				}
			}
			return n
		}
		if n := badReqs(); n < 1 || n > 2 { // one per shard at most, then stopped
			t.Fatalf("%d requests with the bad key", n)
		}
		if g := h.metric("relay_lane_stopped"); g != 1 {
			t.Fatalf("relay_lane_stopped %v", g)
		}
		var badLane uint64
		for _, st := range h.p.LaneStatus() {
			if st.Stopped {
				badLane = st.ID
				if st.StopReason != "invalid API key" {
					t.Fatalf("%+v", st)
				}
			}
		}
		h.waitDrained(5*time.Second, 15)
		n := badReqs()
		time.Sleep(500 * time.Millisecond)
		if badReqs() != n {
			t.Fatal("requests while stopped")
		}
		if err := h.p.ResumeLane(badLane); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		if m := badReqs(); m <= n || m > n+2 {
			t.Fatalf("after resume: %d requests (was %d)", m, n)
		}
		if err := h.p.ResumeLane(999); err == nil {
			t.Fatal("resume of unknown lane")
		}
		h.stop()
		pending := map[string]bool{}
		for id, e := range h.appended {
			if e.apiKey == "bad-key" {
				pending[id] = true
			}
		}
		if d := h.check(pending); len(d) != 0 {
			t.Fatalf("dead letters: %v", d)
		}
	})
}

// An event older than MaxEventAge becomes an "expired" dead letter instead
// of another retry.
func TestMaxEventAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSyncHarness(t, sim.Config{}, Config{Live: Live{MaxEventAge: 800 * time.Millisecond}}, throttle.Config{})
		h.sim.Inject(simtest.Fault{Status: 503, Count: -1})
		h.add("key", ev{Device: "device-a"}, ev{Device: "device-b"})
		h.start()
		h.waitDrained(5*time.Second, 0)
		h.stop()
		dead := h.check(nil)
		if len(dead) != 2 {
			t.Fatalf("dead %v", dead)
		}
		for _, d := range dead {
			if d.Reason != "expired" {
				t.Fatalf("reason %q", d.Reason)
			}
		}
		if h.metric("relay_delivery_events_dead_lettered_total", "reason", "expired") != 2 {
			t.Fatal("metric")
		}
	})
}

// Stop: in-flight requests get the drain time-out, then are abandoned;
// unacked events stay in the spool and go out after a restart.
func TestStopDrainAndRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSyncHarness(t, sim.Config{}, Config{DrainTimeout: 200 * time.Millisecond}, throttle.Config{})
		h.add("key", ev{Device: "device-a"}, ev{Device: "device-b"})
		h.sim.SetLatency(1500 * time.Millisecond)
		h.start()
		time.Sleep(300 * time.Millisecond)
		start := time.Now()
		h.stop()
		if el := time.Since(start); el > time.Second {
			t.Fatalf("stop took %v", el)
		}
		h.waitDrained(time.Second, 2) // still in the spool
		h.sim.SetLatency(0)
		time.Sleep(1500 * time.Millisecond) // let the abandoned requests finish at the sim
		h.restart()
		h.start()
		h.waitDrained(5*time.Second, 0)
		h.stop()
		h.check(nil)
	})
}

// Retry-After is honoured but clamped to RetryMax (in fake time: exact).
func TestRetryAfterClamped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeSender{fn: func(ctx context.Context, n int) upstream.Result {
			switch n {
			case 1:
				return upstream.Classify(503, nil, "1", nil)
			case 2:
				return upstream.Classify(503, nil, "3600", nil)
			}
			return upstream.Classify(200, []byte(`{"code":200}`), "", nil)
		}}
		sp, l := openFilled(t, 1)
		defer sp.Close()
		p, err := New(Config{Live: Live{IngestURL: "http://sim", FlushInterval: time.Millisecond}, RetryInitial: 10 * time.Millisecond, RetryMax: 1500 * time.Millisecond}, local(sp), f, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- p.Run(ctx) }()
		for i := 0; i < 1000 && l.Stats().Records != 0; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		<-done
		f.mu.Lock()
		defer f.mu.Unlock()
		times := f.calls
		if len(times) != 3 {
			t.Fatalf("%d requests", len(times))
		}
		if d := times[1].Sub(times[0]); d < time.Second || d > 1600*time.Millisecond {
			t.Fatalf("Retry-After 1 waited %v", d)
		}
		if d := times[2].Sub(times[1]); d != 1500*time.Millisecond {
			t.Fatalf("Retry-After 3600 (clamped to 1.5s) waited %v", d)
		}
	})
}

// Back-pressure: events held for a device paused until tomorrow fill the
// read-ahead; the reader then waits (the rest stays in the spool) and the
// read-ahead stays bounded.
func TestReadAheadBackPressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const max = 20_000
		h := newSyncHarness(t, sim.Config{}, Config{MaxReadAheadBytes: max, ShardsPerLane: 2}, throttle.Config{})
		h.checkReadAheadBackPressure(max)
	})
}

// Everything at once: hot devices and users (429s), a silenced device,
// invalid events, 5xx and dropped connections, two lanes, small batches.
// The invariants must hold all the same.
// (A requeued batch whose key got held by a later event's user pause
// once broke order here.) Under both readings of the rate rule, and with
// the 429 and 5xx answers that ingest part of the request.
func TestChaos(t *testing.T) {
	t.Run("strict", func(t *testing.T) { chaos(t, sim.Config{}) })
	t.Run("lenient", func(t *testing.T) { chaos(t, sim.Config{LenientRate: true}) })
	t.Run("partial", func(t *testing.T) { chaos(t, sim.Config{PartialThrottle: true, PartialSilence: true}) })
}

func chaos(t *testing.T, reading sim.Config) {
	reading.EPSThreshold, reading.RateWindow, reading.ThrottlePenalty = 15, time.Second, 200*time.Millisecond
	h := newHarness(t, reading,
		Config{Live: Live{MaxBatchEvents: 25, MaxBatchBytes: 6000, ThrottlePause: 300 * time.Millisecond}, ShardsPerLane: 3}, throttle.Config{})
	h.upstreamReorders = reading.PartialThrottle || reading.PartialSilence
	simtest.Silence(h.sim, "silent-device")
	storm := []simtest.Fault{{Status: 500}, {}, {Drop: simtest.DropAfterIngest}, {}, {}, {Status: 503}, {Drop: simtest.DropNoAnswer}, {}, {},
		{Status: 502, Ingest: simtest.IngestHalf}, {}, {Status: 504, Ingest: simtest.IngestAll}, {Drop: simtest.DropNoAnswer, Ingest: simtest.IngestHalf}}
	for i := 0; i < 120; i++ {
		h.sim.Inject(storm[i%len(storm)])
	}
	h.start()
	var bad int
	for c := 0; c < 40; c++ {
		var evs []ev
		for i := 0; i < 12; i++ {
			e := ev{Device: devs("device-", 30)[(c*12+i)%30], User: devs("user-", 7)[(c+i)%7]}
			switch {
			case i == 0:
				e = ev{Device: "hot-device", User: "user-hot"}
			case i == 1:
				e = ev{User: "user-hot"}
			case i == 2 && c%5 == 0:
				e = ev{Device: "silent-device"}
			case i == 3 && c%7 == 0:
				e.Extra = `"time":1.5`
				bad++
			}
			evs = append(evs, e)
		}
		lane := "key-a"
		if c%2 == 1 {
			lane = "key-b"
		}
		h.add(lane, evs...)
		time.Sleep(10 * time.Millisecond)
	}
	h.waitDrained(30*time.Second, 0)
	h.stop()
	dead := h.check(nil)
	reasons := map[string]int{}
	for _, d := range dead {
		reasons[d.Reason]++
	}
	if reasons["silenced"] != 8 || reasons["invalid_fields"] != bad || len(dead) != 8+bad {
		t.Fatalf("dead letters by reason %v, want 8 silenced and %d invalid_fields", reasons, bad)
	}
	st := h.sim.Stats()
	if st.Throttled == 0 {
		t.Fatalf("no 429: %+v", st)
	}
	t.Logf("sim: %d requests, %v, %d throttled, %d silenced, %d duplicates", st.Requests, st.ByStatus, st.Throttled, st.Silenced, st.Duplicates)
}

// StopLane pauses a lane for an operator; ResumeLane sends what waited.
// Lanes of other kinds (group identify, usermap) are not delivered here.
func TestStopResumeLaneAndOtherKinds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSyncHarness(t, sim.Config{}, Config{}, throttle.Config{})
		gl, err := h.sp.Lane(context.Background(), storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: "key"})
		if err != nil {
			t.Fatal(err)
		}
		var b storage.Batch
		b.Add(storage.Record{OrderKey: []byte("g"), Data: []byte(`{"group_type":"org","group_value":"x"}`)})
		if err := h.sp.Append(context.Background(), gl, &b); err != nil {
			t.Fatal(err)
		}
		h.add("key", ev{Device: "device-a"})
		h.start()
		h.waitDrained(5*time.Second, 1) // the group identify record stays
		var id uint64
		for _, st := range h.p.LaneStatus() {
			id = st.ID
		}
		if len(h.p.LaneStatus()) != 1 {
			t.Fatalf("lanes %+v", h.p.LaneStatus())
		}
		if err := h.p.StopLane(id); err != nil {
			t.Fatal(err)
		}
		if err := h.p.StopLane(gl.ID()); err == nil {
			t.Fatal("StopLane of a group identify lane")
		}
		n := len(h.sim.Requests())
		h.add("key", ev{Device: "device-a"}, ev{Device: "device-b"})
		time.Sleep(300 * time.Millisecond)
		if st := h.p.LaneStatus()[0]; !st.Stopped || st.StopReason != "stopped by operator" || len(h.sim.Requests()) != n {
			t.Fatalf("status %+v, %d requests (was %d)", st, len(h.sim.Requests()), n)
		}
		if h.metric("relay_lane_stopped") != 1 {
			t.Fatal("gauge")
		}
		if err := h.p.ResumeLane(id); err != nil {
			t.Fatal(err)
		}
		h.waitDrained(5*time.Second, 1)
		h.stop()
		if h.metric("relay_lane_stopped") != 0 {
			t.Fatal("gauge after resume")
		}
		h.check(nil)
	})
}
