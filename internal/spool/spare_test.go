package spool

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

// TestSparesReused: when one checkpoint frees as many WAL segments as a
// busy WAL holds, all of them are kept as spares, and the next rotations reuse those files
// instead of creating new ones (a new file's first fdatasyncs also write
// its extents' metadata).
func TestSparesReused(t *testing.T) {
	const seg = 64 << 10
	// Nothing is checkpointed by age or WAL size: the segments are freed
	// by acknowledging their chunks, all at one checkpoint.
	s := openTest(t, Config{Dir: t.TempDir(), NoSync: true, segmentBytes: seg,
		flushAge: time.Hour, walMaxBytes: 1 << 30, idleAfter: time.Hour})
	ctx := context.Background()
	l := mustLane(t, s, testKey(1))
	dir := walPath(s.cfg.Dir)

	// appendSegments appends chunks of ~12 KiB (one write each; a write
	// holds at most a quarter of a segment) until the writer has moved
	// to n segments after the current one.
	id := 0
	appendSegments := func(n int) {
		t.Helper()
		s.mu.Lock()
		end := s.walEnd.seg + uint64(n)
		s.mu.Unlock()
		for i := 0; ; i++ {
			s.mu.Lock()
			at := s.walEnd.seg
			s.mu.Unlock()
			if at >= end {
				return
			}
			if i > 100*n {
				t.Fatalf("appended %d chunks and the WAL is still at segment %d (want %d)", i, at, end)
			}
			var b storage.Batch
			for range 4 {
				b.Add(rec(1, id, 3000))
				id++
			}
			if err := s.Append(ctx, l, &b); err != nil {
				t.Fatal(err)
			}
		}
	}
	// files lists the WAL directory's segments and spares by inode.
	files := func() (segs, spares map[uint64]string) {
		t.Helper()
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		segs, spares = map[uint64]string{}, map[uint64]string{}
		for _, e := range ents {
			fi, err := e.Info()
			if err != nil {
				t.Fatal(err)
			}
			ino := fi.Sys().(*syscall.Stat_t).Ino
			if strings.HasPrefix(e.Name(), sparePrefix) {
				spares[ino] = e.Name()
			} else {
				segs[ino] = e.Name()
			}
		}
		return segs, spares
	}
	ackAll := func() {
		t.Helper()
		for _, c := range drainAvailable(t, l) {
			l.Ack(c.Seq)
		}
		waitCheckpointed(t, s)
	}

	// As many segments as a busy WAL holds at its bound (the checkpoint
	// that the bound forces frees them together), plus the current one.
	const freed = int(defaultWALMaxBytes/defaultSegmentBytes) + 1
	appendSegments(freed)
	ackAll()
	// The writer's current segment stays; the ones before it are spares
	// once the checkpoint that applied the acks has run.
	var segs, spares map[uint64]string
	polltest.Until(t, "the freed segments spares", func() bool { segs, spares = files(); return len(spares) >= freed })
	if len(spares) != freed || len(segs) != 1 {
		t.Fatalf("after freeing %d segments: segments %v, spares %v (want 1 and %d)", freed, segs, spares, freed)
	}

	// The next rotations take the spares: every segment file is one of
	// the files that were there before.
	known := map[uint64]bool{}
	for ino := range segs {
		known[ino] = true
	}
	for ino := range spares {
		known[ino] = true
	}
	appendSegments(freed)
	segs, spares = files()
	for ino, name := range segs {
		if !known[ino] {
			t.Errorf("segment %s is a new file, with %d spares left", name, len(spares))
		}
	}
	if len(spares) != 0 || len(segs) != freed+1 {
		t.Errorf("after %d more segments: segments %v, spares %v", freed, segs, spares)
	}
}
