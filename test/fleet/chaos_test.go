package fleet

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/fleet"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// Chaos under load: one run is three relays on a 3-node cluster of
// nats-server processes with the clients' load running throughout, and four
// failures one after another:
//
//  1. kill -9 of the node that leads the events stream(s) (the one leading
//     most of them when the kind is spread over several), then its restart;
//  2. SIGSTOP of a relay holding messages, for longer than its lease, until
//     the other relays took all its partitions; then SIGCONT;
//  3. a rolling restart: every relay stopped (SIGTERM) and started again,
//     one after another;
//  4. a node replaced by one with an empty store (same name and ports).
//
// After each, every event accepted so far must reach the upstream; at the
// end the suite's checks (check: nothing lost, per-device order of first
// delivery, nothing under two insert_ids, no device sent inside its pause)
// and one more: each relay's requests reach the upstream through its own
// proxy, which notes when they arrive and which devices they hold, and no
// relay may send events of a partition while another relay holds it (the
// relays' "partition taken" log lines say who took which partition when).
// A relay resumed after its lease ran out must not send what it read
// before.
//
// CHAOS_RUNS=n runs it n times in a row on the same binaries (stopping at
// the first failure).

// chaosRuns is how many runs TestFleetChaos makes.
func chaosRuns(t *testing.T) int {
	v := os.Getenv("CHAOS_RUNS")
	if v == "" {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("CHAOS_RUNS=%q: want a positive number", v)
	}
	return n
}

func TestFleetChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server, sim and relay processes; skipped under -short")
	}
	t.Parallel()
	runs := chaosRuns(t)
	e := binaries(t)
	for i := range runs {
		if !t.Run(fmt.Sprintf("run%d", i+1), func(t *testing.T) { runChaos(t, e) }) {
			t.Fatalf("run %d of %d failed", i+1, runs)
		}
	}
}

func runChaos(t *testing.T, e env) {
	start := time.Now()
	since := func() time.Duration { return time.Since(start).Round(time.Millisecond) }
	dir := t.TempDir()
	r := &fleetRun{t: t, e: e, dir: dir, events: map[string]*sentEvent{}, hotBurst: 3 * time.Second}
	r.cluster = startCluster(t, e.natsBin, dir)
	r.sim = harness.StartSim(t, e.relayBin, dir, "--eps-threshold", "20", "--rate-window", "1s",
		"--throttle-penalty", pause.String(), "--lenient-rate")
	sent := &upstreamLog{}
	for i := range 3 {
		r.relays = append(r.relays, &relayProc{
			idx: i, listen: harness.FreeAddr(t), adminListen: harness.FreeAddr(t),
			dataDir: filepath.Join(dir, fmt.Sprintf("relay%d", i)), log: filepath.Join(dir, fmt.Sprintf("relay%d.log", i)),
			upstream: sent.proxy(t, i, r.sim.Base),
		})
	}
	stop := r.serveUnderLoad()
	t.Logf("cluster and %d relays serving at %v", len(r.relays), since())

	const within = 2 * time.Minute // any one wait; a quiet machine takes seconds
	// The first failure needs only the load flowing: the partitions spread
	// over the relays meanwhile (seconds of membership ticks), and the
	// second failure, the first that needs them spread, waits for it.
	r.waitLoad(100, 0, within, "before the chaos")
	step := func(name string, f func()) {
		t.Helper()
		t0 := time.Now()
		f()
		r.waitDelivered(within)
		t.Logf("%s: done and every accepted event delivered in %v (at %v, %d accepted)", name, time.Since(t0).Round(time.Millisecond), since(), r.accepted.Load())
	}

	step("kill -9 the events leader", func() {
		node, leads := r.cluster.eventsLeader(t)
		r.cluster.Kill(node)
		t.Logf("killed nats %s (leading %v events streams) at %v", r.cluster.nodes[node].Name, leads, since())
		r.waitLoad(200, 2*time.Second, within, "with the events leader killed")
		r.cluster.Restart(node, within)
	})

	step("SIGSTOP a relay past its lease", func() {
		r.waitSpread(within)
		v := r.relays[0]
		held := r.waitHeld(v, 20*time.Second)
		v.down.Store(true)
		if err := v.p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Logf("relay %d stopped (SIGSTOP) holding %v messages at %v (%s)", v.idx, held, since(), time.Now().Format("15:04:05.000000"))
		r.waitOwnedBy(r.relays[1:], within)
		t.Logf("its partitions taken by the others at %v", since())
		r.waitLoad(200, 0, within, "with a relay stopped")
		if err := v.p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		v.down.Store(false)
		t.Logf("relay %d continued (SIGCONT) at %v (%s)", v.idx, since(), time.Now().Format("15:04:05.000000"))
		r.waitLoad(200, 2*time.Second, within, "after SIGCONT")
		r.waitSpread(within)
	})

	step("rolling restart", func() {
		for _, rp := range r.relays {
			rp.down.Store(true)
			rp.p.stop(t, within)
			r.startRelay(rp)
			rp.down.Store(false)
			t.Logf("relay %d restarted at %v", rp.idx, since())
			r.waitLoad(100, 0, within, fmt.Sprintf("after relay %d's restart", rp.idx))
		}
		r.waitSpread(within)
	})

	step("replace a node with an empty store", func() {
		node, _ := r.cluster.eventsLeader(t)
		node = (node + 1) % len(r.cluster.nodes) // a follower, for a change
		nd := r.cluster.nodes[node]
		r.cluster.Kill(node)
		if err := os.RemoveAll(nd.store); err != nil {
			t.Fatal(err)
		}
		t.Logf("killed nats %s and emptied its store at %v", nd.Name, since())
		r.waitLoad(100, 0, within, "with a node gone")
		r.cluster.Restart(node, within) // every node healthy: the empty one caught up
		r.waitLoad(200, 0, within, "after the empty node joined")
	})

	stop()
	t.Logf("load stopped at %v: %d requests, %d events sent, %d accepted; statuses %s",
		since(), r.reqs.Load(), len(r.events), r.accepted.Load(), r.statusText())
	stored := r.waitDelivered(within)
	for _, rp := range r.relays {
		if !rp.p.running() {
			t.Errorf("relay %d exited: %v", rp.idx, rp.p.err)
		}
	}
	r.check(stored)
	r.checkOwners(sent)
	t.Logf("run done in %v", since())
}

