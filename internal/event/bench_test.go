package event

import (
	"fmt"
	"testing"
)

func BenchmarkParse(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		body := []byte(envelope(realisticEvents(n)...))
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			var req Request
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if err := Parse(body, &req); err != nil {
					b.Fatal(errJSON(err))
				}
			}
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
	ids := NewIDGen()
	ip := []byte("192.0.2.7")
	dst := make([]byte, 0, 1024)
	b.ReportAllocs()
	b.SetBytes(int64(len(req.Events[0].Raw)))
	i := 0
	for b.Loop() {
		dst = req.Events[i%len(req.Events)].AppendRewritten(dst[:0], ids, 1700000000000, ip)
		i++
	}
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
