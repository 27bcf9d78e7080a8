package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/fleet"
	"github.com/svcrelay/relay/internal/natstest"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

// Fleet mode end to end: a real 3-node JetStream cluster, the
// simulator as the upstream, and two relays (two serve compositions in this
// process) sharing the cluster.

// startFleetCluster starts the 3-node cluster and the simulator (skipped
// with -short).
func startFleetCluster(t *testing.T) (*natstest.Cluster, *simtest.Sim, string) {
	t.Helper()
	return startFleetClusterWith(t, sim.Config{})
}

// startFleetClusterWith is startFleetCluster with the simulator's config.
// It makes t parallel: each fleet test has a cluster, a simulator and
// relays of its own, and spends most of its time waiting on leases and
// the cluster's answers, so the fleet tests run two at a time (go test's
// -parallel default on the team's 2-core machine), after the package's
// other tests, never beside them.
func startFleetClusterWith(t *testing.T, simCfg sim.Config) (*natstest.Cluster, *simtest.Sim, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a 3-node NATS cluster")
	}
	t.Parallel()
	cl := natstest.Start(t, natstest.Config{})
	up := simtest.New(simCfg, zap.NewNop())
	upURL, err := up.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	return cl, up, upURL
}

// fleetRelay is one relay of the fleet and its NATS connection.
type fleetRelay struct {
	*servedRelay
	nc atomic.Pointer[nats.Conn]
}

func startFleetRelay(t *testing.T, cl *natstest.Cluster, upstream string, args ...string) *fleetRelay {
	t.Helper()
	r := &fleetRelay{}
	hooks := serveHooks{fleetOpened: func(nc *nats.Conn) { r.nc.Store(nc) }}
	r.servedRelay = startServeWith(t, hooks, append([]string{
		"--ingest-url", upstream, "--spool", cl.URL(), "--spool-partitions", "4",
		"--flush-interval", "20ms", "--max-batch-events", "10",
	}, args...)...)
	return r
}

// kill plays the relay's sudden death: its connection to the cluster is
// closed, its leases are left to expire, nothing it holds is acknowledged.
func (r *fleetRelay) kill() { r.nc.Load().Close() }

