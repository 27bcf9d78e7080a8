package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/fleet"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// TestFleetPauseLostWithItsRelay: the relay that owns a device's
// partition is killed (SIGKILL) after the upstream answered its request
// 429 and before it read the answer, so no pause of the device reaches the
// fleet's pause bucket. The relay that takes the partition over cannot
// know the pause: it sends the device's events once, inside the upstream's
// penalty, and must then pause the device on that 429 like any other,
// sending nothing of it until its own pause ends (no hammering), and
// deliver every event once, in order, after it.
func TestFleetPauseLostWithItsRelay(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server, sim and relay processes; skipped under -short")
	}
	t.Parallel()
	const throttle = 30 * time.Second // the sim's penalty and the relays' pause, as the upstream's document says
	e := binaries(t)
	dir := t.TempDir()
	r := &fleetRun{t: t, e: e, dir: dir, events: map[string]*sentEvent{}, throttlePause: throttle}
	r.cluster = startCluster(t, e.natsBin, dir)
	// 2 events/s over 10 s: the device's first 15 events pass, the next
	// request within 10 s is refused and the device penalised.
	r.sim = harness.StartSim(t, e.relayBin, dir, "--eps-threshold", "2", "--rate-window", "10s",
		"--throttle-penalty", throttle.String())
	var victim atomic.Pointer[relayProc]
	var killedAt atomic.Pointer[time.Time]
	for i := range 2 {
		rp := &relayProc{
			idx: i, listen: harness.FreeAddr(t), adminListen: harness.FreeAddr(t),
			dataDir: filepath.Join(dir, fmt.Sprintf("relay%d", i)), log: filepath.Join(dir, fmt.Sprintf("relay%d.log", i)),
		}
		rp.upstream = killOn429(t, r.sim.Base, func() *relayProc {
			if v := victim.Load(); v == rp {
				return v
			}
			return nil
		}, func(at time.Time) { killedAt.Store(&at) })
		r.relays = append(r.relays, rp)
	}
	for _, rp := range r.relays {
		r.startRelay(rp)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, rp := range r.relays {
				t.Logf("relay %d log tail:\n%s", rp.idx, rp.p.tail(4000))
			}
		}
	})
	r.waitSpread(polltest.Max)

	const dev = "lost-device"
	part := fleet.PartitionOf([]byte(event.DeviceKeyPrefix+dev), partitions)
	takes := r.takings()[part]
	if len(takes) == 0 {
		t.Fatalf("no relay logged taking events partition %d", part)
	}
	owner := r.relays[takes[len(takes)-1].relay]
	other := r.relays[1-owner.idx]
	victim.Store(owner)
	t.Logf("%s is in partition %d, delivered by relay %d", dev, part, owner.idx)

	hc := &http.Client{Timeout: polltest.Max}
	evs := make([]*sentEvent, 25)
	for i := range evs {
		evs[i] = &sentEvent{device: dev, seq: i + 1, insertID: fmt.Sprintf("%s-%02d", dev, i+1)}
	}
	send := func(evs []*sentEvent) {
		t.Helper()
		if out := r.post(hc, other.idx, body(evs)); out != accepted {
			t.Fatalf("relay %d did not accept the device's events (%v)", other.idx, out)
		}
		r.record(evs, accepted, other.idx)
	}
	send(evs[:15])
	r.waitDelivered(polltest.Max)
	send(evs[15:])
	polltest.Until(t, "the owner killed on the upstream's 429", func() bool { return killedAt.Load() != nil })
	t.Logf("relay %d killed after the upstream's 429, before it read it", owner.idx)
	r.waitDelivered(2 * polltest.Max) // the other relay's takeover, its 429 and its pause

	recs, err := r.sim.Ctl.Requests(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	first := -1 // the owner's 429
	for i, rc := range recs {
		if rc.Status == 429 && slices.Contains(rc.Devices, dev) {
			first = i
			break
		}
	}
	if first < 0 {
		t.Fatal("no 429 named the device")
	}
	const slack = 2 * time.Millisecond // the sim's clock, read in one process
	var after []int                    // requests holding the device after the owner's 429
	for i := first + 1; i < len(recs); i++ {
		if slices.Contains(recs[i].Devices, dev) {
			after = append(after, i)
			t.Logf("request %d at +%v: %d, %d events, ingested %d", recs[i].Seq,
				recs[i].Time.Sub(recs[first].Time).Round(time.Millisecond), recs[i].Status, recs[i].Events, recs[i].Ingested)
		}
	}
	if len(after) == 0 || recs[after[0]].Status != 429 {
		t.Fatalf("the taker's first request of the device was not inside the penalty: the test proved nothing")
	}
	inPenalty := 0
	for _, i := range after {
		if recs[i].Time.Before(recs[first].Time.Add(throttle - slack)) {
			inPenalty++
		}
	}
	if inPenalty != 1 {
		t.Errorf("%d requests of the device inside the penalty of the lost 429, want 1 (the taker's first)", inPenalty)
	}
	for k, i := range after[:len(after)-1] {
		j := after[k+1]
		if d := recs[j].Time.Sub(recs[i].Time); recs[i].Status == 429 && d < throttle-slack {
			t.Errorf("request %d holds the device %v after the 429 of request %d: inside the taker's %v pause", recs[j].Seq, d, recs[i].Seq, throttle)
		}
	}
	var order []int
	for _, s := range r.stored {
		if s.device == dev {
			order = append(order, s.evSeq)
		}
	}
	if len(order) != len(evs) || !slices.IsSorted(order) {
		t.Errorf("the device's events stored as %v, want 1..%d once each in order", order, len(evs))
	}
}

// killOn429 starts an upstream for one relay: a reverse proxy to sim that,
// on the first 429 answered while victim returns its relay, kills that relay
// (SIGKILL, waiting for it to end) before the answer reaches it, and calls
// killed.
func killOn429(t *testing.T, sim string, victim func() *relayProc, killed func(time.Time)) string {
	target, err := url.Parse(sim)
	if err != nil {
		t.Fatal(err)
	}
	var done atomic.Bool
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = func(resp *http.Response) error {
		v := victim()
		if resp.StatusCode != http.StatusTooManyRequests || v == nil || !done.CompareAndSwap(false, true) {
			return nil
		}
		if err := v.p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Errorf("kill relay %d: %v", v.idx, err)
		}
		<-v.p.done
		killed(time.Now())
		return errors.New("relay killed before the answer")
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return srv.URL
}
