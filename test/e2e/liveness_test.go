package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// TestLivenessWithKills runs the real binary against `relay sim` under the
// strict reading of the rate rule (a request's own events count, window 2 s)
// and the lenient one: 200 cold devices and users, three devices and one
// user (over four devices) well above 30 events/s for 10 s, an outage of
// 1.5 s, 3% of 503s that ingest half of their request, and three SIGKILLs of
// the relay during the load. After the load stops every acknowledged event
// arrives (once, in order per device) within its key's backlog at the pace
// plus the pauses (with slack for a loaded machine); no key is sent inside
// its pause within a life of the relay (a killed relay forgets its pauses:
// the first request of the next life may meet the upstream's penalty); no
// key is refused twice in a row with the same share; refusals per key stay
// few. The synctest twin (internal/delivery TestLiveness) checks the same
// without slack, in fake time.
func TestLivenessWithKills(t *testing.T) {
	if testing.Short() {
		t.Skip("binary-level test; skipped under -short")
	}
	t.Parallel()
	bin := harness.Build(t)
	// One reading after the other: each load must keep its pace (hot
	// devices above the rate) for the test to prove anything.
	for _, reading := range []string{"strict", "lenient"} {
		t.Run(reading, func(t *testing.T) { livenessRun(t, bin, reading == "lenient") })
	}
}

const livenessKey = "e2e-liveness-key"

type livenessEvent struct {
	order string // "d:"+device, or "u:"+user without device
	idx   int    // its place among the order key's acknowledged events
}

