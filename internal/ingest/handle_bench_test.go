package ingest

import (
	"context"
	"fmt"
	"testing"

	"github.com/svcrelay/relay/internal/benchtest"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/valyala/fasthttp"
)

// BenchmarkHandle measures the handler alone, in process (no HTTP, no
// client: every allocation counted is the relay's), on SDK-shaped events
// (benchtest.SDKEvent), 1 and 100 per request, into a real spool under NoSync whose
// lane a reader goroutine drains and acknowledges (its reads are counted
// too: the spool's hand-over is part of the accept path's cost). An op is
// one request answered 200; events=N gives per-event figures in
// bench/gobench.sh; cpu-ns/op is the process's CPU time per request.
func BenchmarkHandle(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("shape=sdk/events=%d", n), func(b *testing.B) {
			benchHandle(b, true, n, 1)
		})
	}
}

// benchHandle calls the handler of benchHandler(b, noSync, n) in process,
// b.N times in all from par goroutines (1: in the benchmark's own),
// each request to be answered 200, and reports the process's CPU per
// request (cpu-ns/op: the handler, the WAL writer, the reader, the GC;
// what a loaded machine moves less than the wall time of ns/op).
func benchHandle(b *testing.B, noSync bool, n, par int) {
	h, body := benchHandler(b, noSync, n)
	run := func(pb func() bool) {
		req := inProcessRequest("/2/httpapi", body, "Content-Type", "application/json")
		var rc fasthttp.RequestCtx
		for pb() {
			callInProcess(h, req, &rc)
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

// benchHandler is the handler of a server on a real spool (noSync) in a
// temporary directory, whose lane a goroutine drains and acknowledges
// until the benchmark ends, and a request body of n SDK-shaped events.
func benchHandler(b *testing.B, noSync bool, n int) (fasthttp.RequestHandler, []byte) {
	b.Helper()
	s, sp := newServer(b, Config{}, noSync, nil)
	events := make([]string, n)
	for i := range events {
		events[i] = benchtest.SDKEvent(i)
	}
	body := envelope("bench-api-key-0123456789abcdef", "", events...)
	lane, err := sp.Lane(context.Background(), storage.LaneKey{Kind: storage.KindEvents, APIKey: "bench-api-key-0123456789abcdef"})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	drained := make(chan struct{})
	go func() { // the lane's reader: read, release, acknowledge
		defer close(drained)
		var recs []storage.Record
		for {
			cs, more, err := lane.NextPart(ctx, 1<<20, recs)
			if err != nil {
				return
			}
			recs = more
			for _, c := range cs {
				c.Buffer.Release()
				lane.Ack(c.Seq)
			}
		}
	}()
	b.Cleanup(func() { cancel(); <-drained })
	return s.strictHandle, body
}
