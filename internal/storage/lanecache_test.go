package storage

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/spool"
)

// Local's lane cache: a request names its lane with bytes, and finding a
// lane appended to before allocates nothing; a lane the spool retired is
// replaced by the live one of its key; one api_key holds at most
// maxLanesPerKey entries (the rest are looked up in the spool each time,
// and still appended to).
func TestLaneCache(t *testing.T) {
	sp, err := spool.Open(spool.Config{Dir: t.TempDir(), NoSync: true, MinFreeBytes: -1, RetireIdle: 20 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	l := NewLocal(sp, nil)
	ctx := context.Background()
	req := func(opts string) *Request {
		var b spool.Batch
		b.Add(spool.Record{OrderKey: []byte("d:a"), Data: []byte("{}")})
		return &Request{Kind: spool.KindEvents, APIKey: []byte("key-1"), Options: []byte(opts), Batch: &b}
	}

	r := req(`{"min_id_length":1}`)
	if err := l.Append(ctx, *r); err != nil {
		t.Fatal(err)
	}
	first, err := l.lane(ctx, r)
	if err != nil || first.Key() != r.Lane() {
		t.Fatalf("lane %v, %v: want %+v", first, err, r.Lane())
	}
	if n := testing.AllocsPerRun(100, func() {
		if got, err := l.lane(ctx, r); got != first || err != nil {
			t.Fatalf("cached lane %p %v, want %p", got, err, first)
		}
	}); n != 0 {
		t.Errorf("a cached lane costs %v allocations, want 0", n)
	}

	// Retired (read, acknowledged, idle): the next Append takes the live
	// lane of the key, and the cache holds that one.
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cs, err := first.Next(tctx, 1<<20)
	if err != nil || len(cs) != 1 {
		t.Fatalf("read: %v, %d chunks", err, len(cs))
	}
	sp.Ack(first, cs[0].Seq)
	if _, err := first.Next(tctx, 1<<20); !errors.Is(err, spool.ErrRetired) {
		t.Fatalf("lane not retired: %v", err)
	}
	if err := l.Append(ctx, *req(`{"min_id_length":1}`)); err != nil {
		t.Fatal(err)
	}
	l.mu.RLock()
	_, cached := cacheIndex(l.lanes["key-1"], r)
	l.mu.RUnlock()
	if cached == first || cached == nil || cached.IsRetired() || cached.Key() != r.Lane() {
		t.Fatalf("cache holds %p (retired %p)", cached, first)
	}
	if got := cached.Stats().Records; got != 1 {
		t.Fatalf("live lane holds %d records, want 1", got)
	}

	// One api_key, many options: the cache keeps maxLanesPerKey of them.
	for i := range maxLanesPerKey + 4 {
		if err := l.Append(ctx, *req(`{"o":` + strconv.Itoa(i) + `}`)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(l.lanes["key-1"]); n != maxLanesPerKey {
		t.Errorf("%d lanes cached for one api_key, want %d", n, maxLanesPerKey)
	}
	if n := sp.Stats().Lanes; n != maxLanesPerKey+5 {
		t.Errorf("%d lanes in the spool, want %d", n, maxLanesPerKey+5)
	}
}
