package delivery

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/throttle"
)

// failingDead fails the first fail calls of PutDead (a disk in trouble),
// then stores into the real spool.
type failingDead struct {
	t     *testing.T
	sp    *spool.Spool
	fail  int
	calls int
}

func (f *failingDead) PutDead(ctx context.Context, dls []storage.DeadLetter) error {
	f.calls++
	if f.calls > 1000 { // bounded: a flush that does not wait must fail, not hang
		f.t.Errorf("PutDead called %d times: retried without waiting", f.calls)
		return spool.ErrClosed
	}
	if f.calls <= f.fail {
		return errors.New("write dead.db: input/output error")
	}
	return f.sp.PutDead(ctx, dls)
}

func openSpool(t *testing.T) *spool.Spool {
	t.Helper()
	sp, err := spool.Open(spool.Config{Dir: t.TempDir(), NoSync: true, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

func letters(n int) []storage.DeadLetter {
	dls := make([]storage.DeadLetter, n)
	for i := range dls {
		dls[i] = storage.DeadLetter{Lane: storage.LaneKey{Kind: storage.KindUserMap, APIKey: "k"}, Reason: reasonExpired,
			Record: storage.Record{Data: []byte(`{"user_id":"u"}`)}}
	}
	return dls
}

// FlushDead retries a failing commit with backoff until it is stored (once,
// the first error reported once), gives up when ctx ends and at once when
// the store is closed.
func TestFlushDead(t *testing.T) {
	t.Run("retried until stored", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			sp := openSpool(t)
			defer sp.Close()
			w := &failingDead{t: t, sp: sp, fail: 3}
			failed := 0
			start := time.Now()
			if err := FlushDead(t.Context(), w, letters(2), func(error) { failed++ }); err != nil {
				t.Fatal(err)
			}
			if w.calls != 4 || failed != 1 {
				t.Fatalf("%d PutDead calls, failed reported %d times; want 4 and 1", w.calls, failed)
			}
			// Three waits of the backoff (100, 200, 400 ms, jittered ±50%).
			if d := time.Since(start); d < 3*DeadRetryInitial/2 {
				t.Fatalf("retried after %v in all: no backoff", d)
			}
			dead, err := sp.ListDead(context.Background(), storage.DeadFilter{}, 0, 0)
			if err != nil || len(dead) != 2 {
				t.Fatalf("%d dead letters stored (%v), want 2", len(dead), err)
			}
		})
	})
	t.Run("context ends", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			sp := openSpool(t)
			defer sp.Close()
			w := &failingDead{t: t, sp: sp, fail: 1 << 30}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			err := FlushDead(ctx, w, letters(1), nil)
			if !errors.Is(err, context.DeadlineExceeded) || w.calls < 2 {
				t.Fatalf("err %v after %d calls; want the deadline after retries", err, w.calls)
			}
			if dead, _ := sp.ListDead(context.Background(), storage.DeadFilter{}, 0, 0); len(dead) != 0 {
				t.Fatalf("%d dead letters stored", len(dead))
			}
		})
	})
	t.Run("closed store", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			sp := openSpool(t)
			sp.Close()
			w := &failingDead{t: t, sp: sp}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			failed := 0
			err := FlushDead(ctx, w, letters(1), func(error) { failed++ })
			if !errors.Is(err, spool.ErrClosed) || w.calls != 1 || failed != 0 {
				t.Fatalf("err %v after %d calls (%d reported); want ErrClosed at once", err, w.calls, failed)
			}
		})
	})
}

// A record is expired from exactly max age on, for every kind: build
// sends one accepted just under MaxEventAge ago and dead-letters one
// accepted MaxEventAge ago.
func TestExpired(t *testing.T) {
	thr, _ := throttle.New(throttle.Config{}, nil)
	cfg := Config{Live: Live{IngestURL: "http://x", MaxEventAge: time.Hour}}.withDefaults()
	p := newPipeline(cfg, nil, nil, thr, nil)
	s := newRunner(p, nil, 1, "lane", storage.LaneKey{APIKey: "k"}).shard(0)
	now := time.Now()
	for i, acc := range []time.Time{now.Add(-time.Hour + time.Nanosecond), now.Add(-time.Hour)} {
		rec := storage.Record{OrderKey: fmt.Appendf(nil, "d:%d", i), Data: []byte(`{}`)}
		s.ready.push(item{rec: rec, ck: &chunkRef{accepted: acc}, enq: now})
	}
	s.build(now)
	if len(s.batch) != 1 || string(s.batch[0].rec.OrderKey) != "d:0" || len(s.dead) != 1 ||
		string(s.dead[0].it.rec.OrderKey) != "d:1" || s.dead[0].reason != reasonExpired {
		t.Fatalf("batch %d, dead %+v: want d:0 sent, d:1 expired", len(s.batch), s.dead)
	}
}
