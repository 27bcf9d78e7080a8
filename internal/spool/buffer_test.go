package spool

import (
	"bytes"
	"context"
	"testing"
	"time"
	"unsafe"
)

func TestBufClass(t *testing.T) {
	for _, tt := range []struct{ n, class, size int }{
		{0, 0, 512}, {1, 0, 512}, {512, 0, 512}, {513, 1, 640}, {640, 1, 640}, {641, 2, 768}, {1024, 4, 1024},
		{1025, 5, 1280}, {4096, 12, 4096}, {4097, 13, 5120}, {513 << 10, 41, 640 << 10}, {1 << 20, 44, 1 << 20},
		{16 << 20, numClasses - 1, 16 << 20}, {16<<20 + 1, -1, 0},
	} {
		if got := bufClass(tt.n); got != tt.class {
			t.Errorf("bufClass(%d) = %d, want %d", tt.n, got, tt.class)
		}
		if tt.class >= 0 && classSize(tt.class) != tt.size {
			t.Errorf("classSize(%d) = %d, want %d", tt.class, classSize(tt.class), tt.size)
		}
	}
	// Every size has the smallest class that holds it, wasting at most a
	// fifth of it.
	for n := 1; n <= 16<<20; n += 1 + n/7 {
		c := bufClass(n)
		if size := classSize(c); size < n || (c > 0 && classSize(c-1) >= n) || (n > 512 && size-n > size/5) {
			t.Fatalf("bufClass(%d) = %d of %d bytes", n, c, size)
		}
	}
}

// A released chunk buffer serves a later read and the records read into it
// are right; a chunk whose buffer is not released keeps its records,
// whatever is read after it. The chunks are read from bbolt (the spool was
// reopened), so each read copies into a buffer of its own.
func TestChunkBufferRecycled(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir, NoSync: true, CompactMinFileBytes: -1})
	l := mustLane(t, s, testKey(1))
	const chunks = 10
	var b Batch
	for i := range chunks {
		for j := range 10 {
			b.Add(rec(1, i*10+j, 500))
		}
		if err := s.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	s = openTest(t, Config{Dir: dir, NoSync: true, CompactMinFileBytes: -1})
	l = mustLane(t, s, testKey(1))
	first := nextT(t, l, 0)[0] // one chunk per call
	kept := bytes.Clone(first.Records[0].Data)
	reused := 0
	prev := nextT(t, l, 0)[0]
	for i := 2; i < chunks; i++ {
		addr := unsafe.SliceData(prev.Records[0].Data)
		prev.Buffer.Release()
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

// A chunk still only in the WAL is read without a copy: the reader gets the
// very buffer the Batch built, which stays intact while either the spool
// (until the Ack) or the reader (until Release) holds it, and serves a later
// Batch once both let it go.
func TestHotChunkSharedBuffer(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, Config{NoSync: true, CompactMinFileBytes: -1, flushAge: time.Hour})
	l := mustLane(t, s, testKey(1))
	var b Batch
	for j := range 10 {
		b.Add(rec(1, j, 500))
	}
	built, size := uintptr(unsafe.Pointer(unsafe.SliceData(b.cb.b))), uintptr(cap(b.cb.b))
	if err := s.Append(ctx, l, &b); err != nil {
		t.Fatal(err)
	}
	if b.n != 0 || b.Bytes() != 0 {
		t.Fatalf("batch after Append: %d records, %d bytes", b.n, b.Bytes())
	}
	c := nextT(t, l, 0)[0]
	if p := uintptr(unsafe.Pointer(unsafe.SliceData(c.Records[0].Data))); p < built || p >= built+size {
		t.Fatal("the hot chunk was copied")
	}
	want := bytes.Clone(c.Records[9].Data)
	check := func(when string) {
		t.Helper()
		if !bytes.Equal(c.Records[9].Data, want) {
			t.Fatalf("%s: record changed under the reader", when)
		}
	}
	// Other batches of the same class, built while the chunk is held.
	fill := func() {
		for range 4 {
			var o Batch
			for j := range 10 {
				o.Add(rec(1, 100+j, 500))
			}
			copy(o.cb.b[chunkHeaderLen:], bytes.Repeat([]byte{'z'}, len(o.cb.b)-chunkHeaderLen))
		}
	}
	s.Ack(l, c.Seq) // the spool lets go; the reader still holds it
	fill()
	check("after Ack")
	c.Buffer.Release()
	if st := l.Stats(); st.Chunks != 0 || s.hotHeld.Load() != 0 {
		t.Fatalf("after Ack and Release: %+v, hot %d bytes", st, s.hotHeld.Load())
	}
	var again Batch
	again.Add(rec(1, 1, 500))
	t.Logf("buffer reused by the next batch: %v", uintptr(unsafe.Pointer(unsafe.SliceData(again.cb.b))) == built)
}
