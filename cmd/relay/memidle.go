package main

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// After a burst the Go heap keeps the pages it grew to until its next GC,
// and an idle process collects only every two minutes: a relay that took a
// burst of 1000-event requests, or built a backlog while the upstream was
// down, sat at ~120 MiB of RSS (the memory limit) with a live heap of a few
// MB. returnIdleMemory watches the allocation rate and, once the process
// has gone quiet after allocating at least minAlloc, collects and gives the
// free pages back to the OS (debug.FreeOSMemory) once — two GCs of a small
// heap, only when nothing else is running.
const (
	idleCheckEvery = time.Second
	// idleQuietBytes: allocating less than this in idleCheckEvery is quiet
	// (metrics scrapes, delivery retries during an outage).
	idleQuietBytes = 1 << 20
	// idleMinAlloc: what must have been allocated since the last return
	// for another to be worth a GC (two of a small heap). Small: a relay
	// started on a backlog while the upstream is down allocates only a few
	// MB (a read-ahead step, the first request bodies) and then waits.
	idleMinAlloc = 4 << 20
	// idleGoroutinesGone: this many goroutines ended since the last return
	// is worth one too (retired lanes end 5 goroutines each and
	// allocate nothing doing it; 3,000 lanes left ~20 MB of stacks and
	// their garbage in the RSS until the two-minute GC).
	idleGoroutinesGone = 1000
)

// returnIdleMemory runs until ctx ends. release is called before collecting:
// the components' buffers kept for reuse.
func returnIdleMemory(ctx context.Context, every time.Duration, quiet, minAlloc uint64, release ...func()) {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/sched/goroutines:goroutines"}}
	metrics.Read(s)
	last, since := s[0].Value.Uint64(), uint64(0)
	peakG := s[1].Value.Uint64() // the most goroutines since the last return
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		metrics.Read(s)
		now := s[0].Value.Uint64()
		d := now - last
		last = now
		since += d
		g := s[1].Value.Uint64()
		peakG = max(peakG, g)
		if d < quiet && (since >= minAlloc || peakG >= g+idleGoroutinesGone) {
			for _, f := range release {
				f()
			}
			// The first GC moves sync.Pool contents (request and parse
			// buffers, fasthttp's contexts) to the pools' victim caches;
			// FreeOSMemory's own GC frees them, then returns the pages.
			runtime.GC()
			debug.FreeOSMemory()
			since, peakG = 0, g
		}
	}
}
