// Package fleet holds the process-level tests of fleet mode: a
// 3-node NATS JetStream cluster of real nats-server processes, the
// simulated upstream (`relay sim`) and two or three relay processes with
// --spool nats://..., all on 127.0.0.1. Under load, a relay is killed with
// SIGKILL, a NATS node (the events stream's leader) is killed and
// restarted, or both at once; the simulator's store and request log must
// then show every event a relay answered 200 delivered, each device's
// events in order, no event stored twice (a re-send carries the same
// insert_id, which the upstream deduplicates), and no device sent inside
// the pause a 429 named it in, from any relay.
//
// Every wait polls a condition under a deadline; the load is paced but
// nothing synchronises on a fixed sleep.
package fleet

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/test/e2e/harness"
)

const (
	apiKey      = "fleet-test-api-key"
	partitions  = 8
	pause       = 2 * time.Second // the relays' --throttle-pause and the sim's penalty
	coldClients = 6
	devsPerCold = 12 // a cold client rotates over its devices: each stays under the rate limit
	hotDevice   = "hot-device"
)

// localSpool runs the same load on relays that each keep their own local
// spool, no fleet: a check that the suite fails without fleet mode (a 429
// seen by one relay does not pause the device on the others, and a
// device's events split over relays lose their order). NATS nodes are
// still started, and killed by NodeKilled's turn (the relays do not use them).
var localSpool = flag.Bool("local-spool", false, "run the relays on local spools (the suite must then fail)")

// outcome of one event, as its client saw it.
type outcome uint8

const (
	unknown  outcome = iota // no answer, or a 5xx: may or may not be stored
	accepted                // 200: must reach the upstream
	rejected                // 4xx: a bug here (every event is valid)
)

// sentEvent is one event a client sent.
type sentEvent struct {
	device   string
	seq      int    // per device, from 1
	insertID string // "" when the client sent none (the relay fills one)
	out      outcome
	// For the report of a violation: the relays tried (in order) and
	// when the last answer came.
	tried []int
	at    time.Time
}

// evKey names an event by device and seq (what event_properties carry).
func evKey(device string, seq int) string { return fmt.Sprintf("%s#%d", device, seq) }

// relayProc is one relay of the fleet; its addresses and data dir stay
// the same across restarts.
type relayProc struct {
	idx                 int
	listen, adminListen string
	dataDir, log        string
	p                   *proc
	// upstream is the relay's --ingest-url: the sim, or a proxy in
	// front of it that records what this relay sent (chaos_test.go).
	upstream string
	// down takes the relay out of the clients' rotation (as a load
	// balancer does with a relay that fails its health check).
	down atomic.Bool
}

// env is what every scenario shares: the binaries.
type env struct {
	relayBin, natsBin string
}

// TestFleet runs the fleet scenarios, each on a fresh cluster. The
// package's tests run in parallel (each on its own processes and ports),
// two at a time unless -parallel says otherwise: most of their time is
// waits (lease expiries, elections, pauses), not CPU.
func TestFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server, sim and relay processes; skipped under -short")
	}
	t.Parallel()
	e := binaries(t)
	t.Run("RelayKilled", func(t *testing.T) { t.Parallel(); runScenario(t, e, scenario{relays: 3, killRelay: true}) })
	t.Run("NodeKilled", func(t *testing.T) { t.Parallel(); runScenario(t, e, scenario{relays: 2, killNode: true}) })
	t.Run("Both", func(t *testing.T) {
		t.Parallel()
		runScenario(t, e, scenario{relays: 3, killRelay: true, killNode: true})
	})
}

type scenario struct {
	relays              int
	killRelay, killNode bool
}

