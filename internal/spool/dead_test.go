package spool

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/storage"
)

func TestDeadLetters(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s, err := Open(Config{Dir: dir, NoSync: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	k1, k2 := testKey(1), storage.LaneKey{Kind: storage.KindUserMap, APIKey: "k2", Options: `{"x":1}`}
	died := time.UnixMilli(1_700_000_000_123)
	var dls []storage.DeadLetter
	for i := range 10 {
		k, reason := k1, "invalid_fields"
		if i%2 == 1 {
			k = k2
		}
		if i%3 == 0 {
			reason = "too_large"
		}
		dls = append(dls, storage.DeadLetter{
			Lane: k, Reason: reason, Answer: []byte(`{"code":400}`),
			Accepted: died.Add(-time.Minute), Died: died,
			Record: rec(0, i, 5),
		})
	}
	if err := s.PutDead(ctx, dls[:4]); err != nil {
		t.Fatal(err)
	}
	if err := s.PutDead(ctx, dls[4:]); err != nil {
		t.Fatal(err)
	}
	for i, d := range dls {
		if d.ID != uint64(i+1) {
			t.Fatalf("dead letter %d got id %d", i, d.ID)
		}
	}
	if s.Stats().Dead != 10 {
		t.Fatalf("Stats().Dead = %d", s.Stats().Dead)
	}
	check := func(s *Spool, f storage.DeadFilter, after uint64, limit int, want ...int) {
		t.Helper()
		got, err := s.ListDead(context.Background(), f, after, limit)
		if err != nil {
			t.Fatal(err)
		}
		var ids []int
		for _, d := range got {
			ids = append(ids, int(d.ID))
			w := dls[d.ID-1]
			if d.Lane != w.Lane || d.Reason != w.Reason || string(d.Answer) != string(w.Answer) ||
				!d.Died.Equal(w.Died) || !d.Accepted.Equal(w.Accepted) || string(d.Record.Data) != string(w.Record.Data) ||
				string(d.Record.OrderKey) != string(w.Record.OrderKey) || string(d.Record.UserID) != string(w.Record.UserID) {
				t.Fatalf("dead letter %d: %+v want %+v", d.ID, d, w)
			}
		}
		if fmt.Sprint(ids) != fmt.Sprint(want) && !(len(ids) == 0 && len(want) == 0) {
			t.Fatalf("ListDead(%+v, %d, %d) = %v, want %v", f, after, limit, ids, want)
		}
	}
	check(s, storage.DeadFilter{}, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	check(s, storage.DeadFilter{}, 0, 3, 1, 2, 3)
	check(s, storage.DeadFilter{}, 3, 3, 4, 5, 6)
	check(s, storage.DeadFilter{Lane: &k2}, 0, 0, 2, 4, 6, 8, 10)
	check(s, storage.DeadFilter{Lane: &k2}, 4, 2, 6, 8)
	check(s, storage.DeadFilter{Reason: "too_large"}, 0, 0, 1, 4, 7, 10)
	check(s, storage.DeadFilter{Lane: &k1, Reason: "too_large"}, 0, 0, 1, 7)
	check(s, storage.DeadFilter{Reason: "nope"}, 0, 0)
	check(s, storage.DeadFilter{}, 10, 0)
	if err := s.DeleteDead(ctx, []uint64{2, 4, 99}); err != nil {
		t.Fatal(err)
	}
	check(s, storage.DeadFilter{Lane: &k2}, 0, 0, 6, 8, 10)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openTest(t, Config{Dir: dir, NoSync: true})
	if s.Stats().Dead != 8 {
		t.Fatalf("after reopen Stats().Dead = %d", s.Stats().Dead)
	}
	check(s, storage.DeadFilter{}, 0, 0, 1, 3, 5, 6, 7, 8, 9, 10)
	more := []storage.DeadLetter{{Lane: k1, Reason: "x"}}
	if err := s.PutDead(ctx, more); err != nil {
		t.Fatal(err)
	}
	if more[0].ID != 11 {
		t.Fatalf("id after reopen %d, want 11 (ids are never reused)", more[0].ID)
	}
}

// A count read after a list never says fewer dead letters than the list
// holds, while other dead letters are being committed (the admin API's
// total beside its page).
func TestDeadCountCoversList(t *testing.T) {
	s, err := Open(Config{Dir: t.TempDir(), NoSync: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 300 {
			d := storage.DeadLetter{Lane: testKey(1), Reason: "silenced", Accepted: time.Now(), Died: time.Now(), Record: rec(0, i, 5)}
			if err := s.PutDead(ctx, []storage.DeadLetter{d}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for {
		select {
		case <-done:
			return
		default:
		}
		l, err := s.ListDead(context.Background(), storage.DeadFilter{}, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		n, err := NewBackend(s).DeadCount(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n < int64(len(l)) {
			t.Fatalf("count %d after a list of %d", n, len(l))
		}
	}
}
