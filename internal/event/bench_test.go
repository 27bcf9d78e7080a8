package event

import (
	"fmt"
	"regexp"
	"testing"

	"github.com/svcrelay/relay/internal/benchtest"
)

// BenchmarkParseSDK parses 100 SDK-shaped events (benchtest.SDKEvent) per request.
func BenchmarkParseSDK(b *testing.B) {
	const n = 100
	evs := make([]string, n)
	for i := range evs {
		evs[i] = benchtest.SDKEvent(i)
	}
	body := []byte(envelope(evs...))
	b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) { benchParse(b, body, false) })
	// As the ingest parses when a tracking plan is enforced.
	b.Run(fmt.Sprintf("events=%d/members", n), func(b *testing.B) { benchParse(b, body, true) })
}

// benchParse parses body b.N times into one Request (recording property
// members when members) and reports the process's CPU per parse
// (cpu-ns/op).
func benchParse(b *testing.B, body []byte, members bool) {
	req := Request{PlanMembers: members}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	cpu0 := benchtest.ProcessCPU()
	for b.Loop() {
		if err := Parse(body, &req); err != nil {
			b.Fatal(errJSON(err))
		}
	}
	b.ReportMetric(float64(benchtest.ProcessCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}

func BenchmarkParse(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		body := []byte(envelope(realisticEvents(n)...))
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			benchParse(b, body, false)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
		})
	}
}

func BenchmarkAppendRewritten(b *testing.B) {
	body := []byte(envelope(realisticEvents(100)...))
	var req Request
	if err := Parse(body, &req); err != nil {
		b.Fatal(errJSON(err))
	}
	b.SetBytes(int64(len(req.Events[0].Raw)))
	benchRewrite(b, req.Events)
}

func BenchmarkIDGenAppend(b *testing.B) {
	g := NewIDGen()
	dst := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		dst = g.Append(dst[:0])
	}
}

func BenchmarkIDGenAppendParallel(b *testing.B) {
	g := NewIDGen()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]byte, 0, 64)
		for pb.Next() {
			dst = g.Append(dst[:0])
		}
	})
}

// BenchmarkAppendRewrittenFill rewrites events that need an insert_id and a
// time filled in (as the SDKs send them).
func BenchmarkAppendRewrittenFill(b *testing.B) {
	evs := realisticEvents(100)
	drop := regexp.MustCompile(`"(insert_id|time)":("[^"]*"|[0-9]+),`)
	for i, e := range evs {
		evs[i] = drop.ReplaceAllString(e, "")
	}
	body := []byte(envelope(evs...))
	var req Request
	if err := Parse(body, &req); err != nil {
		b.Fatal(errJSON(err))
	}
	if req.Events[0].HasTime || req.Events[0].HasInsertID {
		b.Fatal("the events have a time or insert_id")
	}
	benchRewrite(b, req.Events)
}

// benchRewrite rewrites evs in turn, as the ingest does for each request.
func benchRewrite(b *testing.B, evs []Event) {
	ids := NewIDGen()
	ip, now := []byte("192.0.2.7"), []byte("1700000000000")
	dst := make([]byte, 0, 1024)
	b.ReportAllocs()
	i := 0
	cpu0 := benchtest.ProcessCPU()
	for b.Loop() {
		dst = evs[i%len(evs)].AppendRewritten(dst[:0], ids, now, ip)
		i++
	}
	b.ReportMetric(float64(benchtest.ProcessCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}
