// Command fleet measures the fleet spool's publish path (internal/fleet's
// Append) against a 3-node JetStream cluster: events/s, requests/s and the
// latency of an Append (p50, p99, max), with 1 to 3 publishers, each a
// relay of its own (its own connection and Fleet) running -inflight
// Appends at once.
//
// Without -url it starts the cluster in this process (internal/natstest,
// stores under a temp dir, 127.0.0.1 only), so publishers and servers share
// the machine's CPUs: numbers from a loaded machine say little; run it on a
// quiet one. With -url it uses an existing cluster (the streams get the
// namespace -namespace, which it deletes first).
//
//	go run ./bench/fleet -publishers 3 -duration 10s -events 50 -keys 1
//
// -keys is the number of distinct devices per request: 1 is an SDK's
// request (one partition, one message), more spread a request over
// partitions (one atomic batch).
//
// With -relays it measures whole relays instead (relays.go): 1, 2 and 3
// relay processes sharing a 3-node cluster of nats-server processes, beside
// the same counts of relays on their local spools, under one HTTP load;
// events/s, MB/s, accept latency p50/p99 and CPU per event of the relays
// and of the NATS servers:
//
//	go run ./bench/fleet -relays 1,2,3 -spools fleet,local -duration 10s
//
// -rounds N runs every configuration N times, interleaved, and prints the
// medians (a shared machine's noise); the fleet rows also show where the
// events streams' Raft leaders are and how many requests a batch carried.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/svcrelay/relay/bench/hist"
	"github.com/svcrelay/relay/internal/fleet"
	"github.com/svcrelay/relay/internal/natstest"
	"github.com/svcrelay/relay/internal/storage"
)

type options struct {
	url        string
	namespace  string
	publishers int
	inflight   int
	duration   time.Duration
	events     int
	eventBytes int
	keys       int
	partitions int
	streams    int
	syncAlways bool
}

