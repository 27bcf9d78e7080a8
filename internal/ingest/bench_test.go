package ingest

import (
	"fmt"
	"testing"

	"github.com/svcrelay/relay/internal/spool"
)

// benchClients is the number of concurrent HTTP clients of BenchmarkAccept.
const benchClients = 32

// BenchmarkAccept measures the accept path over real HTTP on 127.0.0.1:
// requests of 1, 10 and 100 realistic (~490-byte) events from 32 concurrent
// clients, into a real spool, fsynced or not (NoSync). An op is
// one request answered 200; allocations count the whole process (clients,
// server and spool). events/s is the throughput of answered events.
func BenchmarkAccept(b *testing.B) {
	for _, mode := range []struct {
		name   string
		noSync bool
	}{{"sync=always", false}, {"sync=none", true}} {
		for _, n := range []int{1, 10, 100} {
			b.Run(fmt.Sprintf("%s/events=%d", mode.name, n), func(b *testing.B) {
				benchAccept(b, mode.noSync, n)
			})
		}
	}
}

func benchAccept(b *testing.B, noSync bool, n int) {
	r := startRelay(b, Config{}, spool.Config{NoSync: noSync})
	events := make([]string, n)
	size := 0
	for i := range events {
		events[i] = realisticEvent(i)
		size += len(events[i])
	}
	body := envelope("bench-api-key-0123456789abcdef", "", events...)
	recs0, commits0 := r.histogram("relay_spool_commit_records")
	secs0, _ := r.histogram("relay_spool_commit_seconds")
	postParallel(b, r.addr, body)
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(size/n), "B/event")
	// The spool's view: records per commit (group commit at work) and the
	// mean commit time (two fdatasyncs per bbolt commit unless NoSync).
	recs, commits := r.histogram("relay_spool_commit_records")
	secs, _ := r.histogram("relay_spool_commit_seconds")
	if commits > commits0 {
		b.ReportMetric((recs-recs0)/float64(commits-commits0), "records/commit")
		b.ReportMetric(1000*(secs-secs0)/float64(commits-commits0), "ms/commit")
	}
}
