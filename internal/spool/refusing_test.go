package spool

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/svcrelay/relay/internal/diskfulltest"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

// TestRefusingWhileCheckpointsFail: while checkpoints fail (the disk is
// full with the reserve disabled, or bbolt's size limit standing in for it)
// appends go on into the WAL until the memory bound, then are refused with
// ErrFull; from then on Refusing says so, naming the checkpoint's error, and
// it says nothing before. It clears by itself: once delivery frees memory
// and pages (size limit), or once space returns (a real full filesystem: a
// small tmpfs mounted by the test; skipped where mounting is not allowed).
func TestRefusingWhileCheckpointsFail(t *testing.T) {
	cfg := func(dir string) Config {
		return Config{Dir: dir, NoSync: true, MinFreeBytes: -1, CompactMinFileBytes: -1,
			hotMaxBytes: 2 << 20, flushAge: time.Nanosecond, checkpointEvery: time.Millisecond}
	}
	t.Run("size limit", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := cfg(t.TempDir())
			c.maxFileBytes = 1 << 20
			s := openTest(t, c)
			l := mustLane(t, s, testKey(1))
			checkRefusing(t, s, l, "maximum size", func() {
				// Delivery: every chunk read and acknowledged frees the
				// memory of the hot ones and, at the next checkpoint, the
				// pages of the others.
				for _, c := range drainAvailable(t, l) {
					l.Ack(c.Seq)
				}
			})
		})
	})
	t.Run("tmpfs", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			mnt := diskfulltest.Tmpfs(t, "48m", "the size-limit variant covers the logic")
			s := openTest(t, cfg(filepath.Join(mnt, "spool")))
			l := mustLane(t, s, testKey(1))
			// The first append allocates the WAL segment (16 MiB, enough for
			// what follows); then the filesystem is filled.
			appendChunks(t, s, l, 1, 1, 1, 100)
			waitCheckpointed(t, s)
			filler := filepath.Join(mnt, "filler")
			diskfulltest.Fill(t, filler)
			checkRefusing(t, s, l, syscall.ENOSPC.Error(), func() {
				if err := os.Remove(filler); err != nil {
					t.Fatal(err)
				}
			})
			if s.ckptFailing() {
				t.Fatal("Refusing cleared, but checkpoints still fail")
			}
		})
	})
}

// checkRefusing appends chunks of 200 KB (under Refusing's margin) to l
// until the spool refuses one, checking before each that Refusing is right:
// while it is nil the chunk is taken, and once it speaks the refusal comes
// within the margin; the refusal comes from failing checkpoints whose error
// contains cause. Then it checks that Refusing stays, and that once free
// makes room it clears and appends are taken again.
func checkRefusing(t *testing.T, s *Spool, l *Lane, cause string, free func()) {
	t.Helper()
	ctx := context.Background()
	var b storage.Batch
	var err error
	const pad = 200 << 10
	taken, takenRefusing := 0, 0
	for id := 1000; id < 1200 && err == nil; id++ { // the bound (4 MiB) stops it after ~25
		// Until the store has tried the chunks: then nothing changes the
		// answer but the next append.
		polltest.Until(t, "the chunks tried", func() bool { return s.checkpointed() || s.ckptFailing() })
		r := s.refusing()
		b.Reset()
		b.Add(rec(1, id, pad))
		err = s.Append(ctx, l, &b)
		switch {
		case r == nil && err != nil:
			t.Fatalf("append %d refused (%v) while Refusing said nil", taken+1, err)
		case err == nil && r != nil:
			takenRefusing++
			if takenRefusing*pad > refuseMargin {
				t.Fatalf("%d appends of %d bytes taken after Refusing said %q", takenRefusing, pad, r)
			}
		}
		if err == nil {
			taken++
		}
	}
	if !errors.Is(err, ErrFull) || !s.ckptFailing() {
		t.Fatalf("after %d appends: %v (checkpoints failing: %v), want ErrFull from failing checkpoints", taken, err, s.ckptFailing())
	}
	t.Logf("%d appends taken (%d after Refusing spoke), then %v", taken, takenRefusing, err)
	for range 3 { // ~50 checkpoint intervals: it does not clear by itself
		r := s.refusing()
		if r == nil || !strings.Contains(r.Error(), "checkpoints fail") || !strings.Contains(r.Error(), cause) {
			t.Fatalf("Refusing %v while appends are refused: want the failing checkpoints, naming %q", r, cause)
		}
		time.Sleep(20 * time.Millisecond) // fake time: 20 checkpoint intervals
	}
	free()
	polltest.Until(t, "Refusing clear once space returned", func() bool { return s.refusing() == nil })
	b.Reset()
	b.Add(rec(1, 5000, pad))
	if err := s.Append(ctx, l, &b); err != nil {
		t.Fatalf("append once Refusing cleared: %v", err)
	}
}

// TestRefusingWhileWALCannotGrow: a disk that fills up in the middle of a
// WAL segment (the usual case: checkpoints keep the memory of chunks low)
// refuses appends when the next segment cannot be made, long before the
// memory bound; Refusing then says so, stays while the space is missing,
// and clears as soon as a segment's worth is free, without an append. On a
// real full filesystem (a small tmpfs mounted by the test; skipped where
// mounting is not allowed).
func TestRefusingWhileWALCannotGrow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mnt := diskfulltest.Tmpfs(t, "48m", "")
		s := openTest(t, Config{Dir: filepath.Join(mnt, "spool"), NoSync: true, MinFreeBytes: -1, CompactMinFileBytes: -1,
			segmentBytes: 1 << 20, flushAge: time.Nanosecond, checkpointEvery: time.Millisecond})
		l := mustLane(t, s, testKey(1))
		appendChunks(t, s, l, 1, 1, 1, 100)
		waitCheckpointed(t, s)
		filler := filepath.Join(mnt, "filler")
		diskfulltest.Fill(t, filler)
		ctx := context.Background()
		var b storage.Batch
		var err error
		taken := 0
		for id := 1000; id < 1100 && err == nil; id++ { // a 1 MiB segment stops it after ~5
			b.Reset()
			b.Add(rec(1, id, 200<<10))
			if err = s.Append(ctx, l, &b); err == nil {
				taken++
			}
		}
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("after %d appends on a full disk: %v, want no space for a new segment", taken, err)
		}
		t.Logf("%d appends taken, then %v", taken, err)
		for range 3 { // it does not clear by itself
			if r := s.refusing(); r == nil || !strings.Contains(r.Error(), "write-ahead log segment") {
				t.Fatalf("Refusing %v while no WAL segment can be made: want it to say so", r)
			}
			time.Sleep(20 * time.Millisecond) // fake time: 20 checkpoint intervals
		}
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		if r := s.refusing(); r != nil {
			t.Fatalf("Refusing %q once space returned", r)
		}
		b.Reset()
		b.Add(rec(1, 5000, 200<<10))
		if err := s.Append(ctx, l, &b); err != nil {
			t.Fatalf("append once space returned: %v", err)
		}
		if s.walNoSpace.Load() {
			t.Fatal("a new segment was made, but walNoSpace is still set")
		}
	})
}
