package spool

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"

	bolt "go.etcd.io/bbolt"
)

// TestLargeChunksWrittenOnce checks that bbolt writes a large chunk once:
// putting it does not rewrite the chunk before it, and deleting it does not
// rewrite the one after it (chunkstore.go). Every chunk goes to bbolt in a
// checkpoint of its own, as under a backlog; bbolt's page allocations over
// the puts and the deletes stay within 15% of the chunk bytes (1.06x here:
// each commit also copies a few small pages). As plain values, two to a
// leaf, they were 6.9 times the chunk bytes.
func TestLargeChunksWrittenOnce(t *testing.T) {
	s := openTest(t, Config{Dir: t.TempDir(), NoSync: true, CompactMinFileBytes: -1,
		flushAge: time.Nanosecond, checkpointEvery: time.Millisecond})
	l := mustLane(t, s, testKey(1))
	const chunks, perChunk, pad = 40, 20, 25000 // ~500 KB chunks, as of 1000-event requests
	pageAlloc := func() int64 { st := s.db.Stats(); return st.TxStats.GetPageAlloc() }
	before := pageAlloc()
	for i := range chunks {
		appendChunks(t, s, l, 1, 1, perChunk, pad+i) // sizes differ, as they do
		waitCheckpointed(t, s)
	}
	put := l.Stats().Bytes
	cs := drainAvailable(t, l)
	if len(cs) != chunks {
		t.Fatalf("read %d chunks, appended %d", len(cs), chunks)
	}
	for i, c := range cs {
		if _, n := recID(c.Records[0]); n != 0 || len(c.Records) != perChunk || len(c.Records[0].Data) != len(rec(1, 0, pad+i).Data) {
			t.Fatalf("chunk %d: %d records, first %q...", i, len(c.Records), c.Records[0].Data[:20])
		}
		c.Buffer.Release()
		l.Ack(c.Seq) // one at a time: each delete its own commit
		polltest.Until(t, fmt.Sprintf("the ack of chunk %d applied", i), func() bool { return l.Stats().Chunks == int64(chunks-i-1) })
	}
	alloc := pageAlloc() - before
	t.Logf("chunk bytes %d, bbolt page allocations %d (%.2fx)", put, alloc, float64(alloc)/float64(put))
	if alloc > put*23/20 {
		t.Fatalf("bbolt allocated %d bytes of pages for %d bytes of chunks", alloc, put)
	}
}

// TestReadsPlainChunks checks that a file of format 2, whose chunks are all
// plain values, is read, acknowledged and appended to as before, and is
// marked format 3 once opened.
func TestReadsPlainChunks(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, NoSync: true, CompactMinFileBytes: -1}
	s, err := Open(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	l := mustLane(t, s, testKey(1))
	const chunks, perChunk = 12, 10
	for i := range chunks {
		pad := 10
		if i%3 != 0 {
			pad = 8000 // ~80 KB: a bucket of its own in format 3
		}
		appendChunks(t, s, l, 1, 1, perChunk, pad)
	}
	if err := s.Close(); err != nil { // everything into bbolt
		t.Fatal(err)
	}

	// Rewrite it as an older relay wrote it.
	path := filepath.Join(dir, "spool.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	nested := 0
	err = db.Update(func(tx *bolt.Tx) error {
		q := tx.Bucket(queueName(1))
		var keys [][]byte
		_ = q.ForEach(func(k, v []byte) error {
			if v == nil {
				keys = append(keys, k)
			}
			return nil
		})
		for _, k := range keys {
			v := append([]byte(nil), q.Bucket(k).Get(chunkValueKey)...)
			if err := q.DeleteBucket(k); err != nil {
				return err
			}
			if err := q.Put(k, v); err != nil {
				return err
			}
			nested++
		}
		return tx.Bucket(bucketMeta).Put(keyFormat, seqKey(2))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if nested != chunks*2/3 {
		t.Fatalf("%d of %d chunks were buckets, want the %d large ones", nested, chunks, chunks*2/3)
	}

	s = openTest(t, cfg)
	l = s.Lanes()[0]
	cs := drainAvailable(t, l)
	if len(cs) != chunks {
		t.Fatalf("read %d chunks of a format 2 file, it holds %d", len(cs), chunks)
	}
	for i, c := range cs {
		if _, n := recID(c.Records[0]); n != 0 || len(c.Records) != perChunk {
			t.Fatalf("chunk %d: %d records, first n=%d", i, len(c.Records), n)
		}
		if i < chunks/2 {
			l.Ack(c.Seq)
		}
	}
	appendChunks(t, s, l, 1, 2, perChunk, 8000) // format 3 after the plain ones
	waitCheckpointed(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, cfg)
	l = s.Lanes()[0]
	if cs := drainAvailable(t, l); len(cs) != chunks-chunks/2+2 {
		t.Fatalf("after acking %d of %d and appending 2: %d chunks", chunks/2, chunks, len(cs))
	}
	_ = s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyFormat); binary.BigEndian.Uint64(v) != formatVersion {
			t.Errorf("format %x after opening a format 2 file", v)
		}
		return nil
	})
}