// postEvents sends events to a relay; it returns the status (0: no answer).
func postEvents(client *http.Client, url string, body []byte) int {
	resp, err := client.Post(url+"/2/httpapi", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func deviceEvents(apiKey string, dev, from, n int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `{"api_key":%q,"events":[`, apiKey)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"device_id":"device-%02d","event_type":"t","insert_id":"ins-%02d-%06d"}`, dev, dev, from+i)
	}
	b.WriteString("]}")
	return []byte(b.String())
}

// TestFleetFailover: load through two relays; one dies abruptly mid-load.
// Every event answered 200 reaches the upstream, each device's events in
// order (of first arrival), and nothing but what was sent.
func TestFleetFailover(t *testing.T) {
	cl, up, upURL := startFleetCluster(t)
	// Requests take a while: each relay has requests in flight and
	// events read and not yet acknowledged when one dies.
	up.SetLatency(200 * time.Millisecond)

	a := startFleetRelay(t, cl, upURL)
	b := startFleetRelay(t, cl, upURL)
	relays := []*fleetRelay{a, b}
	var aDead atomic.Bool
	aName := a.memberName(t)

	const (
		apiKey   = "fleet-key-1"
		devices  = 12
		requests = 30
		perReq   = 5
	)
	client := &http.Client{Timeout: 20 * time.Second}
	var acked sync.Map // insert_id -> true: answered 200
	var accepted atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(polltest.Max)
	for dev := range devices {
		wg.Go(func() {
			for k := range requests {
				body := deviceEvents(apiKey, dev, k*perReq, perReq)
				ok := false
				for try := 0; time.Now().Before(deadline); try++ {
					r := relays[(dev+k+try)%2]
					if r == a && aDead.Load() {
						r = b
					}
					if postEvents(client, r.ingest, body) == http.StatusOK {
						ok = true
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				if !ok {
					t.Errorf("device %d request %d: no relay accepted it", dev, k)
					return
				}
				for i := range perReq {
					acked.Store(fmt.Sprintf("ins-%02d-%06d", dev, k*perReq+i), true)
				}
				accepted.Add(perReq)
			}
		})
	}
	// Kill A a third of the way in, while both deliver, once it holds
	// events partitions (it takes its share when B joins). The senders
	// are waited for before any failure ends the test.
	for (accepted.Load() < devices*requests*perReq/3 || !slices.Contains(eventsOwners(t, cl), aName)) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !slices.Contains(eventsOwners(t, cl), aName) {
		aDead.Store(true)
		wg.Wait()
		t.Fatalf("relay A holds no events partition: %q", eventsOwners(t, cl))
	}
	aDead.Store(true)
	a.kill()
	t.Logf("relay A killed after %d events accepted", accepted.Load())
	wg.Wait()
	if t.Failed() {
		return
	}

	// Everything acknowledged arrives (B takes A's partitions over after
	// the lease time-out, about 8 s).
	var got []sim.Ingested
	want := 0
	acked.Range(func(any, any) bool { want++; return true })
	for end := time.Now().Add(polltest.Max); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if got = up.Events(apiKey); distinct(got) >= want {
			break
		}
	}
	seen := map[string]bool{}
	last := map[string]int{}
	for _, e := range got {
		if _, ok := acked.Load(e.InsertID); !ok {
			t.Errorf("upstream got %q, never answered 200 (or never sent)", e.InsertID)
			continue
		}
		if seen[e.InsertID] {
			continue // a re-send of the same insert_id
		}
		seen[e.InsertID] = true
		n, _ := strconv.Atoi(e.InsertID[len("ins-00-"):])
		if p, ok := last[e.DeviceID]; ok && n < p {
			t.Errorf("device %s: event %d arrived after %d", e.DeviceID, n, p)
		}
		last[e.DeviceID] = n
	}
	lost := 0
	acked.Range(func(k, _ any) bool {
		if !seen[k.(string)] {
			lost++
			if lost <= 5 {
				t.Errorf("acknowledged event %s never reached the upstream", k)
			}
		}
		return true
	})
	t.Logf("accepted %d events, upstream got %d (%d distinct), lost %d", want, len(got), len(seen), lost)
	if lost > 0 {
		t.Fatalf("%d acknowledged events lost", lost)
	}
}

func distinct(evs []sim.Ingested) int {
	m := make(map[string]bool, len(evs))
	for _, e := range evs {
		m[e.InsertID] = true
	}
	return len(m)
}

// partitionOwner returns the member name holding the lease of an events
// partition (the fleet's KV bucket), "" when none does.
func partitionOwner(t *testing.T, cl *natstest.Cluster, p int) string {
	t.Helper()
	return leaseOwner(t, cl, "events", p)
}

// leaseOwner returns the member name holding the lease of partition p of
// kind's stream, "" when none does.
func leaseOwner(t *testing.T, cl *natstest.Cluster, kind string, p int) string {
	t.Helper()
	js := cl.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	defer cancel()
	kv, err := js.KeyValue(ctx, "RELAY_FLEET")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "p."+kind+"."+strconv.Itoa(p))
	if err != nil {
		return ""
	}
	return string(e.Value())
}

// kvHas reports whether the bucket holds key.
func kvHas(t *testing.T, cl *natstest.Cluster, bucket, key string) bool {
	t.Helper()
	js := cl.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	defer cancel()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	_, err = kv.Get(ctx, key)
	return err == nil
}

// memberName is the relay's fleet member name, from its log.
func (r *fleetRelay) memberName(t *testing.T) string {
	t.Helper()
	r.waitLog(t, "fleet mode: events, group identifies and user mappings are spooled on the NATS JetStream cluster", 1)
	return r.logs.FilterMessage("fleet mode: events, group identifies and user mappings are spooled on the NATS JetStream cluster").All()[0].ContextMap()["member"].(string)
}

// TestFleetPauseSurvivesFailover: a device paused by a 429 on the relay
// that owns its partition is not sent by the relay that takes the
// partition over when the first dies, until the pause ends.
func TestFleetPauseSurvivesFailover(t *testing.T) {
	const pause = 20 * time.Second
	cl, up, upURL := startFleetCluster(t)
	a := startFleetRelay(t, cl, upURL, "--throttle-pause", pause.String())
	b := startFleetRelay(t, cl, upURL, "--throttle-pause", pause.String())
	names := map[string]*fleetRelay{a.memberName(t): a, b.memberName(t): b}

	const apiKey, dev = "fleet-key-2", 7
	part := fleet.PartitionOf([]byte(fmt.Sprintf("d:device-%02d", dev)), 4)
	var owner, other *fleetRelay
	polltest.Until(t, "a relay owning the device's partition", func() bool {
		owner = names[partitionOwner(t, cl, part)]
		return owner != nil && len(owner.logs.FilterMessage("partition taken").All()) > 0
	})
	other = a
	if owner == a {
		other = b
	}
	up.Inject(simtest.Fault{Status: 429, Count: 1, PathPrefix: "/2/httpapi",
		Body: []byte(fmt.Sprintf(`{"code":429,"error":"Too many requests for some devices and users","eps_threshold":10,"throttled_devices":{"device-%02d":40}}`, dev))})
	if st := postEvents(http.DefaultClient, other.ingest, deviceEvents(apiKey, dev, 0, 3)); st != http.StatusOK {
		t.Fatalf("ingest answered %d", st)
	}
	// The owner sends, gets the 429, pauses the device (here and in the
	// fleet's bucket); then it dies.
	var t429 time.Time
	polltest.Until(t, "the upstream's 429", func() bool {
		for _, r := range up.Requests() {
			if r.Status == 429 {
				t429 = r.Time
			}
		}
		return !t429.IsZero()
	})
	// The pause is written to the fleet's bucket right after the answer.
	pauseKey := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf("d:device-%02d", dev)))
	polltest.Until(t, "the pause in the fleet's bucket", func() bool { return kvHas(t, cl, "RELAY_PAUSES", pauseKey) })
	owner.kill()
	// The other relay takes the partition over (about 8 s) and must hold
	// the device's events until the pause ends.
	// The events are counted before the clock is read: what was counted
	// came before then, so a test stalled between the two by a loaded
	// machine can miss a wrong send but never fail a right one.
	for {
		n := len(up.Events(apiKey))
		since := time.Since(t429)
		if since >= pause-2*time.Second {
			break
		}
		if n > 0 {
			t.Fatalf("%d events of the paused device sent %v after the 429 (pause %v)", n, since.Round(time.Millisecond), pause)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The survivor owns the partition (at once on a quiet machine: the
	// lease ran out long ago) and delivers once the pause is over.
	polltest.Until(t, "the surviving relay owning the partition", func() bool { return names[partitionOwner(t, cl, part)] == other })
	polltest.Until(t, "the device's events delivered after its pause", func() bool { return len(up.Events(apiKey)) >= 3 })
}

// TestFleetAdmin: a dead letter made by one relay is listed, replayed and
// gone through another relay's /relay/v1; lanes and /readyz in fleet mode.
func TestFleetAdmin(t *testing.T) {
	cl, up, upURL := startFleetCluster(t)
	a := startFleetRelay(t, cl, upURL)
	b := startFleetRelay(t, cl, upURL)
	for _, r := range []*fleetRelay{a, b} {
		polltest.Until(t, "/readyz answering 200", func() bool {
			st, _ := getBody(t, r.admin+"/readyz")
			return st == http.StatusOK
		})
	}
	// The lanes API lists a lane's runner on the relay that reads its
	// partition; a new owner makes one only for records still to read. So
	// the partitions must have settled (two each: B joined after A) before
	// the lane's records are written and dead-lettered, or a move after
	// them would leave the lane listed nowhere.
	aName, bName := a.memberName(t), b.memberName(t)
	polltest.Until(t, "the events partitions spread over both relays", func() bool {
		held := map[string]int{}
		for _, o := range eventsOwners(t, cl) {
			held[o]++
		}
		return held[aName] == 2 && held[bName] == 2
	})

	const apiKey, dev = "fleet-key-3", 4
	simtest.Silence(up, fmt.Sprintf("device-%02d", dev))
	if st := postEvents(http.DefaultClient, a.ingest, deviceEvents(apiKey, dev, 0, 3)); st != http.StatusOK {
		t.Fatalf("ingest answered %d", st)
	}
	var list struct {
		DeadLetters []struct {
			ID     uint64 `json:"id"`
			Lane   string `json:"lane"`
			Reason string `json:"reason"`
		} `json:"dead_letters"`
		Total int64 `json:"total"`
	}
	polltest.Until(t, "the 3 dead letters listed by the other relay", func() bool { // whichever relay made them
		_, body := getBody(t, b.admin+"/relay/v1/deadletters")
		if err := json.Unmarshal([]byte(body), &list); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		return len(list.DeadLetters) == 3
	})
	if list.Total != 3 || list.DeadLetters[0].Reason != "silenced" {
		t.Fatalf("list: %+v", list)
	}
	// The lane of the dead letters, by its label, filters.
	_, body := getBody(t, b.admin+"/relay/v1/deadletters?lane="+list.DeadLetters[0].Lane)
	if !strings.Contains(body, `"total":3`) || strings.Count(body, `"reason":"silenced"`) != 3 {
		t.Fatalf("by lane: %s", body)
	}
	// Lanes: the relays' runners of the lane (one of them delivered it).
	polltest.Until(t, "a runner of lane "+list.DeadLetters[0].Lane+" listed", func() bool {
		_, la := getBody(t, a.admin+"/relay/v1/lanes")
		_, lb := getBody(t, b.admin+"/relay/v1/lanes")
		return strings.Contains(la+lb, list.DeadLetters[0].Lane+"-events-")
	})

	simtest.Unsilence(up, fmt.Sprintf("device-%02d", dev))
	replayAll(t, b.admin, 3)
	polltest.Until(t, "the replayed events delivered", func() bool { return len(up.Events(apiKey)) >= 3 })
	_, body = getBody(t, a.admin+"/relay/v1/deadletters")
	if !strings.Contains(body, `"dead_letters":[]`) {
		t.Fatalf("after the replay: %s", body)
	}
}

// TestFleetGracefulStop: a relay stopped (SIGTERM) mid-load finishes its
// requests in flight, then gives its leases up at once (another relay takes
// over without waiting for them to expire); nothing acknowledged is lost.
func TestFleetGracefulStop(t *testing.T) {
	cl, up, upURL := startFleetCluster(t)
	up.SetLatency(200 * time.Millisecond)
	a := startFleetRelay(t, cl, upURL)
	b := startFleetRelay(t, cl, upURL)
	aName := a.memberName(t)
	polltest.Until(t, "relay A holding events partitions", func() bool { return slices.Contains(eventsOwners(t, cl), aName) })
	const apiKey = "fleet-key-4"
	want := 0
	for dev := range 8 {
		for k := range 5 {
			if st := postEvents(http.DefaultClient, a.ingest, deviceEvents(apiKey, dev, k*5, 5)); st != http.StatusOK {
				t.Fatalf("ingest answered %d", st)
			}
			want += 5
		}
	}
	if err := a.stop(t); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if owners := eventsOwners(t, cl); slices.Contains(owners, aName) {
		t.Fatalf("relay A stopped but still holds leases: %q", owners)
	}
	polltest.Until(t, fmt.Sprintf("the upstream having all %d events", want), func() bool { return distinct(up.Events(apiKey)) >= want })
	st := up.Stats()
	t.Logf("upstream: %d events, %d duplicates; relay B took %d partitions", st.Ingested, st.Duplicates,
		b.logs.FilterMessage("partition taken").Len())
}

// eventsOwners returns the lease holders of the 4 events partitions.
func eventsOwners(t *testing.T, cl *natstest.Cluster) []string {
	var out []string
	for p := range 4 {
		out = append(out, partitionOwner(t, cl, p))
	}
	return out
}

// TestFleetForms: group identifies and user mappings accepted by relay A
// while the upstream is down are delivered by relay B once A is killed
// (connection closed, leases left to expire, then A stopped: nothing of
// A's data dir is read again). Were the forms kept in A's local spool, they
// would wait there for A and this would fail.
func TestFleetForms(t *testing.T) {
	cl, up, upURL := startFleetCluster(t)
	if err := up.Down(simtest.DownRefuse, 0); err != nil {
		t.Fatal(err)
	}
	forms := []string{"--alias-url", upURL, "--analytics-url", upURL}
	a := startFleetRelay(t, cl, upURL, forms...)
	aName := a.memberName(t)
	b := startFleetRelay(t, cl, upURL, forms...)
	b.memberName(t)

	const apiKey, n = "fleet-key-5", 24
	post := func(path, form string) {
		t.Helper()
		resp, err := http.Post(a.admin+path, "application/x-www-form-urlencoded", strings.NewReader(form))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %d %s", path, resp.StatusCode, body)
		}
	}
	simtest.RejectGroupValue(up, "bad") // a 400: a dead letter, the fleet's
	post("/groupidentify", "api_key="+apiKey+"&identification="+
		url.QueryEscape(`[{"group_type":"org","group_value":"bad","group_properties":{"plan":"p"}}]`))
	for i := range n { // distinct groups and users: spread over the partitions
		post("/groupidentify", "api_key="+apiKey+"&identification="+
			url.QueryEscape(fmt.Sprintf(`[{"group_type":"org","group_value":"g-%02d","group_properties":{"plan":"p"}}]`, i)))
		post("/usermap", "api_key="+apiKey+"&mapping="+
			url.QueryEscape(fmt.Sprintf(`[{"user_id":"u-%02d","global_user_id":"g-%02d"}]`, i, i)))
	}
	// A holds partitions of both kinds (its share once B joined).
	polltest.Until(t, "relay A holds group identify and user mapping partitions", func() bool {
		var gi, um bool
		for p := range 4 {
			gi = gi || leaseOwner(t, cl, "groupidentify", p) == aName
			um = um || leaseOwner(t, cl, "usermap", p) == aName
		}
		return gi && um
	})
	a.kill()
	a.stop(t) //nolint:errcheck // its fleet is gone; only its data dir is left
	if err := up.Up(); err != nil {
		t.Fatal(err)
	}

	var groups, users map[string]bool
	// B takes A's partitions after the lease time-out (~8 s), then its retry.
	polltest.Until(t, "B delivering A's group identifies and mappings", func() bool {
		groups, users = map[string]bool{}, map[string]bool{}
		for _, g := range simtest.GroupIdentifies(up, apiKey) {
			groups[g.GroupValue] = true
		}
		for _, c := range simtest.MappingCalls(up) {
			users[c.UserID] = true
		}
		return len(groups) >= n && len(users) >= n
	})
	for i := range n {
		if !groups[fmt.Sprintf("g-%02d", i)] || !users[fmt.Sprintf("u-%02d", i)] {
			t.Errorf("record %d: group %v, mapping %v", i, groups[fmt.Sprintf("g-%02d", i)], users[fmt.Sprintf("u-%02d", i)])
		}
	}
	// The refused one is a dead letter of the fleet: listed by B, replayed
	// through B into the stream (refused again: a dead letter again).
	deadBody := func() (body string) {
		polltest.Until(t, "the group identify dead letter listed", func() bool {
			_, body = getBody(t, b.admin+"/relay/v1/deadletters")
			return strings.Contains(body, `"total":1`)
		})
		return body
	}
	if body := deadBody(); !strings.Contains(body, `"reason":"bad_request"`) {
		t.Fatalf("dead letters: %s", body)
	}
	replayAll(t, b.admin, 1)
	deadBody()
}

// replayAll asks the relay at admin to replay every dead letter and
// checks that it answers 200, n replayed.
func replayAll(t *testing.T, admin string, n int) {
	t.Helper()
	resp, err := http.Post(admin+"/relay/v1/deadletters/replay", "application/json", strings.NewReader(`{"filter":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(rb), fmt.Sprintf(`"replayed":%d`, n)) {
		t.Fatalf("replay: %d %s", resp.StatusCode, rb)
	}
}