func livenessRun(t *testing.T, bin string, lenient bool) {
	const (
		pause   = 3 * time.Second
		penalty = 3 * time.Second
		eps     = 30
		loadFor = 10 * time.Second
		tick    = 100 * time.Millisecond
		clients = 4
		kills   = 3
		// A request in flight when the relay reads a 429 (another shard's)
		// may still arrive after it: requests this soon after a 429 are not
		// held against the pause. Far shorter than the pause, so a relay
		// that does not check pauses across shards is still caught.
		inFlightSlack = time.Second
	)
	dir := t.TempDir()
	simArgs := []string{"--eps-threshold", fmt.Sprint(eps), "--rate-window", "2s", "--throttle-penalty", penalty.String()}
	if lenient {
		simArgs = append(simArgs, "--lenient-rate")
	}
	sm := harness.StartFaultSim(t, dir, simArgs...)
	bg := context.Background()
	if err := sm.Ctl.Inject(bg, simtest.FaultSpec{Status: 503, Fraction: 0.03, Count: -1, Ingest: "half"}); err != nil {
		t.Fatal(err)
	}
	opts := &harness.RelayOpts{
		DataDir:   filepath.Join(dir, "data"),
		IngestURL: sm.Base,
		Extra: []string{"--flush-interval", "50ms", "--throttle-pause", pause.String(),
			"--drain-timeout", "1s", "--sync", "none"},
	}
	r := harness.StartRelay(t, bin, dir, opts)
	lives := []time.Time{time.Now()}
	var rmu sync.Mutex // guards r
	relay := func() *harness.Relay { rmu.Lock(); defer rmu.Unlock(); return r }

	// Each client owns its order keys, so their acceptance order is the
	// order it posts them in.
	var mu sync.Mutex
	acked := map[string]livenessEvent{} // insert_id -> its place
	ackedPer := map[string]int{}        // order key -> acknowledged events
	perKey := map[string]int{}          // device/user key -> acknowledged events
	devUsers := map[string]map[string]bool{}
	hc := &http.Client{Timeout: 5 * time.Second}
	ctx, stopLoad := context.WithTimeout(bg, loadFor)
	defer stopLoad()
	var wg sync.WaitGroup
	for c := range clients {
		rng := rand.New(rand.NewPCG(uint64(c), 42))
		wg.Go(func() {
			seq := 0
			for ctx.Err() == nil {
				type pending struct{ id, order, dev, user string }
				var evs []string
				var pend []pending
				add := func(dev, user string) {
					seq++
					id := fmt.Sprintf("c%d-%d", c, seq)
					order := "d:" + dev
					var b strings.Builder
					fmt.Fprintf(&b, `{"event_type":"t","insert_id":%q`, id)
					if dev != "" {
						fmt.Fprintf(&b, `,"device_id":%q`, dev)
					} else {
						order = "u:" + user
					}
					if user != "" {
						fmt.Fprintf(&b, `,"user_id":%q`, user)
					}
					b.WriteString("}")
					evs = append(evs, b.String())
					pend = append(pend, pending{id, order, dev, user})
				}
				for i := c; i < 200; i += clients { // cold: 0.5 events/s each
					if rng.Float64() < 0.5*tick.Seconds() {
						switch {
						case i%10 == 3:
							add("", fmt.Sprintf("lone-user-%03d", i))
						case i%2 == 0:
							add(fmt.Sprintf("cold-dev-%03d", i), fmt.Sprintf("cold-user-%03d", i))
						default:
							add(fmt.Sprintf("cold-dev-%03d", i), "")
						}
					}
				}
				if c < 3 { // three hot devices at 45/s
					for range 4 + rng.IntN(2) {
						add(fmt.Sprintf("hot-dev-%d", c), "")
					}
				}
				if c == 3 { // a hot user at 40/s over four devices
					for j := range 4 {
						add(fmt.Sprintf("hot-user-dev-%d", j), "hot-user")
					}
				}
				body := fmt.Sprintf(`{"api_key":%q,"events":[%s]}`, livenessKey, strings.Join(evs, ","))
				code, _, err := relay().Post(hc, "/2/httpapi", []byte(body))
				if err == nil && code == 200 {
					mu.Lock()
					for _, p := range pend {
						acked[p.id] = livenessEvent{order: p.order, idx: ackedPer[p.order]}
						ackedPer[p.order]++
						if p.dev != "" {
							perKey["d:"+p.dev]++
						}
						if p.user != "" {
							perKey["u:"+p.user]++
						}
						if p.dev != "" && p.user != "" {
							if devUsers["d:"+p.dev] == nil {
								devUsers["d:"+p.dev] = map[string]bool{}
							}
							devUsers["d:"+p.dev]["u:"+p.user] = true
						}
					}
					mu.Unlock()
				}
				select {
				case <-ctx.Done():
				case <-time.After(tick):
				}
			}
		})
	}
	// The outage and the kills, during the load.
	time.Sleep(loadFor / 4)
	for k := range kills {
		if k == 1 {
			if err := sm.Ctl.Down(bg, simtest.Down503, 1500*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		relay().Kill(t)
		rmu.Lock()
		lives = append(lives, time.Now())
		r = harness.StartRelay(t, bin, dir, opts)
		rmu.Unlock()
		time.Sleep(loadFor / 5)
	}
	wg.Wait()
	stopped := time.Now()

	// What had arrived when the load stopped, and the pauses running then.
	arrivedBy := func() (map[string]int, map[string]time.Time, []sim.Ingested) {
		evs, err := sm.Ctl.Events(bg, livenessKey, 0)
		if err != nil {
			t.Fatal(err)
		}
		n := map[string]int{}
		last := map[string]time.Time{}
		for _, e := range evs {
			if _, ok := acked[e.InsertID]; !ok {
				continue
			}
			for _, k := range []string{"d:" + e.DeviceID, "u:" + e.UserID} {
				if len(k) > 2 {
					n[k]++
					if e.Time.After(last[k]) {
						last[k] = e.Time
					}
				}
			}
		}
		return n, last, evs
	}
	atStop, _, _ := arrivedBy()
	recs, err := sm.Ctl.Requests(bg, 0)
	if err != nil {
		t.Fatal(err)
	}
	pausedTill := map[string]time.Time{}
	for _, rc := range recs {
		for _, ks := range rc.Throttled {
			if u := rc.Time.Add(pause); u.After(pausedTill[ks.Key]) {
				pausedTill[ks.Key] = u
			}
		}
	}
	// Per key: its paused time left, its backlog at 0.9*eps (slowed a fifth
	// by failed requests and a loaded machine), a pause and a penalty per
	// refusal after the stop (counted at the end), and polltest.Max of slack for
	// a loaded machine (a livelock never drains, so the slack costs the
	// check nothing); a device carrying a user's events no sooner than the user.
	bound := func(k string, refusedAfter map[string]int) time.Duration {
		b := max(0, pausedTill[k].Sub(stopped)) +
			time.Duration(float64(perKey[k]-atStop[k])/(0.9*eps)*1.2*float64(time.Second)) +
			time.Duration(refusedAfter[k])*(pause+penalty) + polltest.Max
		return b
	}
	var worst time.Duration
	for k := range perKey {
		worst = max(worst, bound(k, map[string]int{k: 4}))
	}
	// Drain, bounded by the worst key's bound with four more refusals.
	var evs []sim.Ingested
	var last map[string]time.Time
	for {
		var n map[string]int
		n, last, evs = arrivedBy()
		missing := 0
		for k, want := range perKey {
			if n[k] < want {
				missing += want - n[k]
			}
		}
		if missing == 0 {
			break
		}
		if time.Since(stopped) > worst {
			t.Fatalf("%d acknowledged events still missing %v after the load stopped\n%s", missing, worst, relay().LogTail(3000))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if recs, err = sm.Ctl.Requests(bg, 0); err != nil {
		t.Fatal(err)
	}

	// Once each, in order per order key.
	next := map[string]int{}
	seen := map[string]bool{}
	for _, e := range evs {
		a, ok := acked[e.InsertID]
		if !ok || seen[e.InsertID] {
			continue // not acknowledged (a kill cut the answer): may or may not arrive
		}
		seen[e.InsertID] = true
		if a.idx < next[a.order] {
			t.Errorf("%s: acknowledged event %d arrived after %d", a.order, a.idx, next[a.order]-1)
		}
		next[a.order] = a.idx + 1
	}
	if len(seen) != len(acked) {
		t.Fatalf("%d of %d acknowledged events arrived", len(seen), len(acked))
	}

	// Pauses, shares, refusals: from the sim's request log.
	lifeOf := func(at time.Time) int {
		i, _ := slices.BinarySearchFunc(lives, at, func(a, b time.Time) int { return a.Compare(b) })
		return i
	}
	type refusal struct {
		at    time.Time
		share int
	}
	pausedAt := map[string]time.Time{}
	lastRefusal := map[string]*refusal{}
	refusals, refusedAfter := map[string]int{}, map[string]int{}
	for _, rc := range recs {
		named := map[string]int{}
		for _, ks := range rc.Throttled {
			named[ks.Key] = ks.Share
		}
		keys := map[string]bool{}
		for _, d := range rc.Devices {
			keys["d:"+d] = true
		}
		for _, u := range rc.Users {
			keys["u:"+u] = true
		}
		for k := range keys {
			if at, ok := pausedAt[k]; ok && rc.Time.After(at.Add(inFlightSlack)) && rc.Time.Before(at.Add(pause)) && lifeOf(at) == lifeOf(rc.Time) {
				t.Errorf("request %d holds %s %v after the 429 that paused it for %v", rc.Seq, k, rc.Time.Sub(at), pause)
			}
			share, refused := named[k]
			if !refused {
				if rc.Status == 200 {
					lastRefusal[k] = nil
				}
				continue
			}
			if l := lastRefusal[k]; l != nil && share > 1 && l.share == share && rc.Time.After(l.at.Add(inFlightSlack)) && lifeOf(l.at) == lifeOf(rc.Time) {
				t.Errorf("%s refused twice in a row with a share of %d (request %d)", k, share, rc.Seq)
			}
			lastRefusal[k] = &refusal{rc.Time, share}
		}
		for k := range named {
			refusals[k]++
			if rc.Time.After(stopped) {
				refusedAfter[k]++
			}
			if at, ok := pausedAt[k]; !ok || rc.Time.After(at.Add(pause)) || lifeOf(at) != lifeOf(rc.Time) {
				pausedAt[k] = rc.Time
			}
		}
	}
	late := 0
	for k := range perKey {
		b := bound(k, refusedAfter)
		for u := range devUsers[k] {
			b = max(b, bound(u, refusedAfter))
		}
		if took := last[k].Sub(stopped); took > b {
			late++
			if late <= 5 {
				t.Errorf("%s: last event %v after the load stopped, bound %v (%d events then pending)", k, took, b, perKey[k]-atStop[k])
			}
		}
	}
	for k, n := range refusals {
		if n > 8*len(lives) {
			t.Errorf("%s refused %d times over %d lives of the relay: not converging", k, n, len(lives))
		}
	}
	t.Logf("%d events acknowledged, %d requests at the sim; drained %v after the load; refusals %v",
		len(acked), len(recs), time.Since(stopped).Round(time.Millisecond), refusals)
	if len(refusals) == 0 {
		t.Errorf("no 429 at all: the test proved little")
	}
	if err := relay().Stop(t, 15*time.Second); err != nil {
		t.Errorf("relay exit after SIGTERM: %v", err)
	}
}
