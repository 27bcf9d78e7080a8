package upstream

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/svcrelay/relay/internal/benchtest"
	"github.com/valyala/fasthttp"
)

// BenchmarkGzipBody measures what --upstream-gzip costs per request body
// (the gzip goal) at fasthttp's levels, as Client.Do runs it
// (AppendGzipBytesLevel into a fresh slice; it used level 6, now level 1),
// on 100 and 1000 varied SDK-shaped events. cpu-ns/op is the
// process's CPU time per body; ratio is compressed/raw bytes.
func BenchmarkGzipBody(b *testing.B) {
	r := rand.New(rand.NewSource(1))
	words := []string{"lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "garden", "shoes", "sale", "summer"}
	ev := func(i int) []byte {
		return fmt.Appendf(nil, `{"insert_id":"%08x-d9cb-469f-a165-%012x","time":%d,"user_id":"user-%08d@example.com","device_id":"%08x-f612-4926-836d-%012x","event_type":"Add To Cart","session_id":%d,"platform":"iOS","os_name":"ios","os_version":"17.5.1","language":"en-US","ip":"198.51.%d.%d","event_properties":{"product_id":"SKU-%06d","category":"%s","price":%d.%02d,"quantity":%d,"note":"%s %s %s","sent_us":%d},"user_properties":{"plan":"growth","signup_cohort":"2026-W%02d","beta":%t}}`,
			r.Uint32(), r.Int63n(1<<48), 1763700000000+int64(i), r.Intn(100000), r.Uint32(), r.Int63n(1<<48), 1763699990000+int64(r.Intn(1000))*1000,
			r.Intn(256), r.Intn(256), r.Intn(1000000), words[r.Intn(len(words))], r.Intn(300), r.Intn(100), 1+r.Intn(3),
			words[r.Intn(len(words))], words[r.Intn(len(words))], words[r.Intn(len(words))], 1795682223335742+int64(i), 1+r.Intn(52), r.Intn(2) == 0)
	}
	for _, n := range []int{100, 1000} {
		body := []byte(`{"api_key":"bench-api-key-0123456789abcdef","events":[`)
		for i := range n {
			if i > 0 {
				body = append(body, ',')
			}
			body = append(body, ev(i)...)
		}
		body = append(body, `]}`...)
		for _, lv := range []struct {
			name  string
			level int
		}{{"default-6", fasthttp.CompressDefaultCompression}, {"best-speed-1", fasthttp.CompressBestSpeed}, {"huffman-only", fasthttp.CompressHuffmanOnly}} {
			b.Run(fmt.Sprintf("level=%s/events=%d", lv.name, n), func(b *testing.B) {
				var out []byte
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				cpu0 := benchtest.ProcessCPU()
				b.ResetTimer()
				for range b.N {
					out = fasthttp.AppendGzipBytesLevel(nil, body, lv.level)
				}
				b.StopTimer()
				b.ReportMetric(float64(benchtest.ProcessCPU()-cpu0)/float64(b.N), "cpu-ns/op")
				b.ReportMetric(float64(len(out))/float64(len(body)), "ratio")
			})
		}
	}
}
