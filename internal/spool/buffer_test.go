package spool

import (
	"bytes"
	"context"
	"testing"
	"unsafe"
)

func TestBufClass(t *testing.T) {
	for _, tt := range []struct{ n, class int }{
		{0, 0}, {1, 0}, {512, 0}, {513, 1}, {4096, 3}, {4097, 4}, {1 << 20, 11}, {1<<20 + 1, 12}, {16 << 20, 15}, {16<<20 + 1, -1},
	} {
		if got := bufClass(tt.n); got != tt.class {
			t.Errorf("bufClass(%d) = %d, want %d", tt.n, got, tt.class)
		}
	}
}

// A released chunk buffer serves a later read and the records read into it
// are right; a chunk whose buffer is not released keeps its records,
// whatever is read after it.
func TestChunkBufferRecycled(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, Config{Dir: t.TempDir(), Sync: SyncNone, CompactMinFileBytes: -1})
	l := mustLane(t, s, testKey(1))
	const chunks = 10
	var b Batch
	for i := range chunks {
		b.Reset()
		for j := range 10 {
			b.Add(rec(1, i*10+j, 500))
		}
		if err := s.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
	}
	first := nextT(t, l, 0)[0] // one chunk per call
	kept := bytes.Clone(first.Records[0].Data)
	reused := 0
	prev := nextT(t, l, 0)[0]
	for i := 2; i < chunks; i++ {
		addr := unsafe.SliceData(prev.Records[0].Data)
		prev.Buffer().Release()
		c := nextT(t, l, 0)[0]
		if unsafe.SliceData(c.Records[0].Data) == addr {
			reused++
		}
		for j, r := range c.Records {
			if _, id := recID(r); id != i*10+j {
				t.Fatalf("chunk %d record %d is %d", i, j, id)
			}
		}
		prev = c
	}
	if !bytes.Equal(first.Records[0].Data, kept) {
		t.Fatal("an unreleased chunk changed under later reads")
	}
	// sync.Pool may drop what it is given (under -race it drops some on
	// purpose), but not every time.
	if reused == 0 && !raceEnabled {
		t.Fatal("no released buffer was reused")
	}
	t.Logf("%d of %d released buffers reused", reused, chunks-2)
	var zero Buffer
	zero.Release() // no-op
}