// stop sends SIGTERM and waits (within at most) for the process to end.
func (p *proc) stop(t *testing.T, within time.Duration) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && p.running() {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("%s: alive %v after SIGTERM", p.name, within)
	}
}

// waitOwnedBy waits until the relays rs own every partition of both kinds
// they deliver (events and group identify) between them.
func (r *fleetRun) waitOwnedBy(rs []*relayProc, within time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for {
		sum := 0.0
		for _, rp := range rs {
			sum += rp.metric("relay_fleet_partitions_owned")
		}
		if sum == 2*partitions {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("relays own %v of the %d partitions after %v", sum, 2*partitions, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// eventsLeader returns the node leading most of the events kind's streams
// (every stream whose name starts with RELAY_EVENTS) and how many each node
// leads; it fails the test when none has a leader.
func (c *natsCluster) eventsLeader(t *testing.T) (int, map[string]int) {
	t.Helper()
	nc, err := nats.Connect(c.clientURLs(), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leads := map[string]int{}
	l := js.ListStreams(ctx)
	for info := range l.Info() {
		if strings.HasPrefix(info.Config.Name, "RELAY_EVENTS") && info.Cluster != nil && info.Cluster.Leader != "" {
			leads[info.Cluster.Leader]++
		}
	}
	if err := l.Err(); err != nil {
		t.Fatalf("list streams: %v", err)
	}
	best := -1
	for i, nd := range c.nodes {
		if leads[nd.Name] > 0 && (best < 0 || leads[nd.Name] > leads[c.nodes[best].Name]) {
			best = i
		}
	}
	if best < 0 {
		t.Fatal("no events stream has a leader: is the fleet publishing?")
	}
	return best, leads
}

// upstreamLog is what each relay sent upstream, as its proxy saw it.
type upstreamLog struct {
	mu   sync.Mutex
	reqs []upstreamReq
}

// upstreamReq is one events request a relay sent.
type upstreamReq struct {
	relay   int
	at      time.Time // its head arrived at the proxy
	devices []string
}

// proxy starts relay i's upstream: a reverse proxy to sim that notes each
// events request whose body arrived whole (one the relay gave up on
// midway does not reach the sim).
func (l *upstreamLog) proxy(t *testing.T, i int, sim string) string {
	target, err := url.Parse(sim)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		at := time.Now()
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		if req.URL.Path == "/2/httpapi" {
			devs, err := devicesOf(b, req.Header.Get("Content-Encoding") == "gzip")
			if err != nil {
				t.Errorf("relay %d sent an unreadable request: %v", i, err)
			}
			l.mu.Lock()
			l.reqs = append(l.reqs, upstreamReq{relay: i, at: at, devices: devs})
			l.mu.Unlock()
		}
		req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
		rp.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// devicesOf is the distinct device_ids of an events request's body.
func devicesOf(b []byte, gz bool) ([]string, error) {
	if gz {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		if b, err = io.ReadAll(zr); err != nil {
			return nil, err
		}
	}
	var req struct {
		Events []struct {
			DeviceID string `json:"device_id"`
		} `json:"events"`
	}
	if err := json.Unmarshal(b, &req); err != nil {
		return nil, err
	}
	var devs []string
	for _, ev := range req.Events {
		if !slices.Contains(devs, ev.DeviceID) {
			devs = append(devs, ev.DeviceID)
		}
	}
	return devs, nil
}

// taking is one "partition taken" log line of a relay.
type taking struct {
	relay int
	at    time.Time // as logged: to the millisecond, rounded down
}

// takings reads every relay's log (all its runs) for the events partitions
// it took, by partition, in time order.
func (r *fleetRun) takings() map[int][]taking {
	out := map[int][]taking{}
	for _, rp := range r.relays {
		f, err := os.Open(rp.log)
		if err != nil {
			r.t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			var line struct {
				Msg       string `json:"msg"`
				TS        string `json:"ts"`
				Partition string `json:"partition"`
			}
			if json.Unmarshal(sc.Bytes(), &line) != nil || line.Msg != "partition taken" {
				continue
			}
			ps, ok := strings.CutPrefix(line.Partition, "p.events.")
			if !ok {
				continue
			}
			p, err1 := strconv.Atoi(ps)
			at, err2 := time.Parse(time.RFC3339Nano, line.TS)
			if err1 != nil || err2 != nil {
				r.t.Fatalf("relay %d: unreadable partition taken line: %s", rp.idx, sc.Bytes())
			}
			out[p] = append(out[p], taking{relay: rp.idx, at: at})
		}
		f.Close()
	}
	for _, ts := range out {
		slices.SortStableFunc(ts, func(a, b taking) int { return a.at.Compare(b.at) })
	}
	return out
}

// checkOwners fails the test for every events request a relay sent for a
// partition that, when the request arrived, another relay had taken last.
func (r *fleetRun) checkOwners(sent *upstreamLog) {
	t := r.t
	takes := r.takings()
	if len(takes) != partitions {
		t.Errorf("partition taken lines for %d events partitions, want %d: the ownership check needs them", len(takes), partitions)
		return
	}
	sent.mu.Lock()
	defer sent.mu.Unlock()
	bad := 0
	for _, q := range sent.reqs {
		for _, dev := range q.devices {
			p := fleet.PartitionOf([]byte(event.DeviceKeyPrefix+dev), partitions)
			owner, since := -1, time.Time{}
			for _, tk := range takes[p] {
				if tk.at.After(q.at) {
					break
				}
				owner, since = tk.relay, tk.at
			}
			if owner != q.relay {
				bad++
				if bad <= 8 {
					t.Errorf("relay %d sent %s (partition %d) at %s, when relay %d held the partition (taken at %s)",
						q.relay, dev, p, q.at.Format("15:04:05.000000"), owner, since.Format("15:04:05.000"))
				}
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d device batches sent by a relay that did not hold their partition", bad)
	}
	t.Logf("ownership: %d upstream requests checked against %d partitions' takings", len(sent.reqs), len(takes))
}
