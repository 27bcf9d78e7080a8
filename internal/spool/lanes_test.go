package spool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

func appendOne(t *testing.T, s *Spool, l *Lane, data string) {
	t.Helper()
	var b storage.Batch
	b.Add(storage.Record{OrderKey: []byte("d:x"), Data: []byte(data)})
	if err := s.Append(context.Background(), l, &b); err != nil {
		t.Fatal(err)
	}
}

func drainLane(t *testing.T, s *Spool, l *Lane) int {
	t.Helper()
	n := 0
	for l.Stats().Records > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
		cs, err := readWhole(ctx, l, 1<<20)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			n += len(c.Records)
			l.Ack(c.Seq)
		}
	}
	return n
}

// MaxLanes bounds the lanes; a key of an existing lane is still
// served; a retired lane frees its place.
func TestMaxLanes(t *testing.T) {
	s := openTest(t, Config{NoSync: true, MinFreeBytes: -1, MaxLanes: 3, RetireIdle: -1})
	ctx := context.Background()
	var ls []*Lane
	for i := range 3 {
		l, err := s.Lane(ctx, storage.LaneKey{APIKey: fmt.Sprint("k", i)})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	if _, err := s.Lane(ctx, storage.LaneKey{APIKey: "k3"}); !errors.Is(err, ErrTooManyLanes) {
		t.Fatalf("4th lane: %v, want ErrTooManyLanes", err)
	}
	if _, err := s.Lane(ctx, storage.LaneKey{APIKey: "k0", Options: `{"x":1}`}); !errors.Is(err, ErrTooManyLanes) {
		t.Fatalf("4th lane (options): %v, want ErrTooManyLanes", err)
	}
	if l, err := s.Lane(ctx, storage.LaneKey{APIKey: "k1"}); err != nil || l != ls[1] {
		t.Fatalf("existing lane: %v %v", l, err)
	}
	// Concurrent creations never pass the bound.
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() { _, _ = s.Lane(ctx, storage.LaneKey{APIKey: fmt.Sprint("c", i)}) })
	}
	wg.Wait()
	if n := s.Stats().Lanes; n != 3 {
		t.Fatalf("%d lanes, bound 3", n)
	}
}