// fleetRun is one scenario's processes and the clients' record.
type fleetRun struct {
	t       *testing.T
	e       env
	dir     string
	cluster *natsCluster
	sim     *harness.Sim
	relays  []*relayProc

	mu       sync.Mutex
	events   map[string]*sentEvent // by evKey
	accepted atomic.Int64
	reqs     atomic.Int64
	statuses sync.Map // status code -> *atomic.Int64
	// throttlePause is the relays' --throttle-pause; 0 means pause.
	throttlePause time.Duration
	// hotBurst, when set, makes the hot client send in bursts of that
	// long, each followed by as long a rest (a long run's hot backlog
	// then drains as it goes).
	hotBurst time.Duration

	// What the sim stored so far (waitDelivered's, read on from after).
	stored []storedEvent
	have   map[string]bool
	after  int64
}

func runScenario(t *testing.T, e env, sc scenario) {
	start := time.Now()
	dir := t.TempDir()
	r := &fleetRun{t: t, e: e, dir: dir, events: map[string]*sentEvent{}}
	r.cluster = startCluster(t, e.natsBin, dir)
	t.Logf("nats cluster ready in %v", time.Since(start).Round(time.Millisecond))
	// Lenient rate over a 1 s window: a device above 20 events/s is
	// answered 429 and penalised for the relays' pause; one large batch
	// after the pause is taken, so a paused backlog drains.
	r.sim = harness.StartSim(t, e.relayBin, dir, "--eps-threshold", "20", "--rate-window", "1s",
		"--throttle-penalty", pause.String(), "--lenient-rate")
	for i := range sc.relays {
		r.relays = append(r.relays, &relayProc{
			idx: i, listen: harness.FreeAddr(t), adminListen: harness.FreeAddr(t),
			dataDir: filepath.Join(dir, fmt.Sprintf("relay%d", i)), log: filepath.Join(dir, fmt.Sprintf("relay%d.log", i)),
		})
	}
	stop := r.serveUnderLoad()
	t.Logf("%d relays serving at %v", sc.relays, time.Since(start).Round(time.Millisecond))

	r.waitLoad(300, 0, polltest.Max, "before the failure")
	r.waitSpread(polltest.Max)
	victim, node := -1, -1
	if sc.killRelay {
		victim = 0
		// Mid-delivery: the victim holds messages read and not yet
		// acknowledged (polled; killed anyway after the bound).
		held := r.waitHeld(r.relays[victim], 20*time.Second)
		r.relays[victim].p.kill(t)
		t.Logf("relay %d held %v messages when killed", victim, held)
		t.Logf("killed relay %d (SIGKILL) at %v, %d accepted", victim, time.Since(start).Round(time.Millisecond), r.accepted.Load())
	}
	if sc.killNode {
		node = r.cluster.StreamLeader("RELAY_EVENTS")
		if node < 0 && *localSpool {
			node = 0
		}
		if node < 0 {
			t.Fatal("no leader of RELAY_EVENTS: is the relay publishing to the fleet?")
		}
		r.cluster.Kill(node)
		t.Logf("killed nats %s (leader of RELAY_EVENTS, SIGKILL) at %v", r.cluster.nodes[node].Name, time.Since(start).Round(time.Millisecond))
	}
	// The load goes on through the failure: the surviving relays accept
	// (clients move to another relay), the cluster keeps a quorum.
	r.waitLoad(300, 3*time.Second, polltest.Max, "during the failure")
	if node >= 0 {
		r.cluster.Restart(node, polltest.Max)
		t.Logf("restarted nats %s at %v", r.cluster.nodes[node].Name, time.Since(start).Round(time.Millisecond))
	}
	if victim >= 0 {
		r.startRelay(r.relays[victim])
		t.Logf("restarted relay %d at %v", victim, time.Since(start).Round(time.Millisecond))
	}
	// And after it: partitions move back to the restarted relay while the
	// load flows.
	r.waitLoad(300, 3*time.Second, polltest.Max, "after the recovery")
	r.waitSpread(polltest.Max)
	stop()
	t.Logf("load stopped at %v: %d requests, %d events sent, %d accepted; statuses %s",
		time.Since(start).Round(time.Millisecond), r.reqs.Load(), len(r.events), r.accepted.Load(), r.statusText())

	stored := r.waitDelivered(polltest.Max)
	t.Logf("delivered at %v", time.Since(start).Round(time.Millisecond))
	for _, rp := range r.relays {
		if !rp.p.running() {
			t.Errorf("relay %d exited: %v", rp.idx, rp.p.err)
		}
	}
	r.check(stored)
}