func main() {
	var o options
	flag.StringVar(&o.url, "url", "", "NATS servers (nats://h1:4222,...); empty: start a 3-node cluster in this process")
	flag.StringVar(&o.namespace, "namespace", "BENCH", "stream namespace (deleted first)")
	flag.IntVar(&o.publishers, "publishers", 1, "publishing relays (1-3), each with its own connection")
	flag.IntVar(&o.inflight, "inflight", 16, "Appends in flight per publisher")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "how long to publish")
	flag.IntVar(&o.events, "events", 50, "events per request")
	flag.IntVar(&o.eventBytes, "event-bytes", 400, "bytes per event")
	flag.IntVar(&o.keys, "keys", 1, "distinct devices per request (1: one partition, one message)")
	flag.IntVar(&o.partitions, "partitions", fleet.DefaultPartitions, "partitions per lane kind")
	flag.IntVar(&o.streams, "streams", 3, "streams per lane kind (leaders spread over the nodes; the relay's default is 1)")
	flag.BoolVar(&o.syncAlways, "sync-always", true, "the cluster started here: fsync every write (sync_interval: always)")
	relays := flag.String("relays", "", "relay mode: relay counts to run, e.g. 1,2,3 (empty: measure Append alone)")
	spools := flag.String("spools", "fleet,local", "relay mode: spools to run each count on (fleet, local)")
	conns := flag.Int("conns", 32, "relay mode: HTTP connections in total, spread over the relays")
	warmup := flag.Duration("warmup", 2*time.Second, "relay mode: load before the measured -duration")
	devices := flag.Int("devices", 10000, "relay mode: distinct device_ids")
	rounds := flag.Int("rounds", 1, "relay mode: times to run every configuration, interleaved; medians printed when more than 1")
	profile := flag.String("profile", "", "relay mode: save CPU profiles of the NATS nodes (prof_port) and every relay (/debug/pprof) over each measured window in this directory")
	pad := flag.String("pad", "props", "relay mode: event padding: props (random property values, compressing as real events do) or x (one letter, as before)")
	colocate := flag.Bool("colocate", false, "relay mode: the relays connect to one node only, which the events stream's leader is moved to (no publish crosses a route; the one-replica consumers stay where the server put them)")
	idle := flag.Duration("idle", 0, "relay mode: first measure the relays' and nodes' CPU without load for this long")
	relayEnv := flag.String("relay-env", "", "relay mode: KEY=VALUE,... added to the relays' environment (e.g. GOMAXPROCS=2)")
	keep := flag.Bool("keep", false, "relay mode: keep the logs and stores (the temp dir is printed)")
	flag.Parse()
	if *relays != "" {
		ro := relayOpts{conns: *conns, warmup: *warmup, duration: o.duration, events: o.events, eventBytes: o.eventBytes,
			devices: *devices, keys: o.keys, padX: *pad == "x", partitions: o.partitions, streams: o.streams, syncAlways: o.syncAlways, keep: *keep, colocate: *colocate, rounds: max(*rounds, 1), profile: *profile, idle: *idle}
		if *relayEnv != "" {
			ro.relayEnv = strings.Split(*relayEnv, ",")
		}
		for _, f := range strings.Split(*relays, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n > 8 {
				fmt.Fprintln(os.Stderr, "fleet: -relays wants counts 1-8, e.g. 1,2,3")
				os.Exit(2)
			}
			ro.relays = append(ro.relays, n)
		}
		for _, sp := range strings.Split(*spools, ",") {
			if sp != "fleet" && sp != "local" {
				fmt.Fprintln(os.Stderr, "fleet: -spools wants fleet and/or local")
				os.Exit(2)
			}
			ro.spools = append(ro.spools, sp)
		}
		if ro.conns < 1 || ro.events < 1 || ro.devices < 1 {
			fmt.Fprintln(os.Stderr, "fleet: want -conns, -events, -devices >= 1")
			os.Exit(2)
		}
		if err := runRelays(ro); err != nil {
			fmt.Fprintln(os.Stderr, "fleet:", err)
			os.Exit(1)
		}
		return
	}
	if o.publishers < 1 || o.publishers > 3 || o.inflight < 1 || o.events < 1 || o.keys < 1 || o.keys > o.events {
		fmt.Fprintln(os.Stderr, "fleet: want 1-3 publishers, inflight >= 1, events >= keys >= 1")
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	url := o.url
	if url == "" {
		dir, err := os.MkdirTemp("", "bench-fleet-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		t0 := time.Now()
		c, err := natstest.New(natstest.Config{SyncAlways: o.syncAlways}, dir)
		if err != nil {
			return err
		}
		defer c.Close()
		url = c.URL()
		fmt.Printf("cluster: 3 nodes in-process, sync_interval always=%v, ready in %v\n", o.syncAlways, time.Since(t0).Round(time.Millisecond))
	}
	ctx := context.Background()
	if err := reset(ctx, url, o.namespace); err != nil {
		return err
	}
	cfg := fleet.Config{Namespace: o.namespace, Partitions: o.partitions, Streams: o.streams}
	fleets := make([]*fleet.Fleet, o.publishers)
	for i := range fleets {
		nc, err := fleet.Dial(fleet.ConnConfig{Servers: strings.Split(url, ","), Name: "bench-" + strconv.Itoa(i)}, nil)
		if err != nil {
			return err
		}
		defer nc.Close()
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		f, err := fleet.Open(octx, nc, cfg, nil, nil)
		cancel()
		if err != nil {
			return err
		}
		defer f.Close()
		fleets[i] = f
	}

	var (
		wg              sync.WaitGroup
		mu              sync.Mutex
		total           hist.Hist
		reqs, errs, evs atomic.Int64
		firstErr        atomic.Value
	)
	deadline := time.Now().Add(o.duration)
	start := time.Now()
	for p, f := range fleets {
		for w := range o.inflight {
			wg.Go(func() {
				var h hist.Hist
				recs := records(o, p*o.inflight+w)
				lane := storage.LaneKey{Kind: storage.KindEvents, APIKey: "bench"}
				for n := 0; time.Now().Before(deadline); n++ {
					// A new device set per request, so partitions rotate.
					for i := range recs {
						recs[i].OrderKey = []byte(fmt.Sprintf("d:%d-%d-%d-%d", p, w, n, i%o.keys))
					}
					t0 := time.Now()
					err := f.Append(ctx, fleet.Request{Lane: lane, Records: recs})
					h.Record(uint64(time.Since(t0).Microseconds()))
					reqs.Add(1)
					if err != nil {
						errs.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
						continue
					}
					evs.Add(int64(len(recs)))
				}
				mu.Lock()
				total.Merge(&h)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	fmt.Printf("publishers %d x inflight %d, %d events of %d B per request, %d device(s) per request, P=%d, %.1fs\n",
		o.publishers, o.inflight, o.events, o.eventBytes, o.keys, o.partitions, el)
	fmt.Printf("events/s %.0f  requests/s %.0f  errors %d\n", float64(evs.Load())/el, float64(reqs.Load())/el, errs.Load())
	fmt.Printf("append latency: p50 %s  p99 %s  max %s  (n=%d)\n",
		us(total.Quantile(0.5)), us(total.Quantile(0.99)), us(total.Max()), total.Count())
	if e := firstErr.Load(); e != nil {
		fmt.Println("first error:", e)
	}
	return nil
}

func us(v uint64) string { return (time.Duration(v) * time.Microsecond).String() }

// records makes a request's events: JSON-ish bodies of about eventBytes.
func records(o options, seed int) []storage.Record {
	recs := make([]storage.Record, o.events)
	pad := strings.Repeat("x", max(o.eventBytes-80, 0))
	for i := range recs {
		recs[i].Data = []byte(fmt.Sprintf(`{"event_type":"bench","device_id":"d%d","insert_id":"%d-%d","p":"%s"}`, seed, seed, i, pad))
	}
	return recs
}

// reset deletes the namespace's streams and buckets, so that a run starts
// empty (and with this run's partition count).
func reset(ctx context.Context, url, ns string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	for _, s := range []string{"EVENTS", "GROUPIDENTIFY", "USERMAP", "DEAD", "FLEET", "PAUSES"} {
		name := ns + "_" + s
		if s == "FLEET" || s == "PAUSES" {
			name = "KV_" + name
		}
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("delete %s: %w", name, err)
		}
	}
	return nil
}
