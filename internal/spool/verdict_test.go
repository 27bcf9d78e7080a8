package spool

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/svcrelay/relay/internal/storage"
)

// TestVerdictMarks: a chunk of a Batch given a verdict carries it, and each
// record its mark, through every way the spool reads a chunk (the WAL's
// index, bbolt after a reopen, a part of a chunk cut to a byte budget); a
// chunk without one (as every chunk written before verdicts) reads as
// before, its records without a verdict; a bad mark or an unknown flag is
// damage.
func TestVerdictMarks(t *testing.T) {
	const v = 0xfeedface_12345672
	marked := func(i int) bool { return i%3 != 1 }
	fill := func(b *storage.Batch, verdict uint64, n int) {
		b.Reset()
		b.Vet(verdict)
		for i := range n {
			r := rec(1, i, 40)
			if i%2 == 0 {
				b.Add(r)
			} else {
				b.AddFunc(r.OrderKey, r.UserID, len(r.Data), func(dst []byte) []byte { return append(dst, r.Data...) })
			}
			if marked(i) {
				b.MarkClean()
			}
		}
	}
	check := func(how string, rs []storage.Record, verdict uint64, first int) {
		t.Helper()
		for k, r := range rs {
			i := first + k
			if _, id := recID(r); id != i {
				t.Fatalf("%s: record %d read as %d", how, i, id)
			}
			want := uint64(0)
			if verdict != 0 && marked(i) {
				want = verdict
			}
			if r.Verdict != want {
				t.Errorf("%s: record %d verdict %#x, want %#x", how, i, r.Verdict, want)
			}
		}
	}

	var b storage.Batch
	fill(&b, v, 7)
	check("batch", b.Records(), v, 0)
	putChunkHeader(b.Encoded(), 1, b.Len(), b.Verdict() != 0)
	var c storage.Chunk
	if err := decodeChunk(1, b.Encoded(), &c, nil); err != nil {
		t.Fatal(err)
	}
	check("decoded", c.Records, v, 0)
	for cut := range b.Encoded() {
		if err := decodeRecords(1, b.Encoded()[:cut], &c, nil); err == nil {
			t.Fatalf("chunk cut to %d of %d bytes decoded", cut, len(b.Encoded()))
		}
	}
	bad := append([]byte(nil), b.Encoded()...)
	bad[len(bad)-1] = 2 // the last record's mark
	if err := decodeRecords(1, bad, &c, nil); !errors.Is(err, errCorrupt) {
		t.Errorf("a mark of 2: %v", err)
	}
	bad = append(bad[:0], b.Encoded()...)
	bad[17] = flagVerdict << 1
	if err := decodeRecords(1, bad, &c, nil); !errors.Is(err, errCorrupt) {
		t.Errorf("unknown flags: %v", err)
	}
	// A batch without a verdict is the chunk of before: no flag, no marks
	// (MarkClean does nothing).
	fill(&b, 0, 7)
	putChunkHeader(b.Encoded(), 1, b.Len(), b.Verdict() != 0)
	if b.Encoded()[17] != 0 {
		t.Fatalf("flags %#x without a verdict", b.Encoded()[17])
	}
	if err := decodeChunk(1, b.Encoded(), &c, nil); err != nil {
		t.Fatal(err)
	}
	check("unmarked", c.Records, 0, 0)

	// Through a spool: from the WAL's index, then from bbolt after a
	// reopen, whole and cut into parts.
	dir := t.TempDir()
	ctx := context.Background()
	s := openTest(t, Config{Dir: dir})
	l := mustLane(t, s, testKey(1))
	fill(&b, v, 7)
	if err := s.Append(ctx, l, &b); err != nil {
		t.Fatal(err)
	}
	fill(&b, 0, 7)
	if err := s.Append(ctx, l, &b); err != nil {
		t.Fatal(err)
	}
	cs := nextN(t, l, 2)
	if len(cs) != 2 {
		t.Fatalf("%d chunks", len(cs))
	}
	check("hot", cs[0].Records, v, 0)
	check("hot, no verdict", cs[1].Records, 0, 0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, Config{Dir: dir})
	l = s.Lanes()[0]
	cs = nextN(t, l, 2)
	if len(cs) != 2 {
		t.Fatalf("%d chunks after a reopen", len(cs))
	}
	check("bbolt", cs[0].Records, v, 0)
	check("bbolt, no verdict", cs[1].Records, 0, 0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, Config{Dir: dir})
	l = s.Lanes()[0]
	read := 0
	for read < 7 {
		ps, _, err := l.NextPart(context.Background(), 100, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) != 1 || ps[0].Seq != cs[0].Seq || ps[0].Total != 7 {
			t.Fatalf("part: %d chunks, %+v", len(ps), ps)
		}
		if len(ps[0].Records) >= 7 {
			t.Fatal("the chunk was not cut into parts")
		}
		check("part", ps[0].Records, v, read)
		read += len(ps[0].Records)
	}
}

// nextN reads n chunks of l.
func nextN(t *testing.T, l *Lane, n int) []storage.Chunk {
	t.Helper()
	var cs []storage.Chunk
	for len(cs) < n {
		cs = append(cs, nextT(t, l, 1<<20)...)
	}
	return cs
}

// TestFormat4Upgrade: a spool of format 4 (its chunks without verdicts,
// as every chunk was) opens and reads as before, its records without a
// verdict, and is of the current format afterwards (so that a relay of
// format 4 refuses it rather than reading a marked chunk as damage).
func TestFormat4Upgrade(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir})
	l := mustLane(t, s, testKey(1))
	var b storage.Batch
	for i := range 5 {
		b.Add(rec(1, i, 10))
	}
	if err := s.Append(context.Background(), l, &b); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	setFormat := func(v uint64) {
		t.Helper()
		db, err := bolt.Open(filepath.Join(dir, "spool.db"), 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyFormat, seqKey(v)) }); err != nil {
			t.Fatal(err)
		}
	}
	setFormat(4)
	s = openTest(t, Config{Dir: dir})
	cs := nextN(t, s.Lanes()[0], 1)
	if len(cs[0].Records) != 5 {
		t.Fatalf("%d records", len(cs[0].Records))
	}
	for i, r := range cs[0].Records {
		if _, id := recID(r); id != i || r.Verdict != 0 {
			t.Errorf("record %d: id %d, verdict %#x", i, id, r.Verdict)
		}
	}
	if err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyFormat); string(v) != string(seqKey(formatVersion)) {
			t.Errorf("format %x after opening a format-4 spool", v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
