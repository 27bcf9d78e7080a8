package ingest

import (
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/svcrelay/relay/internal/benchtest"
	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/valyala/fasthttp"
)

// BenchmarkHandleSync is BenchmarkHandle under the setting, a
// spool fsynced per commit (--sync always), with 32 concurrent handlers as
// 32 connections (and with 1): the WAL writer's group commits, fdatasyncs
// and hand-offs are in its cpu-ns/op as they are in the relay's.
func BenchmarkHandleSync(b *testing.B) {
	for _, par := range []int{1, 32} {
		for _, n := range []int{1, 100} {
			b.Run(fmt.Sprintf("sync=always/events=%d/handlers=%d", n, par), func(b *testing.B) {
				benchHandleSync(b, n, par)
			})
		}
	}
}

func benchHandleSync(b *testing.B, n, par int) {
	sp, err := spool.Open(spool.Config{Dir: b.TempDir(), Sync: spool.SyncAlways, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer sp.Close()
	s, err := New(Config{}, sp, event.NewIDGen(), nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	events := make([]string, n)
	for i := range events {
		events[i] = benchtest.SDKEvent(i)
	}
	body := envelope("bench-api-key-0123456789abcdef", "", events...)
	lane, err := sp.Lane(context.Background(), spool.LaneKey{Kind: spool.KindEvents, APIKey: "bench-api-key-0123456789abcdef"})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	drained := make(chan struct{})
	go func() { // the lane's reader: read, release, acknowledge
		defer close(drained)
		var recs []spool.Record
		for {
			cs, more, err := lane.NextInto(ctx, 1<<20, recs)
			if err != nil {
				return
			}
			recs = more
			for _, c := range cs {
				c.Buffer().Release()
				sp.Ack(lane, c.Seq)
			}
		}
	}()
	defer func() { cancel(); <-drained }()
	h := s.Handler()
	run := func(pb func() bool) {
		remote := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1234}
		var req fasthttp.Request
		req.Header.SetMethod("POST")
		req.SetRequestURI("/2/httpapi")
		req.Header.SetContentType("application/json")
		req.SetBody(body)
		var rc fasthttp.RequestCtx
		for pb() {
			rc.Init(&req, remote, nil)
			h(&rc)
			if rc.Response.StatusCode() != 200 {
				b.Errorf("answer %d %s", rc.Response.StatusCode(), rc.Response.Body())
				return
			}
		}
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	cpu0 := benchtest.ProcessCPU()
	b.ResetTimer()
	if par == 1 {
		i := 0
		run(func() bool { i++; return i <= b.N })
	} else {
		b.SetParallelism((par + 1) / 2) // GOMAXPROCS 2 on the reference machine
		b.RunParallel(func(pb *testing.PB) { run(pb.Next) })
	}
	b.StopTimer()
	b.ReportMetric(float64(benchtest.ProcessCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}
