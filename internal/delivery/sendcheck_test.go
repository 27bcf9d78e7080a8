package delivery

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/throttle"
	"github.com/svcrelay/relay/internal/upstream"
)

// gateSender holds back the requests whose body contains match until open
// is closed (bounded), then sends them on.
type gateSender struct {
	next  Sender
	match []byte
	open  chan struct{}
}

func (g *gateSender) Do(ctx context.Context, r *upstream.Request) upstream.Result {
	if bytes.Contains(r.Body, g.match) {
		select {
		case <-g.open:
		case <-time.After(time.Minute): // fake time: only when all else waits
		}
	}
	return g.next.Do(ctx, r)
}

// TestSendTimePauseCheck: a 429 of another lane pauses a user of a batch
// after the batch was built and before it is sent (the send-time
// check, pausedSinceBuild); the batch is built again with the user's events
// held, so the user gets nothing until its pause ends, while the batch's
// other events go during the pause. Deterministic, in fake time: lane B's
// shard stops between build and send (the afterBuild hook) until lane A's
// request, held back until B's batch was built, came back 429 naming the
// user.
func TestSendTimePauseCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const pause = time.Second
		// Strict reading, 2 ev/s over 1 s: lane A's request with 3 events
		// of user-one is refused naming user-one (and its device); lane B's
		// single event of user-one (another api_key: counted apart) is not.
		// One shard per lane: lane B's batch carries both its events.
		h := newSyncHarness(t, sim.Config{EPSThreshold: 2, RateWindow: time.Second, ThrottlePenalty: -1},
			Config{Live: Live{ThrottlePause: pause, FlushInterval: 10 * time.Millisecond}, ShardsPerLane: 1}, throttle.Config{})
		ss := h.send.next.(*simSender)
		builtB := make(chan struct{})
		h.send.next = &gateSender{next: ss, match: []byte(`"device_id":"device-A"`), open: builtB}
		var (
			mu        sync.Mutex
			exercised bool // B's batch held user-one when built, and user-one was paused before its send check
		)
		var once sync.Once
		h.p.afterBuild = func(s *shard) {
			carries := false
			for i := range s.batch {
				if string(s.batch[i].rec.OrderKey) == "d:device-B" {
					carries = true
				}
			}
			if !carries {
				return
			}
			once.Do(func() {
				close(builtB) // lane A's request goes now
				ukey := []byte("u:user-one")
				for range 10000 { // 10 s of fake time at most
					if !h.thr.PausedUntil(ukey).IsZero() {
						mu.Lock()
						exercised = true
						mu.Unlock()
						return
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
		h.add("keyA", ev{Device: "device-A", User: "user-one"}, ev{Device: "device-A", User: "user-one"}, ev{Device: "device-A", User: "user-one"})
		h.add("keyB", ev{Device: "device-B", User: "user-one"}, ev{Device: "device-C", User: "user-two"})
		h.start()
		h.waitDrained(time.Minute, 0)
		h.stop()
		h.check(nil)

		mu.Lock()
		ok := exercised
		mu.Unlock()
		if !ok {
			t.Fatal("lane B's batch with user user-one was not built before lane A's 429 paused user-one: the send-time window was not exercised")
		}
		ss.mu.Lock()
		log := append([]sentReq(nil), ss.log...)
		ss.mu.Unlock()
		var at429 time.Time
		var sentB, sentC bool
		for i, r := range log {
			named := false
			for _, k := range r.named {
				named = named || k == "u:user-one"
			}
			if r.res == upstream.Throttled && named && r.shares["d:device-A"] > 0 && at429.IsZero() {
				at429 = r.at
				continue
			}
			if at429.IsZero() {
				if r.shares["u:user-one"] > 0 {
					t.Fatalf("request %d carried user-one before lane A's 429: %+v", i, r)
				}
				continue
			}
			if r.shares["d:device-B"] > 0 {
				sentB = true
				if r.at.Sub(at429) < pause {
					t.Errorf("request %d carried lane B's event of user user-one %v after a 429 paused user-one for %v: %+v", i, r.at.Sub(at429), pause, r)
				}
			}
			if r.shares["d:device-C"] > 0 && r.res == upstream.OK && r.at.Sub(at429) < pause {
				sentC = true
			}
		}
		if at429.IsZero() {
			t.Fatalf("no 429 named user-one for lane A's request; requests: %+v", log)
		}
		if !sentB {
			t.Fatal("lane B's event of user-one was never sent after the 429")
		}
		if !sentC {
			t.Error("lane B's other event (device device-C, user user-two) was not delivered during user-one's pause")
		}
	})
}
