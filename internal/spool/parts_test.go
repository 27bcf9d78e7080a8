package spool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

// A chunk larger than the reader may hold is read in parts of at
// most maxBytes (one record at least), in order, each in a buffer of its
// own size, whether the chunk is in the WAL's memory or in bbolt, and a
// reopen in the middle of a chunk reads it again from its first record.
func TestNextPart(t *testing.T) {
	for _, cold := range []bool{false, true} {
		t.Run(fmt.Sprintf("cold=%v", cold), func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{Dir: dir, NoSync: true, MinFreeBytes: -1, flushAge: time.Millisecond, checkpointEvery: time.Millisecond}
			if !cold {
				cfg.flushAge, cfg.checkpointEvery = time.Hour, time.Hour
			}
			s := openTest(t, cfg)
			ctx := context.Background()
			l, _ := s.Lane(ctx, storage.LaneKey{APIKey: "k"})
			const n, size = 500, 1000
			var b storage.Batch
			for i := range n {
				b.Add(storage.Record{OrderKey: []byte("d:x"), Data: fmt.Appendf(nil, `{"i":%d,"p":"%0*d"}`, i, size, 0)})
			}
			appendOne(t, s, l, `{"small":1}`)
			if err := s.Append(ctx, l, &b); err != nil {
				t.Fatal(err)
			}
			appendOne(t, s, l, `{"small":2}`)
			if cold {
				polltest.Until(t, "the chunks checkpointed", func() bool { return s.hotHeld.Load() == 0 })
			}
			const maxBytes = 64 << 10
			var recs []storage.Record
			next := 0
			var seqs []uint64
			for parts := 0; next < n+2; parts++ {
				if parts > 100 {
					t.Fatal("too many parts")
				}
				cs, more, err := l.NextPart(ctx, maxBytes, recs)
				recs = more
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range cs {
					if c.Size > maxBytes && len(c.Records) > 1 {
						t.Fatalf("part of %d bytes, %d records, max %d", c.Size, len(c.Records), maxBytes)
					}
					if c.Buffer.Cap > 2*maxBytes {
						t.Fatalf("part buffer of %d bytes: the whole chunk was read", c.Buffer.Cap)
					}
					for i, r := range c.Records {
						var want string
						switch {
						case next == 0:
							want = `{"small":1}`
						case next == n+1:
							want = `{"small":2}`
						default:
							want = fmt.Sprintf(`{"i":%d,"p":"%0*d"}`, next-1, size, 0)
							if c.First+i != next-1 || c.Total != n {
								t.Fatalf("record %d: First %d + %d, Total %d", next, c.First, i, c.Total)
							}
						}
						if string(r.Data) != want {
							t.Fatalf("record %d: %.40q, want %.40q", next, r.Data, want)
						}
						next++
					}
					if c.First+len(c.Records) == max(c.Total, len(c.Records)) {
						seqs = append(seqs, c.Seq)
					}
					c.Buffer.Release()
				}
			}
			if len(seqs) != 3 {
				t.Fatalf("chunks completed: %v", seqs)
			}
			// Ack only the small first one; the big one is read again
			// whole from its first record after a reopen.
			l.Ack(seqs[0])
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s2 := openTest(t, Config{Dir: dir, NoSync: true, MinFreeBytes: -1})
			l2 := s2.Lanes()[0]
			cs, _, err := l2.NextPart(ctx, maxBytes, nil)
			if err != nil {
				t.Fatal(err)
			}
			if cs[0].First != 0 || cs[0].Total != n || string(cs[0].Records[0].Data) != fmt.Sprintf(`{"i":0,"p":"%0*d"}`, size, 0) {
				t.Fatalf("after reopen: first %d total %d %.30q", cs[0].First, cs[0].Total, cs[0].Records[0].Data)
			}
		})
	}
}

