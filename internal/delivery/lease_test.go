package delivery

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/poll"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// leasedStore hands out the local spool's queues with a lease the test
// runs out and renews (as the fleet's partitions: storage.WithLease), and
// counts the messages read. It hides the local spool (Spool), so that the
// lanes are delivered as the fleet's.
type leasedStore struct {
	loc   *spool.Backend
	held  atomic.Bool
	reads atomic.Int64
}

func (s *leasedStore) PutDead(ctx context.Context, dls []storage.DeadLetter) error {
	return s.loc.PutDead(ctx, dls)
}

func (s *leasedStore) Run(ctx context.Context, deliver storage.DeliverFunc) error {
	return s.loc.Run(ctx, func(owned context.Context, r storage.Reader) error {
		return deliver(storage.WithLease(owned, s.held.Load), &countingReader{Reader: r, reads: &s.reads})
	})
}

type countingReader struct {
	storage.Reader
	reads *atomic.Int64
}

func (r *countingReader) Next(ctx context.Context) (*storage.Message, error) {
	m, err := r.Reader.Next(ctx)
	if err == nil {
		r.reads.Add(1)
	}
	return m, err
}

// TestFormLeaseRunOut: while a queue's lease has run out by the clock, its
// context not cancelled (a relay resumed after a stop, its timers not yet
// run), a form lane sends nothing of it; when a renewal extends the lease
// instead, its records are delivered, in order (the lane waited, it did
// not end).
func TestFormLeaseRunOut(t *testing.T) {
	s, url, cli := startUpstream(t)
	sp := openSpool(t)
	st := &leasedStore{loc: spool.NewBackend(sp, nil)}
	d, err := NewFormLanes(FormConfig{Name: "groupidentify", Lanes: storage.KindGroupIdentify,
		Kind: &Form{Field: "identification", MaxItems: 1024, MaxBodyBytes: 1 << 20},
		URL:  func(string) string { return url + "/groupidentify" }, FormTiming: FormTiming{Linger: -1}, Store: st}, cli, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l, err := sp.Lane(ctx, storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	var b storage.Batch
	for i := range 3 {
		b.Add(storage.Record{OrderKey: []byte("org"), Data: fmt.Appendf(nil, `{"group_type":"org","group_value":"v%d"}`, i)})
	}
	if err := sp.Append(ctx, l, &b); err != nil {
		t.Fatal(err)
	}
	runForms(t, ctx, cancel, d, sp)
	poll.Until(t, "the lane to read its queue", func() bool { return st.reads.Load() > 0 })
	time.Sleep(200 * time.Millisecond) // the lane sends at once (no linger)
	if got := s.GroupIdentifies("k"); len(got) != 0 {
		t.Fatalf("upstream got %d group identifies while the lease had run out", len(got))
	}
	st.held.Store(true)
	poll.Until(t, "the lane acknowledged", func() bool { return l.Stats().Records == 0 })
	var got []string
	for _, g := range s.GroupIdentifies("k") {
		got = append(got, g.GroupValue)
	}
	if want := []string{"v0", "v1", "v2"}; !slices.Equal(got, want) {
		t.Fatalf("upstream got %v, want %v", got, want)
	}
}
