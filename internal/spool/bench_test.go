package spool

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// benchRecord is a realistic ~490-byte event.
func benchRecord(n int) Record {
	d := fmt.Appendf(nil, `{"user_id":"user-%08d","device_id":"dev-%08d","event_type":"page_view","time":1700000000000,"insert_id":"%032d","event_properties":{"path":"/products/%d","referrer":"https://example.com/search?q=shoes","ab":"variant-b"},"user_properties":{"plan":"pro","country":"DE"},"platform":"Web","os_name":"Linux","app_version":"1.2.3","ip":"203.0.113.7","library":"svc-js/8.1.0"}`, n, n, n, n)
	for len(d) < 490 {
		d = append(d, ' ')
	}
	return Record{OrderKey: fmt.Appendf(nil, "dev-%08d", n), UserID: fmt.Appendf(nil, "user-%08d", n), Data: d}
}

// BenchmarkAppend measures Append of chunks of 1, 10 and 100 ~490-byte
// records, fsynced or not, from 1 and 32 concurrent appenders (32 goroutines
// per P via SetParallelism). records/s is the figure that matters: records
// per commit x commits per second.
//
// go test -run '^$' -bench . -benchtime=1s ./internal/spool/ on the shared
// 2-core machine (load average ~8 from other work, so +-50%), 2026-11-22:
//
//	sync    records  appenders  ns/op    records/s  allocs/op
//	always  1        1          777k     1,287      92   (one commit = 2 fdatasyncs)
//	always  1        32         30k      32,964     8
//	always  10       1          997k     10,030     94
//	always  10       32         62k      160,741    9
//	always  100      1          4,962k   20,153     99
//	always  100      32         559k     178,876    9
//	none    1        1          121k     8,290      94
//	none    1        32         40k      24,815     20
//	none    10       1          261k     38,338     95
//	none    10       32         115k     87,268     24
//	none    100      1          888k     112,658    103
//	none    100      32         215k     464,875    14
//	Drain (Next+Ack, 100-record chunks): 695,280 records/s
//
// The allocations are bbolt's, per commit (its page buffers); the spool adds
// none per record.
func BenchmarkAppend(b *testing.B) {
	for _, mode := range []struct {
		name string
		sync SyncMode
	}{{"always", SyncAlways}, {"none", SyncNone}} {
		for _, per := range []int{1, 10, 100} {
			for _, par := range []int{1, 32} {
				b.Run(fmt.Sprintf("sync=%s/records=%d/appenders=%d", mode.name, per, par), func(b *testing.B) {
					benchAppend(b, mode.sync, per, par)
				})
			}
		}
	}
}

func benchAppend(b *testing.B, mode SyncMode, per, par int) {
	s, err := Open(Config{Dir: b.TempDir(), Sync: mode, CompactMinFileBytes: -1}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	l, err := s.Lane(context.Background(), testKey(1))
	if err != nil {
		b.Fatal(err)
	}
	recs := make([]Record, per)
	for i := range recs {
		recs[i] = benchRecord(i)
	}
	var bytes atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	run := func(pb func() bool) {
		var batch Batch
		for pb() {
			batch.Reset()
			for _, r := range recs {
				batch.Add(r)
			}
			if err := s.Append(context.Background(), l, &batch); err != nil {
				b.Error(err)
				return
			}
			bytes.Add(int64(batch.Bytes()))
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

// BenchmarkDrain measures Next+Ack over a backlog of 100-record chunks.
func BenchmarkDrain(b *testing.B) {
	s, err := Open(Config{Dir: b.TempDir(), Sync: SyncNone, CompactMinFileBytes: -1}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	l, err := s.Lane(ctx, testKey(1))
	if err != nil {
		b.Fatal(err)
	}
	var batch Batch
	for i := range 100 {
		batch.Add(benchRecord(i))
	}
	for range b.N {
		if err := s.Append(ctx, l, &batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for n := 0; n < b.N; {
		cs, err := l.Next(ctx, 4<<20)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range cs {
			s.Ack(l, c.Seq)
		}
		n += len(cs)
	}
	el := time.Since(start).Seconds()
	b.StopTimer()
	b.ReportMetric(float64(b.N*100)/el, "records/s")
}
