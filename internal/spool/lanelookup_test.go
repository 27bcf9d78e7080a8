package spool

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

// Local finds a request's lane from its bytes: a live lane without an
// allocation; a lane the spool retired is replaced by a new live one of its
// key; one api_key makes at most Config.MaxLanesPerKey lanes, its
// options variants included (the next is refused with
// ErrTooManyKeyLanes, which is a ErrTooManyLanes).
func TestLaneLookup(t *testing.T) {
	sp, err := Open(Config{Dir: t.TempDir(), NoSync: true, MinFreeBytes: -1, RetireIdle: 20 * time.Millisecond, MaxLanesPerKey: 4}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	l := NewBackend(sp)
	ctx := context.Background()
	req := func(opts string) *storage.Request {
		var b storage.Batch
		b.Add(storage.Record{OrderKey: []byte("d:a"), Data: []byte("{}")})
		return &storage.Request{Kind: storage.KindEvents, APIKey: []byte("key-1"), Options: []byte(opts), Batch: &b}
	}

	r := req(`{"min_id_length":1}`)
	if err := l.Append(ctx, *r); err != nil {
		t.Fatal(err)
	}
	first := findLane(&sp.byKey, r.Kind, r.APIKey, r.Options)
	if first == nil || first.Key() != r.Lane() {
		t.Fatalf("lane %v: want %+v", first, r.Lane())
	}
	if n := testing.AllocsPerRun(100, func() {
		if got := findLane(&sp.byKey, r.Kind, r.APIKey, r.Options); got != first {
			t.Fatalf("lane %p, want %p", got, first)
		}
	}); n != 0 {
		t.Errorf("finding a live lane costs %v allocations, want 0", n)
	}

	// Retired (read, acknowledged, idle): the next Append makes a live
	// lane of the key.
	tctx, cancel := context.WithTimeout(ctx, polltest.Max)
	defer cancel()
	cs, err := readWhole(tctx, first, 1<<20)
	if err != nil || len(cs) != 1 {
		t.Fatalf("read: %v, %d chunks", err, len(cs))
	}
	first.Ack(cs[0].Seq)
	if _, err := readWhole(tctx, first, 1<<20); !errors.Is(err, storage.ErrRetired) {
		t.Fatalf("lane not retired: %v", err)
	}
	if err := l.Append(ctx, *req(`{"min_id_length":1}`)); err != nil {
		t.Fatal(err)
	}
	live := findLane(&sp.byKey, r.Kind, r.APIKey, r.Options)
	if live == nil || live == first || live.IsRetired() || live.Key() != r.Lane() {
		t.Fatalf("lane %p (retired %p)", live, first)
	}
	if got := live.Stats().Records; got != 1 {
		t.Fatalf("live lane holds %d records, want 1", got)
	}

	// One api_key, many options: 4 lanes at most (the live one and 3
	// variants); another api_key is not limited by them.
	for i := range 4 {
		err := l.Append(ctx, *req(`{"o":` + strconv.Itoa(i) + `}`))
		switch {
		case i < 3 && err != nil:
			t.Fatalf("variant %d: %v", i, err)
		case i == 3 && (!errors.Is(err, ErrTooManyKeyLanes) || !errors.Is(err, ErrTooManyLanes)):
			t.Fatalf("variant %d: %v, want ErrTooManyKeyLanes", i, err)
		}
	}
	other := req("")
	other.APIKey = []byte("key-2")
	if err := l.Append(ctx, *other); err != nil {
		t.Fatalf("another api_key: %v", err)
	}
	if n := sp.Stats().Lanes; n != 5 {
		t.Errorf("%d lanes in the spool, want 5", n)
	}
}
