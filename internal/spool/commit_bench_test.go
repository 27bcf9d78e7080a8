package spool

import (
	"context"
	"fmt"
	"testing"

	"github.com/svcrelay/relay/internal/benchtest"
	"github.com/svcrelay/relay/internal/storage"
)

// BenchmarkCommit measures the append/commit path as the ingest drives it:
// appenders (1, or 32 goroutines as 32 connections' handlers) build a chunk
// of 100 ~490-byte records with AddFunc (as the handler does) and Append
// it, while a reader goroutine drains the lane and acknowledges every
// chunk (as the batcher does once delivered). An op is one Append.
// cpu-ns/op is the process's CPU time (user+system, every goroutine, the
// kernel's copy and fdatasync work included) per op: on a shared machine it
// moves far less than ns/op. syscalls are not counted here: see
// bench/RESULTS.md ("Twelfth session, spool commit path") for strace -c.
func BenchmarkCommit(b *testing.B) {
	for _, mode := range []struct {
		name   string
		noSync bool
	}{{"always", false}, {"none", true}} {
		for _, par := range []int{1, 32} {
			b.Run(fmt.Sprintf("sync=%s/records=100/appenders=%d", mode.name, par), func(b *testing.B) {
				benchCommit(b, mode.noSync, 100, par)
			})
		}
	}
}

func benchCommit(b *testing.B, noSync bool, per, par int) {
	s, l, recs := benchLane(b, Config{NoSync: noSync, MinFreeBytes: -1, CompactMinFileBytes: -1}, per)
	size := 0
	for _, r := range recs {
		size += len(r.OrderKey) + len(r.UserID) + len(r.Data) + 96
	}
	ctx, cancel := context.WithCancel(context.Background())
	drained := make(chan struct{})
	go func() { // the lane's reader: read, release, acknowledge
		defer close(drained)
		var rs []storage.Record
		for {
			cs, more, err := l.NextPart(ctx, 1<<20, rs)
			if err != nil {
				return
			}
			rs = more
			for _, c := range cs {
				c.Buffer.Release()
				l.Ack(c.Seq)
			}
		}
	}()
	defer func() { cancel(); <-drained }()
	run := func(pb func() bool) {
		var batch storage.Batch
		for pb() {
			batch.Reserve(size) // as the handler does
			for _, r := range recs {
				batch.AddFunc(r.OrderKey, r.UserID, len(r.Data)+64, func(dst []byte) []byte { return append(dst, r.Data...) })
			}
			if err := s.Append(context.Background(), l, &batch); err != nil {
				b.Error(err)
				return
			}
		}
	}
	b.ReportAllocs()
	cpu0 := benchtest.ProcessCPU()
	b.ResetTimer()
	if par == 1 {
		n := 0
		run(func() bool { n++; return n <= b.N })
	} else {
		b.SetParallelism((par + 1) / 2) // GOMAXPROCS 2 on the reference machine
		b.RunParallel(func(pb *testing.PB) { run(pb.Next) })
	}
	b.StopTimer()
	b.ReportMetric(float64(benchtest.ProcessCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}
