package delivery

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/upstream"
)

// fakeSender answers with fn (a hand-written fake: the classification is
// the upstream package's, tested against the sim elsewhere).
type fakeSender struct {
	mu    sync.Mutex
	calls []time.Time
	fn    func(ctx context.Context, n int) upstream.Result
}

func (f *fakeSender) Do(ctx context.Context, r *upstream.Request) upstream.Result {
	f.mu.Lock()
	f.calls = append(f.calls, time.Now())
	n := len(f.calls)
	f.mu.Unlock()
	return f.fn(ctx, n)
}

func (f *fakeSender) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// openFilled opens a spool in dir with one lane holding n one-record chunks
// over 8 devices.
func openFilled(t *testing.T, n int) (*spool.Spool, *spool.Lane) {
	sp, err := spool.Open(spool.Config{Dir: t.TempDir(), NoSync: true, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := sp.Lane(context.Background(), storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		var b storage.Batch
		dev := string(rune('a' + i%8))
		b.Add(storage.Record{OrderKey: []byte("d:device-" + dev), Data: []byte(`{"event_type":"e","device_id":"device-` + dev + `"}`)})
		if err := sp.Append(context.Background(), l, &b); err != nil {
			t.Fatal(err)
		}
	}
	return sp, l
}

// A real 10-minute outage in fake time with the default backoff (500ms
// doubling, 60s cap, jitter): the number of requests per shard stays near
// log2(60/0.5) + 600s/45s; afterwards everything is delivered.
func TestOutageTenMinutesFakeTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp, l := openFilled(t, 64)
		defer sp.Close()
		start := time.Now()
		up := start.Add(10 * time.Minute)
		f := &fakeSender{fn: func(ctx context.Context, n int) upstream.Result {
			if time.Now().Before(up) {
				return upstream.Classify(503, nil, "", nil)
			}
			return upstream.Classify(200, []byte(`{"code":200}`), "", nil)
		}}
		const shards = 4
		p, err := New(Config{Live: Live{IngestURL: "http://sim", MaxEventAge: time.Hour}, ShardsPerLane: shards}, local(sp), f, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- p.Run(ctx) }()
		time.Sleep(10*time.Minute - time.Millisecond)
		during := f.count()
		// per shard: ~8 growing waits to reach the cap, then one try per
		// 30..60s (jitter 0.5, capped at 60s): at most 8+20 = 28.
		if during > shards*28 || during < shards {
			t.Fatalf("%d requests during a 10-minute outage (%d shards)", during, shards)
		}
		time.Sleep(2 * time.Minute)
		if got := l.Stats().Records; got != 0 {
			t.Fatalf("%d records left after the outage", got)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		t.Logf("%d requests during the outage, %d in all", during, f.count())
	})
}

// Stop: a request in flight gets DrainTimeout, then Run returns; the
// abandoned records stay in the spool.
func TestDrainDeadlineFakeTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp, l := openFilled(t, 3)
		defer sp.Close()
		f := &fakeSender{fn: func(ctx context.Context, n int) upstream.Result {
			<-ctx.Done() // a request that never answers
			return upstream.Classify(0, nil, "", ctx.Err())
		}}
		p, err := New(Config{Live: Live{IngestURL: "http://sim"}, DrainTimeout: 3 * time.Second}, local(sp), f, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- p.Run(ctx) }()
		time.Sleep(time.Second)
		synctest.Wait()
		if p.Ready() != nil || f.count() == 0 {
			t.Fatalf("ready %v, calls %d", p.Ready(), f.count())
		}
		cancel()
		stopped := time.Now()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if el := time.Since(stopped); el != 3*time.Second {
			t.Fatalf("Run returned %v after the stop, want the 3s drain", el)
		}
		if p.Ready() == nil {
			t.Fatal("ready after Run returned")
		}
		if got := l.Stats().Records; got != 3 {
			t.Fatalf("%d records in the spool, want 3", got)
		}
	})
}

// An abandoned request may still be sending its body, which the upstream
// client does not copy: the shard must never build a later batch into that
// buffer. Run is stopped with every shard's request abandoned, then run
// again on the same pipeline (same body pool) to deliver everything; the
// abandoned bodies must be as they were when abandoned.
func TestAbandonedBodyNotReused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp, l := openFilled(t, 64)
		defer sp.Close()
		var mu sync.Mutex
		var kept, snaps [][]byte
		abandon := true
		send := senderFunc(func(ctx context.Context, r *upstream.Request) upstream.Result {
			mu.Lock()
			ab := abandon
			mu.Unlock()
			if !ab {
				return upstream.Classify(200, []byte(`{"code":200}`), "", nil)
			}
			<-ctx.Done() // never answers: abandoned at the drain deadline
			mu.Lock()
			kept = append(kept, r.Body)
			snaps = append(snaps, bytes.Clone(r.Body))
			mu.Unlock()
			return upstream.Classify(0, nil, "", ctx.Err())
		})
		p, err := New(Config{Live: Live{IngestURL: "http://sim", FlushInterval: time.Millisecond}, DrainTimeout: time.Second}, local(sp), send, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		run := func(until func() bool) {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- p.Run(ctx) }()
			for !until() {
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		run(func() bool { time.Sleep(time.Second); synctest.Wait(); return true })
		mu.Lock()
		n := len(kept)
		abandon = false
		mu.Unlock()
		if n == 0 {
			t.Fatal("no request was abandoned")
		}
		run(func() bool { return l.Stats().Records == 0 })
		mu.Lock()
		defer mu.Unlock()
		for i := range kept {
			if !bytes.Equal(kept[i], snaps[i]) {
				t.Fatalf("abandoned body %d was overwritten:\n%s\nnow\n%s", i, snaps[i], kept[i])
			}
		}
		t.Logf("%d abandoned bodies intact", n)
	})
}

// senderFunc adapts a function to Sender.
type senderFunc func(ctx context.Context, r *upstream.Request) upstream.Result

func (f senderFunc) Do(ctx context.Context, r *upstream.Request) upstream.Result { return f(ctx, r) }
