package spool

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

// noFreelist is bbolt's meta value for "freelist not written".
const noFreelist = ^uint64(0)

// metaFreelist reads the freelist page id from the newer of the file's two
// meta pages (bbolt's on-disk layout: a 16-byte page header, then magic,
// version, page size, flags, root bucket (16), freelist, high water mark,
// txid).
func metaFreelist(t *testing.T, path string) uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ps := int(binary.LittleEndian.Uint32(b[16+8:]))
	var best, txid uint64
	for _, off := range []int{0, ps} {
		m := b[off+16:]
		if tx := binary.LittleEndian.Uint64(m[48:]); tx >= txid {
			txid, best = tx, binary.LittleEndian.Uint64(m[32:])
		}
	}
	return best
}

// crashImage copies the spool's files as they are on disk now, as a kill -9
// would leave them, into a new directory.
func crashImage(t *testing.T, dir string) string {
	t.Helper()
	img := t.TempDir()
	copyDir(t, dir, img)
	return img
}

// TestFreelistWritten checks when the freelist is on disk: after commits
// while it is small (so that Open after a crash reads it instead of
// scanning the file); while it is large next to the commits, once the spool
// is idle for idleFreelistDelay; and always after Close. Every such file,
// and one taken at once after the last commit, reopens with its data intact.
func TestFreelistWritten(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		chunks    int
		pad       int
		wantSaved bool // freelist on disk at once after the last commit
	}{
		{"small freelist", 200, 1000, true},
		{"large freelist", 1200, 9000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			// Chunks go to bbolt at the next checkpoint, as a backlog's do.
			s, err := Open(Config{Dir: dir, CompactMinFileBytes: -1, flushAge: time.Nanosecond, checkpointEvery: time.Millisecond}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			l := mustLane(t, s, testKey(1))
			var b storage.Batch
			for i := range tc.chunks {
				b.Reset()
				b.Add(rec(1, i, tc.pad))
				if err := s.Append(ctx, l, &b); err != nil {
					t.Fatal(err)
				}
			}
			cs := drainAvailable(t, l)
			if len(cs) != tc.chunks {
				t.Fatalf("read %d chunks, want %d", len(cs), tc.chunks)
			}
			for _, c := range cs[:tc.chunks-10] {
				l.Ack(c.Seq)
			}
			// Two more appends: the checkpoint that carries the acks may
			// put the first, the second is put by a later one, which
			// writes the freelist as it stands after the deletions.
			for i := range 2 {
				b.Reset()
				b.Add(rec(1, tc.chunks+i, 10))
				if err := s.Append(ctx, l, &b); err != nil {
					t.Fatal(err)
				}
				waitCheckpointed(t, s)
			}
			img := crashImage(t, dir) // at once: the idle commit may not have run
			if saved := metaFreelist(t, filepath.Join(img, "spool.db")) != noFreelist; tc.wantSaved && !saved {
				t.Fatal("no freelist on disk after a commit that should have written it")
			}
			polltest.Until(t, "the freelist on disk once idle", func() bool {
				return metaFreelist(t, filepath.Join(dir, "spool.db")) != noFreelist
			})
			idle := crashImage(t, dir)
			if metaFreelist(t, filepath.Join(idle, "spool.db")) == noFreelist {
				t.Fatal("no freelist on disk after the spool was idle")
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if metaFreelist(t, filepath.Join(dir, "spool.db")) == noFreelist {
				t.Fatal("no freelist on disk after Close")
			}
			for _, d := range []string{img, idle, dir} {
				s := openTest(t, Config{Dir: d, CompactMinFileBytes: -1, flushAge: time.Nanosecond, checkpointEvery: time.Millisecond})
				l := s.Lanes()[0]
				cs := drainAvailable(t, l)
				if len(cs) != 12 {
					t.Fatalf("%s: %d chunks after reopen, want 12", d, len(cs))
				}
				for i, c := range cs {
					if _, n := recID(c.Records[0]); n != tc.chunks-10+i {
						t.Fatalf("%s: chunk %d holds record %d", d, i, n)
					}
				}
				// The reopened file keeps working: append, ack all, close.
				b.Reset()
				b.Add(rec(1, 99999, tc.pad))
				if err := s.Append(ctx, l, &b); err != nil {
					t.Fatal(err)
				}
				for _, c := range cs {
					l.Ack(c.Seq)
				}
			}
		})
	}
}

// waitCheckpointed waits until every chunk appended so far is in bbolt and
// every ack is applied (nothing held in memory, nothing queued).
func waitCheckpointed(t testing.TB, s *Spool) {
	t.Helper()
	polltest.Until(t, "every chunk and ack checkpointed", s.checkpointed)
}
