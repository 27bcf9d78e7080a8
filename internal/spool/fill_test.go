package spool

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestFill fills a small quota from concurrent appenders until every one is
// refused, proves the refused appends wrote nothing, then drains and proves
// appends are accepted again.
func TestFill(t *testing.T) {
	const quota = 64 << 10
	s := openTest(t, Config{Sync: SyncNone, MaxBytes: quota})
	ctx := context.Background()
	l := mustLane(t, s, testKey(1))
	var (
		mu       sync.Mutex
		accepted = map[int]bool{}
		refused  = map[int]bool{}
		wg       sync.WaitGroup
	)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b Batch
			for n := range 1000 { // bounded; the quota stops it far earlier
				id := w*1000 + n
				b.Reset()
				b.Add(rec(1, id, 400))
				b.Add(rec(1, id, 400))
				err := s.Append(ctx, l, &b)
				mu.Lock()
				if err == nil {
					accepted[id] = true
				} else {
					refused[id] = true
				}
				mu.Unlock()
				if errors.Is(err, ErrFull) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(refused) != 16 {
		t.Fatalf("%d appenders refused, want 16", len(refused))
	}
	st := l.Stats()
	if st.Bytes > quota || st.Bytes < quota-2*b2(t) || st.Records != int64(2*len(accepted)) || st.Chunks != int64(len(accepted)) {
		t.Fatalf("stats %+v with %d accepted appends", st, len(accepted))
	}
	// Exactly the accepted records are stored, once each.
	seen := map[int]int{}
	for _, c := range drainAvailable(t, l) {
		for _, r := range c.Records {
			_, id := recID(r)
			seen[id]++
		}
		s.Ack(l, c.Seq)
	}
	if len(seen) != len(accepted) {
		t.Fatalf("stored %d appends, %d accepted", len(seen), len(accepted))
	}
	for id, n := range seen {
		if !accepted[id] || n != 2 {
			t.Fatalf("record %d stored %d times, accepted=%v refused=%v", id, n, accepted[id], refused[id])
		}
	}
	// Drained: accepted again.
	deadline := time.Now().Add(5 * time.Second)
	for s.Stats().LiveBytes != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	var b Batch
	b.Add(rec(1, 99999, 400))
	if err := s.Append(ctx, l, &b); err != nil {
		t.Fatalf("append after drain: %v", err)
	}
}

// b2 is the encoded size of one test append of TestFill.
func b2(t testing.TB) int64 {
	var b Batch
	b.Add(rec(1, 1000, 400))
	b.Add(rec(1, 1000, 400))
	return int64(b.Bytes())
}

// TestDiskLow: a reserve larger than the filesystem's free space refuses
// appends, writes nothing, and still lets lanes, dead letters and acks work.
func TestDiskLow(t *testing.T) {
	s := openTest(t, Config{Sync: SyncNone, MinFreeBytes: 1 << 62})
	ctx := context.Background()
	l := mustLane(t, s, testKey(1))
	var b Batch
	b.Add(rec(1, 1, 10))
	if err := s.Append(ctx, l, &b); !errors.Is(err, ErrDiskLow) {
		t.Fatalf("Append: %v, want ErrDiskLow", err)
	}
	if st := l.Stats(); st.Chunks != 0 || s.Stats().LiveBytes != 0 {
		t.Fatalf("refused append left %+v", st)
	}
	if err := s.PutDead(ctx, []DeadLetter{{Lane: l.Key(), Reason: "x"}}); err != nil {
		t.Fatalf("PutDead with low disk: %v", err)
	}
	ctx2, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if cs, err := l.Next(ctx2, 100); err == nil {
		t.Fatalf("refused append is readable: %+v", cs)
	}
}

// TestDiskReserveOK: the default reserve (256 MiB) lets appends through on a
// filesystem with room, and a disabled check (negative) too.
func TestDiskReserveOK(t *testing.T) {
	for _, min := range []int64{0, -1} {
		s := openTest(t, Config{Sync: SyncNone, MinFreeBytes: min})
		l := mustLane(t, s, testKey(1))
		var b Batch
		b.Add(rec(1, 1, 10))
		if err := s.Append(context.Background(), l, &b); err != nil {
			t.Fatalf("MinFreeBytes %d: %v", min, err)
		}
	}
}

// TestCommitFailure makes commits fail the way a full filesystem does (the
// file cannot grow) and checks that a failed commit fails all of its
// Appends, writes nothing of them, and that the spool works again once acks
// free pages.
func TestCommitFailure(t *testing.T) {
	s := openTest(t, Config{Sync: SyncNone, maxFileBytes: 24 << 20, CompactMinFileBytes: -1})
	ctx := context.Background()
	l := mustLane(t, s, testKey(1))
	big := func(id int) *Batch {
		var b Batch
		for r := range 4 {
			b.Add(rec(1, id, 256<<10+r)) // ~1 MB per chunk
		}
		return &b
	}
	var ok []int
	var failErr error
	for id := range 100 {
		if err := s.Append(ctx, l, big(id)); err != nil {
			failErr = err
			break
		}
		ok = append(ok, id)
	}
	if failErr == nil || errors.Is(failErr, ErrFull) || errors.Is(failErr, ErrDiskLow) {
		t.Fatalf("after %d appends: %v, want a commit error", len(ok), failErr)
	}
	t.Logf("%d appends committed, then: %v", len(ok), failErr)
	// Concurrent appends sharing failing commits all fail.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Append(ctx, l, big(1000+i))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err == nil {
			t.Fatalf("append %d succeeded past the file limit", i)
		}
	}
	if st := l.Stats(); st.Chunks != int64(len(ok)) {
		t.Fatalf("stats %+v after %d good appends", st, len(ok))
	}
	cs := drainAvailable(t, l)
	if len(cs) != len(ok) {
		t.Fatalf("read %d chunks, %d committed", len(cs), len(ok))
	}
	for i, c := range cs {
		if _, id := recID(c.Records[0]); id != ok[i] {
			t.Fatalf("chunk %d holds append %d", i, id)
		}
		s.Ack(l, c.Seq)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.Stats().LiveBytes != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	// Freed pages are reused: appends work again.
	for id := range 3 {
		if err := s.Append(ctx, l, big(2000+id)); err != nil {
			t.Fatalf("append after drain: %v", err)
		}
	}
	if cs := drainAvailable(t, l); len(cs) != 3 {
		t.Fatalf("after recovery read %d chunks", len(cs))
	}
}
