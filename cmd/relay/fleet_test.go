package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/natstest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/sim/simtest"
)

// Fleet mode end to end (issue 22): a real 3-node JetStream cluster, the
// simulator as the upstream, and two relays (two serve compositions in this
// process) sharing the cluster.

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
	if testing.Short() {
		t.Skip("starts a 3-node NATS cluster")
	}
	cl := natstest.Start(t, natstest.Config{})
	up := simtest.New(sim.Config{}, zap.NewNop())
	upURL, err := up.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	// Requests take a while: each relay has requests in flight and
	// events read and not yet acknowledged when one dies.
	up.SetLatency(200 * time.Millisecond)

	a := startFleetRelay(t, cl, upURL)
	b := startFleetRelay(t, cl, upURL)
	relays := []*fleetRelay{a, b}
	var aDead atomic.Bool

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
	deadline := time.Now().Add(90 * time.Second)
	for dev := range devices {
		wg.Go(func() {
			for k := range requests {
				body := deviceEvents(apiKey, dev, k*perReq, perReq)
				ok := false
				for try := 0; try < 60 && time.Now().Before(deadline); try++ {
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
	// Kill A a third of the way in, while both deliver.
	for accepted.Load() < devices*requests*perReq/3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
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
	for range 600 { // 60 s
		got = up.Events(apiKey)
		if distinct(got) >= want {
			break
		}
		time.Sleep(100 * time.Millisecond)
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
