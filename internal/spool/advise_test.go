package spool

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/storage"
)

// rssFileKiB is the process's file-backed resident memory (the bbolt
// mapping's pages among it).
func rssFileKiB(t *testing.T) int64 {
	t.Helper()
	n := procRssFileKiB()
	if n == 0 {
		t.Skip("no RssFile in /proc/self/status")
	}
	return n
}

// procRssFileKiB is rssFileKiB for goroutines other than the test's: 0
// when /proc has no RssFile.
func procRssFileKiB() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "RssFile:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// appendChunks appends chunks chunks of perChunk records of lane (ids from
// 0 on, pad bytes each) to l.
func appendChunks(t *testing.T, s *Spool, l *Lane, lane, chunks, perChunk, pad int) {
	t.Helper()
	var b storage.Batch
	for i := range chunks {
		b.Reset()
		for j := range perChunk {
			b.Add(rec(lane, i*perChunk+j, pad))
		}
		if err := s.Append(context.Background(), l, &b); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReadDropsPages checks that reading a backlog does not leave its pages
// in the process's RSS (advise.go): 64 MiB of backlog (every chunk older
// than adviseAge) read through the mapping, and the file-backed RSS grows
// by a small fraction of it.
func TestReadDropsPages(t *testing.T) {
	s := openTest(t, Config{Dir: t.TempDir(), NoSync: true, CompactMinFileBytes: -1, adviseAge: time.Nanosecond})
	l := mustLane(t, s, testKey(1))
	const chunks, perChunk, pad = 128, 100, 5000 // ~64 MiB
	appendChunks(t, s, l, 1, chunks, perChunk, pad)
	before := rssFileKiB(t)
	n := 0
	for n < chunks*perChunk {
		for _, c := range nextT(t, l, 4<<20) {
			for _, r := range c.Records {
				if _, id := recID(r); id != n {
					t.Fatalf("record %d is %d", n, id)
				}
				n++
			}
		}
	}
	grew := rssFileKiB(t) - before
	t.Logf("read %d MiB; file-backed RSS grew %d KiB", chunks*perChunk*pad>>20, grew)
	if grew > 16<<10 {
		t.Fatalf("file-backed RSS grew %d KiB while reading %d MiB", grew, chunks*perChunk*pad>>20)
	}
}

// TestOpenDropsPages checks that Open leaves no page of the file in the
// process's RSS: the replay of a WAL with 48 MiB of chunks (as a kill -9
// leaves it) and the load of the lanes touch pages all over the file, and a
// relay started on a backlog should not carry them.
func TestOpenDropsPages(t *testing.T) {
	dir := t.TempDir()
	// Nothing reaches bbolt before the image is taken (no checkpoint may
	// run while it is copied): every chunk is replayed from the WAL.
	s := openTest(t, Config{Dir: dir, NoSync: true, CompactMinFileBytes: -1, hotMaxBytes: 128 << 20, flushAge: time.Hour})
	const lanes, chunks, perChunk, pad = 4, 24, 100, 5000 // ~48 MiB
	for ln := range lanes {
		appendChunks(t, s, mustLane(t, s, testKey(ln)), ln, chunks, perChunk, pad)
	}
	if s.coldLive.Load() != 0 {
		t.Fatal("a checkpoint put chunks into bbolt before the image")
	}
	img := crashImage(t, dir) // every chunk still hot: all of it in the WAL
	s.Close()

	before := rssFileKiB(t)
	s = openTest(t, Config{Dir: img, NoSync: true, CompactMinFileBytes: -1})
	grew := rssFileKiB(t) - before
	t.Logf("opened %d MiB of WAL; file-backed RSS grew %d KiB", lanes*chunks*perChunk*pad>>20, grew)
	if grew > 2<<10 {
		t.Fatalf("file-backed RSS grew %d KiB across Open", grew)
	}
	if got := len(s.Lanes()); got != lanes {
		t.Fatalf("%d lanes after the replay, want %d", got, lanes)
	}
	for _, l := range s.Lanes() {
		if n := len(drainAvailable(t, l)); n != chunks {
			t.Fatalf("lane %v: %d chunks after the replay, want %d", l, n, chunks)
		}
	}
}

// TestCheckpointDeletesDropPages checks that a checkpoint deleting a drained
// backlog's chunks does not map them all at once: each deletion reads its
// chunk's header, which maps the folio around it, and the transaction drops
// the mapping every few megabytes of deletions (see apply).
func TestCheckpointDeletesDropPages(t *testing.T) {
	var peak atomic.Int64
	s := openTest(t, Config{Dir: t.TempDir(), NoSync: true, CompactMinFileBytes: -1,
		flushAge: time.Nanosecond, checkpointEvery: 300 * time.Millisecond,
		beforeTrim: func() { peak.Store(max(peak.Load(), procRssFileKiB())) }})
	l := mustLane(t, s, testKey(1))
	const chunks, perChunk, pad = 128, 100, 5000 // ~64 MiB
	appendChunks(t, s, l, 1, chunks, perChunk, pad)
	waitCheckpointed(t, s) // every chunk in bbolt
	var seqs []uint64
	for n := 0; n < chunks; {
		for _, c := range nextT(t, l, 8<<20) {
			seqs = append(seqs, c.Seq)
			c.Buffer.Release()
			n++
		}
	}
	before := rssFileKiB(t)
	for _, seq := range seqs {
		l.Ack(seq)
	}
	waitCheckpointed(t, s)
	grew := peak.Load() - before
	t.Logf("deleted %d MiB of chunks; file-backed RSS grew %d KiB inside the checkpoint", chunks*perChunk*pad>>20, grew)
	if peak.Load() == 0 {
		t.Fatal("no checkpoint deleted anything")
	}
	if grew > 12<<10 {
		t.Fatalf("file-backed RSS grew %d KiB inside a checkpoint deleting %d MiB", grew, chunks*perChunk*pad>>20)
	}
}
