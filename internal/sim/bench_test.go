package sim

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/svcrelay/relay/internal/sim/wiretest"
)

func benchBody(n int) []byte {
	evs := make([]string, n)
	for i := range evs {
		evs[i] = fmt.Sprintf(`{"event_type":"purchase","device_id":"device-%04d","user_id":"user-%04d","insert_id":"ins-%08d","time":1700000000000,"event_properties":{"price":9.99,"sku":"abc-123","tags":["a","b"]}}`, i%100, i%100, i)
	}
	return wiretest.Envelope("bench-key", evs...)
}

// BenchmarkValidateHTTP measures the full (validating, storing) sim.
func BenchmarkValidateHTTP(b *testing.B) {
	s, url := start(b, Config{KeepRequests: 1000, Keep: 100_000, EPSThreshold: 1 << 30})
	bodies := make([][]byte, 64)
	for i := range bodies {
		bodies[i] = bytes.ReplaceAll(benchBody(1000), []byte(`"ins-`), []byte(fmt.Sprintf(`"ins-%d-`, i)))
	}
	b.SetBytes(int64(len(bodies[0])))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		resp, err := client.Post(url+"/2/httpapi", "application/json", bytes.NewReader(bodies[i%len(bodies)]))
		i++
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
	}
	b.ReportMetric(float64(s.Count()+s.Duplicates())/b.Elapsed().Seconds(), "events/s")
}