// An empty lane idle for RetireIdle is retired: gone from Lanes,
// its reader gets storage.ErrRetired, the file forgets it (a reopen does not load
// it), and an Append through the old handle goes to a new lane of the same
// key. A lane that holds records is never retired.
func TestRetireIdleLanes(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, NoSync: true, MinFreeBytes: -1, RetireIdle: 50 * time.Millisecond}
	s, err := Open(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	idle, _ := s.Lane(ctx, storage.LaneKey{APIKey: "idle"})
	full, _ := s.Lane(ctx, storage.LaneKey{APIKey: "full"})
	appendOne(t, s, idle, `{"a":1}`)
	appendOne(t, s, full, `{"b":1}`)
	if n := drainLane(t, s, idle); n != 1 {
		t.Fatalf("read %d records", n)
	}
	readErr := make(chan error, 1)
	go func() {
		_, err := readWhole(ctx, idle, 1<<20)
		readErr <- err
	}()
	select {
	case err := <-readErr:
		if !errors.Is(err, storage.ErrRetired) {
			t.Fatalf("reader of the retired lane: %v, want storage.ErrRetired", err)
		}
	case <-time.After(polltest.Max):
		t.Fatal("the idle empty lane was not retired")
	}
	if !idle.IsRetired() || full.IsRetired() {
		t.Fatalf("retired: idle %v full %v", idle.IsRetired(), full.IsRetired())
	}
	for _, l := range s.Lanes() {
		if l == idle {
			t.Fatal("a retired lane is still listed")
		}
	}
	// Append through the retired handle: a new lane of the same key.
	appendOne(t, s, idle, `{"a":2}`)
	again, err := s.Lane(ctx, storage.LaneKey{APIKey: "idle"})
	if err != nil || again == idle || again.Stats().Records != 1 {
		t.Fatalf("lane after retirement: %v %v", again, err)
	}
	if n := drainLane(t, s, again); n != 1 {
		t.Fatalf("read %d records from the new lane", n)
	}
	// Wait until it is retired too, then reopen: neither comes back; the
	// lane with a record does.
	select {
	case <-again.retiredC:
	case <-time.After(polltest.Max):
		t.Fatal("the new lane was not retired")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openTest(t, Config{Dir: dir, NoSync: true, MinFreeBytes: -1, RetireIdle: -1})
	ls := s2.Lanes()
	if len(ls) != 1 || ls[0].Key().APIKey != "full" || ls[0].Stats().Records != 1 {
		t.Fatalf("after reopen: %d lanes", len(ls))
	}
}

// An Append through a handle of a retired lane is never lost: it
// lands in a live lane of its key.
func TestAppendToRetiredLane(t *testing.T) {
	s := openTest(t, Config{NoSync: true, MinFreeBytes: -1, RetireIdle: time.Millisecond})
	ctx := context.Background()
	old, _ := s.Lane(ctx, storage.LaneKey{APIKey: "k"})
	got := 0
	for i := range 20 {
		appendOne(t, s, old, fmt.Sprintf(`{"i":%d}`, i))
		cur, err := s.Lane(ctx, storage.LaneKey{APIKey: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && cur == old {
			t.Fatal("appended to a retired lane")
		}
		got += drainLane(t, s, cur)
		select {
		case <-cur.retiredC:
		case <-time.After(polltest.Max):
			t.Fatal("lane not retired")
		}
		old = cur
	}
	if got != 20 {
		t.Fatalf("read %d of 20 records", got)
	}
}

// An empty idle lane with an Append in progress (not yet written) is not
// retired under it: the Append lands in the lane, and is read from it.
func TestAppendInProgressHoldsRetirement(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var held atomic.Bool
		entered, gate := make(chan struct{}), make(chan struct{})
		s := openTest(t, Config{NoSync: true, MinFreeBytes: -1, RetireIdle: time.Millisecond, walFault: func(bool) error {
			if held.CompareAndSwap(true, false) {
				close(entered)
				<-gate // the WAL writer waits: the Append stays in progress
			}
			return nil
		}})
		l, _ := s.Lane(context.Background(), storage.LaneKey{APIKey: "k"})
		held.Store(true)
		done := make(chan struct{})
		go func() {
			defer close(done)
			appendOne(t, s, l, `{"a":1}`)
		}()
		<-entered
		time.Sleep(100 * time.Millisecond) // past RetireIdle, several retirement rounds
		synctest.Wait()                    // the last round ended
		retired := l.IsRetired()
		close(gate)
		<-done
		if retired {
			t.Fatal("a lane was retired while an Append to it was in progress")
		}
		if n := drainLane(t, s, l); n != 1 {
			t.Fatalf("read %d records from the lane, want 1", n)
		}
	})
}

// A pinned lane (an operator stopped it) is not retired while
// empty; once unpinned it is.
func TestPinnedLaneNotRetired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := openTest(t, Config{NoSync: true, MinFreeBytes: -1, RetireIdle: time.Millisecond})
		l, _ := s.Lane(context.Background(), storage.LaneKey{APIKey: "k"})
		l.Pin()
		time.Sleep(100 * time.Millisecond) // fake time: a hundred RetireIdle rounds
		synctest.Wait()
		if l.IsRetired() || s.Stats().Lanes != 1 {
			t.Fatal("a pinned lane was retired")
		}
		l.Unpin()
		select {
		case <-l.retiredC:
		case <-time.After(polltest.Max):
			t.Fatal("an unpinned empty lane was not retired")
		}
	})
}

// TestLaneIndexShrinks: once most of the lanes of a wave left the index, it
// holds them in a map of the remaining size (a Go map keeps the room of its
// largest size), and still finds the rest.
func TestLaneIndexShrinks(t *testing.T) {
	var x laneIndex
	var ls []*Lane
	for i := range 4000 {
		l := &Lane{key: storage.LaneKey{Kind: storage.KindEvents, APIKey: fmt.Sprintf("k%d", i)}}
		ls = append(ls, l)
		x.add(l)
	}
	for _, l := range ls[:3500] {
		x.remove(l)
	}
	if x.peak >= 1000 || len(x.m) != 500 {
		t.Fatalf("after 3500 of 4000 removed: %d entries, peak %d: the map was not made again", len(x.m), x.peak)
	}
	for _, l := range ls[3500:] {
		if x.get(l.key) != l || findLane(&x, storage.KindEvents, []byte(l.key.APIKey), nil) != l {
			t.Fatalf("lane %s lost", l.key.APIKey)
		}
	}
	if x.get(ls[0].key) != nil {
		t.Fatal("a removed lane is found")
	}
}