// TestNextPartDamagedChunk: a chunk of spool.db that fails its checksum and
// is larger than the reader may hold is never cut into parts: it goes to
// dead letters (reason damaged) whole, and the chunks around it are read
// in parts, in order.
func TestNextPartDamagedChunk(t *testing.T) {
	const chunks, perChunk, pad = 4, 3, 1000
	dir := dbImage(t, chunks, perChunk, pad)
	db := filepath.Join(dir, "spool.db")
	b, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	// Record 7 is the second of chunk 2.
	i := bytes.Index(b, []byte(`{"lane":1,"n":7,`))
	if i < 0 {
		t.Fatal("record 7 not found in spool.db")
	}
	b[i+20] ^= 0x04
	if err := os.WriteFile(db, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s, _, _, err := openObserved(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	l := mustLane(t, s, testKey(1))
	const maxBytes = 1500 // a chunk holds about 3 KB: read in parts
	var ids []int
	var recs []storage.Record
	for parts := 0; len(ids) < (chunks-1)*perChunk; parts++ {
		if parts > 50 {
			t.Fatalf("too many parts; read %v", ids)
		}
		ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
		cs, more, err := l.NextPart(ctx, maxBytes, recs)
		cancel()
		recs = more
		if err != nil {
			t.Fatalf("NextPart: %v (read %v)", err, ids)
		}
		for _, c := range cs {
			if c.Total == len(c.Records) && c.Size > maxBytes {
				t.Fatalf("chunk %d read whole (%d bytes), not in parts", c.Seq, c.Size)
			}
			for _, r := range c.Records {
				_, n := recID(r)
				ids = append(ids, n)
			}
			if c.First+len(c.Records) == c.Total {
				l.Ack(c.Seq)
			}
			c.Buffer.Release()
		}
	}
	if want := idsExcept(chunks*perChunk, 6, 7, 8); !slices.Equal(ids, want) {
		t.Fatalf("records %v, want %v", ids, want)
	}
	dead, err := s.ListDead(context.Background(), storage.DeadFilter{Reason: reasonDamaged}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != perChunk {
		t.Fatalf("%d damaged dead letters, want %d", len(dead), perChunk)
	}
}

// TestWaitWakesOnAppend checks that a reader waiting in Lane.Wait on an
// empty lane is woken by each Append (the lane's notify channel is
// replaced only when a reader waits: Lane.watched), several times over,
// and that appends with no reader waiting leave Wait returning at once.
func TestWaitWakesOnAppend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := openTest(t, Config{})
		l := mustLane(t, s, testKey(1))
		ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
		defer cancel()
		for i := range 5 {
			woke := make(chan error, 1)
			go func() { woke <- l.Wait(ctx, nil) }()
			// The reader is waiting now (every goroutine of the bubble
			// is blocked); Wait must return once the chunk is published.
			synctest.Wait()
			var b storage.Batch
			b.Add(rec(1, i, 10))
			if err := s.Append(ctx, l, &b); err != nil {
				t.Fatal(err)
			}
			if err := <-woke; err != nil {
				t.Fatalf("append %d: Wait: %v", i, err)
			}
			// One read of what is there (a read that finds nothing would
			// itself mark the lane watched, hiding a Wait that does not).
			cs := nextT(t, l, 1<<20)
			if len(cs) != 1 {
				t.Fatalf("append %d: read %d chunks, want 1", i, len(cs))
			}
			for _, c := range cs {
				l.Ack(c.Seq)
			}
		}
		// Published with nobody waiting: Wait sees it without a wake-up.
		var b storage.Batch
		b.Add(rec(1, 9, 10))
		if err := s.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
		if err := l.Wait(ctx, nil); err != nil {
			t.Fatal(err)
		}
	})
}

// TestOnWork: a reader that ended on an idle lane (Wait's onIdle said so:
// storage.ErrIdle) is started again by whenWork at the next Append, at once when the
// lane has records already, and when the lane is retired; an idle lane
// keeps no timer.
func TestOnWork(t *testing.T) {
	defer func(d time.Duration) { recIdleDrop = d }(recIdleDrop)
	recIdleDrop = time.Millisecond
	// Not retired before the test says so, however slow the machine: the
	// lane is pinned before the short idle time is put in force (a lane
	// idle for 50 ms before its Pin was retired once under load).
	s := openTest(t, Config{RetireIdle: -1})
	l := mustLane(t, s, testKey(1))
	l.Pin()
	s.SetLaneLimits(0, 0, 50*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	defer cancel()
	read := func() {
		t.Helper()
		var b storage.Batch
		b.Add(rec(1, 0, 10))
		if err := s.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
		for _, c := range nextT(t, l, 1<<20) {
			l.Ack(c.Seq)
		}
	}
	read() // the reader's cursor after the lane's records
	if err := l.Wait(ctx, func() bool { return true }); !errors.Is(err, storage.ErrIdle) {
		t.Fatalf("Wait: %v, want storage.ErrIdle", err)
	}
	if l.idle != nil {
		t.Error("an idle lane keeps its timer")
	}
	fired := make(chan struct{}, 1)
	onWork := func() { fired <- struct{}{} }
	l.whenWork(onWork)
	select {
	case <-fired:
		t.Fatal("whenWork called on an empty lane")
	case <-time.After(10 * time.Millisecond):
	}
	var b storage.Batch
	b.Add(rec(1, 0, 10))
	if err := s.Append(ctx, l, &b); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fired:
	case <-ctx.Done():
		t.Fatal("whenWork not called after an Append")
	}
	// Records there already: at once.
	l.whenWork(onWork)
	select {
	case <-fired:
	case <-ctx.Done():
		t.Fatal("whenWork not called on a lane with records")
	}
	for _, c := range nextT(t, l, 1<<20) {
		l.Ack(c.Seq)
	}
	// Retired while the reader is gone: called, and the reader sees it.
	l.Unpin()
	l.whenWork(onWork)
	select {
	case <-fired:
	case <-ctx.Done():
		t.Fatal("whenWork not called when the lane retired")
	}
	if err := l.Wait(ctx, nil); !errors.Is(err, storage.ErrRetired) {
		t.Fatalf("Wait after retirement: %v", err)
	}
}

// TestRetiredBeforeFirstRead: a lane retired before its reader first read
// (its cursor is before the lane's next seq, its queue bucket is gone):
// Wait answers storage.ErrRetired, not "something to read" (the reader then failed
// every read on the missing bucket, for ever).
func TestRetiredBeforeFirstRead(t *testing.T) {
	s := openTest(t, Config{RetireIdle: 20 * time.Millisecond})
	l := mustLane(t, s, testKey(1))
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	defer cancel()
	polltest.Until(t, "the lane retired", l.IsRetired)
	if err := l.Wait(ctx, nil); !errors.Is(err, storage.ErrRetired) {
		t.Fatalf("Wait: %v, want storage.ErrRetired", err)
	}
	// An Append through the retired handle goes to the key's new lane; a
	// read of the old handle finds its queue bucket gone: retired, never
	// damage.
	var b storage.Batch
	b.Add(rec(1, 0, 10))
	if err := s.Append(ctx, l, &b); err != nil {
		t.Fatal(err)
	}
	if _, err := readWhole(ctx, l, 1<<20); !errors.Is(err, storage.ErrRetired) || errors.Is(err, errCorrupt) {
		t.Fatalf("Next: %v, want ErrRetired", err)
	}
}
