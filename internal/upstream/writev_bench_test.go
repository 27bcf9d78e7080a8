package upstream

import (
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/svcrelay/relay/internal/benchtest"
)

// BenchmarkBodyWrite measures, alone, the "upstream body from the
// chunk's slices with vectored writes" lever: a batch of N ~500-byte
// events written to a 127.0.0.1 TCP connection (a goroutine reads and
// discards) either as today (copied into one body buffer, then one write)
// or as a vectored write of the events where they are (net.Buffers: writev
// of the envelope, each event and the commas between them). cpu-ns/op is
// the process's CPU time per op (both ends; the reading end's cost is the
// same in both), a figure a loaded machine moves less than wall time. The
// events are not in the cache (64 sets of them, one per op in turn).
func BenchmarkBodyWrite(b *testing.B) {
	recs := make([][]byte, 1000)
	for i := range recs {
		recs[i] = fmt.Appendf(nil, `{"insert_id":"0f8fad5b-d9cb-469f-a165-%012d","time":1763700000000,"user_id":"user-%08d@example.com","device_id":"%08x-f612-4926-836d-1850ef4cd2b3","event_type":"Add To Cart","platform":"iOS","os_name":"ios","os_version":"17.5.1","ip":"192.0.2.1","event_properties":{"product_id":"SKU-%06d","category":"garden","price":245.37,"quantity":3,"tags":["ad","dolore"],"note":"lorem ipsum dolor sit amet consectetur"},"user_properties":{"plan":"enterprise","signup_cohort":"2026-W36","beta":true}}`,
			i, i, i*2654435761, i)
	}
	// 64 copies of the events, one per op in turn (~32 MB): the batcher
	// writes records read from the spool a while ago, not in the cache.
	sets := make([][][]byte, 64)
	for j := range sets {
		sets[j] = make([][]byte, len(recs))
		for i, r := range recs {
			sets[j][i] = append([]byte(nil), r...)
		}
	}
	prefix, suffix, comma := []byte(`{"api_key":"bench-api-key-0123456789abcdef","events":[`), []byte(`]}`), []byte(",")
	for _, n := range []int{100, 1000} {
		for _, mode := range []string{"copy", "writev"} {
			b.Run(fmt.Sprintf("mode=%s/events=%d", mode, n), func(b *testing.B) {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				defer ln.Close()
				done := make(chan struct{})
				go func() {
					defer close(done)
					c, err := ln.Accept()
					if err != nil {
						return
					}
					defer c.Close()
					_, _ = io.Copy(io.Discard, c)
				}()
				conn, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				defer func() { conn.Close(); <-done }()
				var body []byte
				var iov [][]byte
				size := len(prefix) + len(suffix) + n - 1
				for _, r := range recs[:n] {
					size += len(r)
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				cpu0 := benchtest.ProcessCPU()
				b.ResetTimer()
				for op := range b.N {
					recs := sets[op%len(sets)]
					switch mode {
					case "copy":
						body = append(body[:0], prefix...)
						for i, r := range recs[:n] {
							if i > 0 {
								body = append(body, ',')
							}
							body = append(body, r...)
						}
						body = append(body, suffix...)
						if _, err := conn.Write(body); err != nil {
							b.Fatal(err)
						}
					case "writev":
						iov = append(iov[:0], prefix)
						for i, r := range recs[:n] {
							if i > 0 {
								iov = append(iov, comma)
							}
							iov = append(iov, r)
						}
						iov = append(iov, suffix)
						bufs := net.Buffers(iov)
						if _, err := bufs.WriteTo(conn); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(benchtest.ProcessCPU()-cpu0)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}
