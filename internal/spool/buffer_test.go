package spool

import (
	"bytes"
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/svcrelay/relay/internal/storage"
)

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
	var b storage.Batch
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
	var zero storage.Buffer
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
	var b storage.Batch
	for j := range 10 {
		b.Add(rec(1, j, 500))
	}
	built, size := uintptr(unsafe.Pointer(unsafe.SliceData(b.Encoded()))), uintptr(cap(b.Encoded()))
	if err := s.Append(ctx, l, &b); err != nil {
		t.Fatal(err)
	}
	if b.Len() != 0 || b.Bytes() != 0 {
		t.Fatalf("batch after Append: %d records, %d bytes", b.Len(), b.Bytes())
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
			var o storage.Batch
			for j := range 10 {
				o.Add(rec(1, 100+j, 500))
			}
			copy(o.Encoded()[chunkHeaderLen:], bytes.Repeat([]byte{'z'}, len(o.Encoded())-chunkHeaderLen))
		}
	}
	l.Ack(c.Seq) // the spool lets go; the reader still holds it
	fill()
	check("after Ack")
	c.Buffer.Release()
	if st := l.Stats(); st.Chunks != 0 || s.hotHeld.Load() != 0 {
		t.Fatalf("after Ack and Release: %+v, hot %d bytes", st, s.hotHeld.Load())
	}
	var again storage.Batch
	again.Add(rec(1, 1, 500))
	t.Logf("buffer reused by the next batch: %v", uintptr(unsafe.Pointer(unsafe.SliceData(again.Encoded()))) == built)
}
