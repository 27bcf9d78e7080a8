package main

import (
	"context"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"
)

var sink [][]byte

// heapFreeBytes is the heap memory the runtime holds but does not use:
// what returnIdleMemory gives back.
func heapFreeBytes() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestReturnIdleMemory: after a burst of allocations that the program
// drops, the heap's free pages are returned once the process goes quiet,
// well before the runtime's own two-minute forced GC would.
func TestReturnIdleMemory(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		returnIdleMemory(ctx, 20*time.Millisecond, 1<<20, 32<<20)
	}()
	defer func() { cancel(); wg.Wait() }()

	// The burst: 96 MiB live, then dropped without a GC collecting it yet.
	for range 96 {
		sink = append(sink, make([]byte, 1<<20))
	}
	runtime.GC() // the pages are the heap's now; live while sink holds them
	sink = nil
	runtime.GC() // now free but still held by the runtime
	if f := heapFreeBytes(); f < 32<<20 {
		t.Skipf("the runtime released the burst itself (%d MiB free): nothing to test", f>>20)
	}
	deadline := time.Now().Add(5 * time.Second)
	for heapFreeBytes() > 16<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("heap still holds %d MiB of free pages 5 s after going quiet", heapFreeBytes()>>20)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
