package delivery

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/throttle"
	"github.com/svcrelay/relay/internal/upstream"
)

// BenchmarkBuild measures batch encoding: 1000 events of ~300 bytes into
// one body, with the per-event pause checks.
func BenchmarkBuild(b *testing.B) {
	thr, _ := throttle.New(throttle.Config{}, nil)
	cfg := Config{Live: Live{IngestURL: "http://x"}}.withDefaults()
	p := newPipeline(cfg, nil, nil, thr, nil)
	p.m = newMetrics(nil, p)
	lr := &laneRunner{p: p, bwake: make(chan struct{}, 1)}
	lr.frame = events{}.Frame(storage.LaneKey{APIKey: "0123456789abcdef0123456789abcdef", Options: `{"min_id_length":3}`})
	s := newShard(lr, 0)
	its := make([]item, 1000)
	ck := &chunkRef{accepted: time.Now()}
	for i := range its {
		dev := fmt.Sprintf("device-%04d", i%200)
		data := fmt.Sprintf(`{"event_type":"page_view","device_id":%q,"user_id":"user-%04d","insert_id":"ins-%012d","time":1700000000000,"event_properties":{"path":"/products/%d","referrer":"https://example.com/search?q=shoes","duration_ms":1234}}`, dev, i%200, i, i)
		its[i] = item{rec: storage.Record{OrderKey: []byte("d:" + dev), UserID: []byte(fmt.Sprintf("user-%04d", i%200)), Data: []byte(data)}, ck: ck}
	}
	now := time.Now()
	var body []byte
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for _, it := range its {
			s.ready.push(it)
		}
		body = s.build(now)
		if len(s.batch) != len(its) {
			b.Fatalf("batch %d", len(s.batch))
		}
	}
	b.SetBytes(int64(len(body)))
}

// BenchmarkDeliverCountOnly measures delivery throughput from a real spool
// to the simulator in CountOnly mode over real HTTP (events/s).
func BenchmarkDeliverCountOnly(b *testing.B) {
	deliverCountOnly(b, Config{ShardsPerLane: 8}, 200_000, 0)
}

// BenchmarkDeliverReadAhead measures drain throughput by read-ahead budget
// with the relay's defaults otherwise and events of ~500 bytes (bench/
// loadgen's size): the smallest budget that keeps the throughput is the
// default (DefaultMaxReadAheadBytes). It reports the peak accounted
// read-ahead (readahead-MiB) too.
func BenchmarkDeliverReadAhead(b *testing.B) {
	for _, mib := range []int{4, 8, 16, 32, 64} {
		b.Run(fmt.Sprintf("budget=%dMiB", mib), func(b *testing.B) {
			deliverCountOnly(b, Config{MaxReadAheadBytes: mib << 20}, 100_000, 380)
		})
	}
}

// deliverCountOnly appends events (in chunks of 1000, padded by pad bytes)
// to a fresh spool per iteration and times draining them to a CountOnly sim.
func deliverCountOnly(b *testing.B, cfg Config, events, pad int) {
	sm := simtest.New(sim.Config{CountOnly: simtest.CountEvents}, nil)
	url, err := sm.Start("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer sm.Close()
	cli, err := upstream.New(upstream.Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	cfg.IngestURL = url
	padding := strings.Repeat("x", pad)
	b.ReportAllocs()
	b.ResetTimer()
	var total time.Duration
	var peak int64
	for range b.N {
		b.StopTimer()
		sp, err := spool.Open(spool.Config{Dir: b.TempDir(), NoSync: true, MinFreeBytes: -1}, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		l, err := sp.Lane(context.Background(), storage.LaneKey{Kind: storage.KindEvents, APIKey: "bench-key"})
		if err != nil {
			b.Fatal(err)
		}
		var bt storage.Batch
		for i := 0; i < events; i++ {
			dev := fmt.Sprintf("device-%05d", i%10000)
			bt.Add(storage.Record{OrderKey: []byte("d:" + dev), Data: fmt.Appendf(nil,
				`{"event_type":"page_view","device_id":%q,"insert_id":"ins-%012d","time":1700000000000,"event_properties":{"path":"/p/%d","pad":"%s"}}`, dev, i, i, padding)})
			if (i+1)%1000 == 0 {
				if err := sp.Append(context.Background(), l, &bt); err != nil {
					b.Fatal(err)
				}
				bt.Reset()
			}
		}
		before := simtest.Counted(sm)
		p, err := New(cfg, local(sp), cli, nil, nil, prometheus.NewRegistry())
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		b.StartTimer()
		start := time.Now()
		go func() { done <- p.Run(ctx) }()
		for simtest.Counted(sm)-before < int64(events) {
			for _, st := range p.LaneStatus() {
				peak = max(peak, st.ReadAheadBytes)
			}
			time.Sleep(time.Millisecond)
		}
		total += time.Since(start)
		b.StopTimer()
		cancel()
		<-done
		sp.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(events)*float64(b.N)/total.Seconds(), "events/s")
	b.ReportMetric(float64(peak)/(1<<20), "readahead-MiB")
}
