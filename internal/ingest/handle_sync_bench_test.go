package ingest

import (
	"fmt"
	"net"
	"testing"

	"github.com/svcrelay/relay/internal/benchtest"
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
	h, body := benchHandler(b, false, n)
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
