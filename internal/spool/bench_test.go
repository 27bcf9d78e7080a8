package spool

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/storage"
)

// benchRecord is a realistic ~490-byte event.
func benchRecord(n int) storage.Record {
	d := fmt.Appendf(nil, `{"user_id":"user-%08d","device_id":"dev-%08d","event_type":"page_view","time":1700000000000,"insert_id":"%032d","event_properties":{"path":"/products/%d","referrer":"https://example.com/search?q=shoes","ab":"variant-b"},"user_properties":{"plan":"pro","country":"DE"},"platform":"Web","os_name":"Linux","app_version":"1.2.3","ip":"203.0.113.7","library":"svc-js/8.1.0"}`, n, n, n, n)
	for len(d) < 490 {
		d = append(d, ' ')
	}
	return storage.Record{OrderKey: fmt.Appendf(nil, "dev-%08d", n), UserID: fmt.Appendf(nil, "user-%08d", n), Data: d}
}

// BenchmarkAppend measures Append of chunks of 1, 10 and 100 ~490-byte
// records, fsynced or not, from 1 and 32 concurrent appenders (32 goroutines
// per P via SetParallelism). records/s is the figure that matters: records
// per WAL write x writes per second. Nothing acknowledges the chunks, so
// past the hot chunks' memory bound they also go through checkpoints into
// bbolt, as while the upstream is down. Figures: bench/RESULTS.md.
func BenchmarkAppend(b *testing.B) {
	for _, mode := range []struct {
		name   string
		noSync bool
	}{{"always", false}, {"none", true}} {
		for _, per := range []int{1, 10, 100} {
			for _, par := range []int{1, 32} {
				b.Run(fmt.Sprintf("sync=%s/records=%d/appenders=%d", mode.name, per, par), func(b *testing.B) {
					benchAppend(b, mode.noSync, per, par)
				})
			}
		}
	}
}

// benchLane opens a spool of cfg in a temp dir (closed when b ends), its
// lane of testKey(1) and per benchmark records.
func benchLane(b *testing.B, cfg Config, per int) (*Spool, *Lane, []storage.Record) {
	b.Helper()
	cfg.Dir = b.TempDir()
	s, err := Open(cfg, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	l, err := s.Lane(context.Background(), testKey(1))
	if err != nil {
		b.Fatal(err)
	}
	recs := make([]storage.Record, per)
	for i := range recs {
		recs[i] = benchRecord(i)
	}
	return s, l, recs
}

func benchAppend(b *testing.B, noSync bool, per, par int) {
	s, l, recs := benchLane(b, Config{NoSync: noSync, CompactMinFileBytes: -1}, per)
	var bytes atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	run := func(pb func() bool) {
		var batch storage.Batch
		for pb() {
			batch.Reset()
			for _, r := range recs {
				batch.Add(r)
			}
			n := batch.Bytes() // Append takes the records
			if err := s.Append(context.Background(), l, &batch); err != nil {
				b.Error(err)
				return
			}
			bytes.Add(int64(n))
		}
	}
	if par == 1 {
		n := 0
		run(func() bool { n++; return n <= b.N })
	} else {
		b.SetParallelism(par)
		b.RunParallel(func(pb *testing.PB) { run(pb.Next) })
	}
	el := time.Since(start).Seconds()
	b.StopTimer()
	b.ReportMetric(float64(b.N*per)/el, "records/s")
	b.ReportMetric(float64(bytes.Load())/el/1e6, "MB/s")
}

// BenchmarkDrain measures Next+Ack over a backlog of 100-record chunks in
// bbolt (appended, then the spool reopened).
func BenchmarkDrain(b *testing.B) { benchDrain(b, false) }

// BenchmarkDrainInto is BenchmarkDrain with NextPart, as the batcher reads.
func BenchmarkDrainInto(b *testing.B) { benchDrain(b, true) }

func benchDrain(b *testing.B, into bool) {
	dir := b.TempDir()
	s, err := Open(Config{Dir: dir, NoSync: true, CompactMinFileBytes: -1}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	l, err := s.Lane(ctx, testKey(1))
	if err != nil {
		b.Fatal(err)
	}
	recs := make([]storage.Record, 100)
	for i := range recs {
		recs[i] = benchRecord(i)
	}
	var batch storage.Batch
	for range b.N {
		for _, r := range recs {
			batch.Add(r)
		}
		if err := s.Append(ctx, l, &batch); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	if s, err = Open(Config{Dir: dir, NoSync: true, CompactMinFileBytes: -1}, nil, nil); err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	l = s.Lanes()[0]
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var reuse []storage.Record
	for n := 0; n < b.N; {
		var cs []storage.Chunk
		if into {
			cs, reuse, err = l.NextPart(ctx, 4<<20, reuse)
		} else {
			cs, err = readWhole(ctx, l, 4<<20)
		}
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range cs {
			l.Ack(c.Seq)
		}
		n += len(cs)
	}
	el := time.Since(start).Seconds()
	b.StopTimer()
	b.ReportMetric(float64(b.N*100)/el, "records/s")
}