// startRelay starts (or restarts) a relay and waits for its /healthz.
func (r *fleetRun) startRelay(rp *relayProc) {
	r.t.Helper()
	rp.p = startProc(r.t, fmt.Sprintf("relay %d", rp.idx), r.e.relayBin, rp.log, r.relayArgs(rp)...)
	r.waitHealthy(rp)
	if r.t.Failed() {
		r.t.FailNow()
	}
}

// relayArgs is rp's command line.
func (r *fleetRun) relayArgs(rp *relayProc) []string {
	spool := []string{"--spool", r.cluster.URL(), "--spool-partitions", fmt.Sprint(partitions)}
	if *localSpool {
		spool = []string{"--spool", "local"}
	}
	return append([]string{
		"--listen", rp.listen, "--admin-listen", rp.adminListen,
		"--data-dir", rp.dataDir, "--spool-min-free-bytes", "0", "--log-format", "json",
		"--ingest-url", cmp.Or(rp.upstream, r.sim.Base),
		"--throttle-pause", cmp.Or(r.throttlePause, pause).String(), "--flush-interval", "20ms", "--max-batch-events", "200",
		"--drain-timeout", "2s"}, spool...)
}

// waitHealthy waits for rp's /healthz; it fails the test (from any
// goroutine: Errorf, then the caller's wait) when rp exits or after polltest.Max.
func (r *fleetRun) waitHealthy(rp *relayProc) {
	hc := &http.Client{Timeout: time.Second}
	// The relay connects and creates or checks its streams first (30 s at
	// most, more on a loaded machine).
	deadline := time.Now().Add(polltest.Max)
	for get(hc, "http://"+rp.listen+"/healthz") != 200 {
		if !rp.p.running() {
			r.t.Errorf("relay %d exited during start: %v\n%s", rp.idx, rp.p.err, rp.p.tail(4000))
			return
		}
		if time.Now().After(deadline) {
			r.t.Errorf("relay %d not healthy within %v\n%s", rp.idx, polltest.Max, rp.p.tail(4000))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLoad waits until n more events are accepted and at least min has
// passed, failing the test after within.
func (r *fleetRun) waitLoad(n int64, min, within time.Duration, phase string) {
	r.t.Helper()
	t0 := time.Now()
	target := r.accepted.Load() + n
	for r.accepted.Load() < target || time.Since(t0) < min {
		if time.Since(t0) > within {
			r.t.Fatalf("%s: %d of %d more events accepted in %v (statuses %s)", phase, r.accepted.Load()-target+n, n, within, r.statusText())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metric reads the sum of a relay's samples of name (-1 when unreadable).
func (rp *relayProc) metric(name string) float64 {
	v, err := (&harness.Relay{AdminListen: rp.adminListen}).Metric(name)
	if err != nil {
		return -1
	}
	return v
}

// waitSpread waits until the relays own every partition of the events
// stream between them, each relay some, and fails the test after within.
func (r *fleetRun) waitSpread(within time.Duration) {
	r.t.Helper()
	if *localSpool {
		return
	}
	deadline := time.Now().Add(within)
	for {
		var owned []float64
		sum, each := 0.0, true
		for _, rp := range r.relays {
			v := rp.metric("relay_fleet_partitions_owned")
			owned = append(owned, v)
			sum += v
			each = each && v >= 1
		}
		// Events and group identify: these relays have no usermap
		// upstream (--alias-url), so they are not members for that kind
		// and own none of its partitions (fleet membership is per kind).
		if sum == 2*partitions && each {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("partitions owned per relay %v after %v, want 2 x %d (events and group identify) spread over all", owned, within, partitions)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitHeld polls rp's relay_fleet_messages_held until it is above zero
// (within the bound) and returns the last value read.
func (r *fleetRun) waitHeld(rp *relayProc, within time.Duration) float64 {
	if *localSpool {
		return 0
	}
	deadline := time.Now().Add(within)
	for {
		v := rp.metric("relay_fleet_messages_held")
		if v > 0 || time.Now().After(deadline) {
			return v
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r *fleetRun) statusText() string {
	var parts []string
	r.statuses.Range(func(k, v any) bool {
		parts = append(parts, fmt.Sprintf("%v:%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	return strings.Join(parts, " ")
}

func (r *fleetRun) countStatus(code int) {
	v, _ := r.statuses.LoadOrStore(code, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// post sends body to relay i and says how it went: accepted (200 with
// "code":200), rejected (4xx) or unknown (no answer, 5xx).
func (r *fleetRun) post(hc *http.Client, i int, body []byte) outcome {
	r.reqs.Add(1)
	resp, err := hc.Post("http://"+r.relays[i].listen+"/2/httpapi", "application/json", bytes.NewReader(body))
	if err != nil {
		r.countStatus(0)
		return unknown
	}
	b, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	r.countStatus(resp.StatusCode)
	switch {
	case rerr != nil:
		return unknown
	case resp.StatusCode == 200 && bytes.Contains(b, []byte(`"code":200`)):
		return accepted
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		return rejected
	}
	return unknown
}

// record notes the events of one request with their outcome.
func (r *fleetRun) record(evs []*sentEvent, out outcome, tried ...int) {
	now := time.Now()
	r.mu.Lock()
	for _, ev := range evs {
		ev.out = out
		ev.tried, ev.at = tried, now
		r.events[evKey(ev.device, ev.seq)] = ev
	}
	r.mu.Unlock()
	if out == accepted {
		r.accepted.Add(int64(len(evs)))
	}
}

// body is a request of evs, with their insert_ids when they have some.
func body(evs []*sentEvent) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"api_key":%q,"events":[`, apiKey)
	for i, ev := range evs {
		if i > 0 {
			b.WriteByte(',')
		}
		id := ""
		if ev.insertID != "" {
			id = fmt.Sprintf(`"insert_id":%q,`, ev.insertID)
		}
		fmt.Fprintf(&b, `{"event_type":"fleet_test","device_id":%q,%s"event_properties":{"seq":%d}}`, ev.device, id, ev.seq)
	}
	b.WriteString("]}")
	return b.Bytes()
}

// coldClient sends requests of 1-4 events, each request for the next of its
// devices, one at a time, each to the next relay (as a load balancer
// spreads them: a device's events go through every relay). Even clients
// send insert_ids and retry a failed request (the same body) on the next
// relay up to 3 times, as the SDKs do; odd clients send none (the relay
// fills them) and move on.
func (r *fleetRun) coldClient(ctx context.Context, c int) {
	hc := &http.Client{Timeout: 20 * time.Second} // above the relay's publish timeout
	withIDs := c%2 == 0
	seqs := make([]int, devsPerCold)
	next := c
	for n := 0; ctx.Err() == nil; n++ {
		d := n % devsPerCold
		device := fmt.Sprintf("cold-%d-%d", c, d)
		evs := make([]*sentEvent, 1+n%4)
		for i := range evs {
			seqs[d]++
			evs[i] = &sentEvent{device: device, seq: seqs[d]}
			if withIDs {
				evs[i].insertID = fmt.Sprintf("%s-%06d", device, seqs[d])
			}
		}
		b := body(evs)
		out := unknown
		var tried []int
		for try := 0; try < 3 && ctx.Err() == nil; try++ {
			next = r.nextUp(next)
			tried = append(tried, next)
			out = r.post(hc, next, b)
			if out != unknown || !withIDs {
				break
			}
		}
		r.record(evs, out, tried...)
		pace(ctx, 20*time.Millisecond)
	}
}

// hotClient sends events of one device at 25 events/s, a request every
// 200 ms to the next relay: above the sim's 20/s, so the device is answered
// 429 and paused. (Not far above: its backlog drains at the sim's 20/s
// once the load stops, and the suite waits for it.) The rate is kept by
// the clock, not by the requests: on a loaded machine whose answers take
// longer, a request carries what is due (up to 20 events), so the device
// still goes over the sim's rate.
func (r *fleetRun) hotClient(ctx context.Context) {
	const perSecond, most = 25, 20
	hc := &http.Client{Timeout: 20 * time.Second}
	seq := 0
	burst := time.Now()
	start, sent := burst, 0
	for next := 0; ctx.Err() == nil; next = r.nextUp(next) {
		if r.hotBurst > 0 && time.Since(burst) > r.hotBurst {
			pace(ctx, r.hotBurst)
			burst = time.Now()
			start, sent = burst, 0
		}
		n := min(most, max(5, int(time.Since(start).Seconds()*perSecond)-sent))
		sent += n
		evs := make([]*sentEvent, n)
		for i := range evs {
			seq++
			evs[i] = &sentEvent{device: hotDevice, seq: seq, insertID: fmt.Sprintf("hot-%06d", seq)}
		}
		out := r.post(hc, next, body(evs))
		r.record(evs, out, next)
		pace(ctx, 200*time.Millisecond)
	}
}

// nextUp is the next relay after i not taken out of the rotation (i+1
// when every relay is out).
func (r *fleetRun) nextUp(i int) int {
	for j := 1; j <= len(r.relays); j++ {
		if k := (i + j) % len(r.relays); !r.relays[k].down.Load() {
			return k
		}
	}
	return (i + 1) % len(r.relays)
}

// pace waits d or until ctx ends (load pacing, not synchronisation).
func pace(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// storedEvent is one event the sim stored, read back.
type storedEvent struct {
	seq      int64 // the sim's arrival order
	request  int64 // the sim's request that brought it
	device   string
	evSeq    int
	insertID string
}

// waitDelivered reads the sim's store until every event accepted so far is
// in it (the load may go on), and returns the store; it fails the test
// after within.
func (r *fleetRun) waitDelivered(within time.Duration) []storedEvent {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	want := map[string]*sentEvent{}
	r.mu.Lock()
	for k, ev := range r.events {
		if ev.out == accepted {
			want[k] = ev
		}
	}
	r.mu.Unlock()
	if r.have == nil {
		r.have = map[string]bool{}
	}
	lastLog := time.Now()
	for {
		evs, err := r.sim.Ctl.Events(ctx, apiKey, r.after)
		if err != nil && ctx.Err() == nil {
			r.t.Fatalf("sim events: %v", err)
		}
		for _, e := range evs {
			r.after = max(r.after, e.Seq)
			var raw struct {
				EventProperties struct {
					Seq int `json:"seq"`
				} `json:"event_properties"`
			}
			if err := json.Unmarshal(e.Raw, &raw); err != nil {
				r.t.Fatalf("sim event %d: %v: %s", e.Seq, err, e.Raw)
			}
			r.stored = append(r.stored, storedEvent{seq: e.Seq, request: e.Request, device: e.DeviceID, evSeq: raw.EventProperties.Seq, insertID: e.InsertID})
			r.have[evKey(e.DeviceID, raw.EventProperties.Seq)] = true
		}
		missing := 0
		var example string
		devs := map[string]int{}
		for k, ev := range want {
			if !r.have[k] {
				missing++
				example = k
				devs[ev.device]++
			}
		}
		if missing == 0 {
			return r.stored
		}
		if time.Since(lastLog) > 5*time.Second {
			lastLog = time.Now()
			r.t.Logf("waiting for %d accepted events of %d devices (e.g. %s)", missing, len(devs), example)
		}
		if ctx.Err() != nil {
			r.t.Fatalf("%d accepted events not delivered within %v (e.g. %s); statuses %s", missing, within, example, r.statusText())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// check asserts the invariants on what the sim stored and saw.
func (r *fleetRun) check(stored []storedEvent) {
	t := r.t
	// Violations by kind, the first few of each kept for the report.
	var kinds []string
	shown := map[string][]string{}
	counts := map[string]int{}
	bad := func(kind, format string, args ...any) {
		if counts[kind] == 0 {
			kinds = append(kinds, kind)
		}
		counts[kind]++
		if len(shown[kind]) < 8 {
			shown[kind] = append(shown[kind], fmt.Sprintf(format, args...))
		}
	}

	// Each event stored at most once (a re-send with the same insert_id is
	// dropped by the sim's dedup; a second copy means a new insert_id),
	// unchanged, and only events that were sent and not refused.
	count := map[string]int{}
	for _, s := range stored {
		k := evKey(s.device, s.evSeq)
		count[k]++
		ev, ok := r.events[k]
		switch {
		case !ok:
			bad("unknown event", "%s: stored but never sent", k)
		case ev.out == rejected:
			bad("refused yet delivered", "%s: answered 4xx yet delivered", k)
		case ev.insertID != "" && s.insertID != ev.insertID:
			bad("insert_id changed", "%s: insert_id %q delivered, %q sent", k, s.insertID, ev.insertID)
		case ev.insertID == "" && s.insertID == "":
			bad("no insert_id", "%s: delivered without the insert_id the relay fills", k)
		}
		if count[k] == 2 {
			bad("duplicate", "%s: delivered twice under different insert_ids (a duplicate that is not a re-send)", k)
		}
	}
	var nAcc, nUnknown, nUnknownKept, nRej int
	for k, ev := range r.events {
		switch ev.out {
		case accepted:
			nAcc++
			if count[k] == 0 {
				bad("lost", "%s: answered 200, never delivered", k)
			}
		case unknown:
			nUnknown++
			if count[k] > 0 {
				nUnknownKept++
			}
		case rejected:
			nRej++
		}
	}

	// Per-device order: an accepted event must not reach the upstream
	// after a later event of its device. (An event without an answer may:
	// its relay died during the publish, while its client went on.)
	last := map[string]int{}
	reordered := 0
	var orderDev string
	for _, s := range stored {
		if prev, ok := last[s.device]; ok && s.evSeq < prev {
			if r.events[evKey(s.device, s.evSeq)].out == accepted {
				bad("order", "%s: seq %d delivered after seq %d (order broken)", s.device, s.evSeq, prev)
				if orderDev == "" {
					orderDev = s.device
				}
			} else {
				reordered++
			}
		}
		last[s.device] = max(last[s.device], s.evSeq)
	}

	// No device sent inside a pause: after a 429 naming it, no request of
	// any relay holds it before the pause has passed.
	recs, err := r.sim.Ctl.Requests(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if orderDev != "" {
		r.explain(orderDev, stored, recs)
	}
	const slack = 2 * time.Millisecond // the sim's clock read in one process, on one machine
	windows := 0
	for i, rc := range recs {
		if rc.Status != 429 {
			continue
		}
		for _, ks := range rc.Throttled {
			dev, ok := strings.CutPrefix(ks.Key, "d:")
			if !ok {
				continue
			}
			windows++
			until := rc.Time.Add(pause - slack)
			for _, later := range recs[i+1:] {
				if later.Time.Before(until) && later.Time.After(rc.Time) && slices.Contains(later.Devices, dev) {
					bad("inside a pause", "request %d holds %s %v after the 429 of request %d: inside its %v pause", later.Seq, dev, later.Time.Sub(rc.Time), rc.Seq, pause)
				}
			}
		}
	}
	st, err := r.sim.Ctl.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d events sent: %d accepted, %d without answer (%d of them delivered), %d rejected; %d stored, %d re-sends dropped by the sim's dedup, %d upstream requests %v, %d 429 windows checked, %d unanswered events out of order",
		len(r.events), nAcc, nUnknown, nUnknownKept, nRej, len(stored), st.Duplicates, len(recs), st.ByStatus, windows, reordered)
	for _, k := range kinds {
		t.Errorf("%d violations (%s), the first:\n%s", counts[k], k, strings.Join(shown[k], "\n"))
	}
	if nRej > 0 {
		t.Errorf("%d valid events answered 4xx", nRej)
	}
	if windows == 0 {
		t.Errorf("no 429 named a device: the pause check proved nothing")
	}
	if nAcc < 900 {
		t.Errorf("only %d events accepted: the test proved little", nAcc)
	}
}

// TestFleetConcurrentStart starts two relays at the same moment on a
// fresh cluster, as a Deployment's first rollout does: both must serve
// (both create the streams and buckets, racing).
//
// Before fc3842e (fleet.Open: each create bounded and retried) both relays
// timed out creating the dead-letter stream after 30 s and exited, every run.
func TestFleetConcurrentStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server, sim and relay processes; skipped under -short")
	}
	t.Parallel()
	e := binaries(t)
	dir := t.TempDir()
	r := &fleetRun{t: t, e: e, dir: dir, events: map[string]*sentEvent{}}
	r.cluster = startCluster(t, e.natsBin, dir)
	r.sim = harness.StartSim(t, e.relayBin, dir)
	for i := range 2 {
		r.relays = append(r.relays, &relayProc{
			idx: i, listen: harness.FreeAddr(t), adminListen: harness.FreeAddr(t),
			dataDir: filepath.Join(dir, fmt.Sprintf("relay%d", i)), log: filepath.Join(dir, fmt.Sprintf("relay%d.log", i)),
		})
	}
	var wg sync.WaitGroup
	for _, rp := range r.relays {
		rp.p = startProc(t, fmt.Sprintf("relay %d", rp.idx), e.relayBin, rp.log, r.relayArgs(rp)...)
	}
	for _, rp := range r.relays {
		wg.Go(func() { r.waitHealthy(rp) })
	}
	wg.Wait()
}

// explain logs what the clients and the sim saw of one device: each event
// as sent (outcome, relays tried, time of the answer) and as stored (the
// sim's request), and every sim request that held the device.
func (r *fleetRun) explain(dev string, stored []storedEvent, recs []sim.Record) {
	var b strings.Builder
	fmt.Fprintf(&b, "device %s, in the order the sim stored its events:\n", dev)
	for _, s := range stored {
		if s.device != dev {
			continue
		}
		ev := r.events[evKey(s.device, s.evSeq)]
		fmt.Fprintf(&b, "  seq %d: sim event %d of request %d; client: outcome %d via relays %v, answered %s\n",
			s.evSeq, s.seq, s.request, ev.out, ev.tried, ev.at.Format("15:04:05.000"))
	}
	fmt.Fprintf(&b, "sim requests holding %s:\n", dev)
	for _, rc := range recs {
		if slices.Contains(rc.Devices, dev) {
			fmt.Fprintf(&b, "  request %d at %s: %d, %d events, ingested %d, duplicates %d, throttled %v\n",
				rc.Seq, rc.Time.Format("15:04:05.000"), rc.Status, rc.Events, rc.Ingested, rc.Duplicates, rc.Throttled)
		}
	}
	r.t.Log(b.String())
}

// serveUnderLoad starts every relay and the cold and hot clients. The
// returned stop ends the load and waits for the clients (calling it again
// does nothing); it also runs when the test ends, after the relays' and the
// cluster's log tails are printed if the test failed.
func (r *fleetRun) serveUnderLoad() (stop func()) {
	t := r.t
	for _, rp := range r.relays {
		r.startRelay(rp)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, rp := range r.relays {
				t.Logf("relay %d log tail:\n%s", rp.idx, rp.p.tail(4000))
			}
			t.Log(r.cluster.logTails(2000))
		}
	})
	ctx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range coldClients {
		wg.Go(func() { r.coldClient(ctx, i) })
	}
	wg.Go(func() { r.hotClient(ctx) })
	var once sync.Once
	stop = func() { once.Do(func() { stopLoad(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}
