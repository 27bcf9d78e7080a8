package ingest

import (
	"fmt"
	"testing"

	"github.com/svcrelay/relay/internal/spool"
)

// BenchmarkAcceptOpen is BenchmarkAccept (sync=none, 1 and 100 events) with
// the settings for browsers and the open internet: off (the baseline), CORS (every request from an
// allowed Origin), and all of them (CORS, an allow-list, a client rate limit
// too high to refuse, anonymization of $remote and of a given ip in every
// event). The differences are their cost; measure on a quiet machine.
func BenchmarkAcceptOpen(b *testing.B) {
	const key = "bench-api-key-0123456789abcdef"
	for _, set := range []struct {
		name   string
		open   Open
		origin string
	}{
		{"off", Open{}, ""},
		{"cors", Open{CORSOrigins: []string{shopOrigin}}, shopOrigin},
		{"all", Open{CORSOrigins: []string{shopOrigin}, AllowedAPIKeys: []string{"k1", key}, ClientRateLimit: 1e9, AnonymizeIP: true}, shopOrigin},
	} {
		for _, n := range []int{1, 100} {
			b.Run(fmt.Sprintf("%s/events=%d", set.name, n), func(b *testing.B) {
				r := startRelay(b, Config{Open: set.open}, spool.Config{NoSync: true})
				events := make([]string, n)
				for i := range events {
					events[i] = realisticEvent(i)
					if i%2 == 1 { // half give their own ip
						events[i] = events[i][:len(events[i])-1] + `,"ip":"198.51.100.23"}`
					}
				}
				body := envelope(key, "", events...)
				var header []string
				if set.origin != "" {
					header = []string{"Origin", set.origin}
				}
				postParallel(b, r.addr, body, header...)
				b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "events/s")
			})
		}
	}
}
