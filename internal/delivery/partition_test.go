package delivery

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/upstream"
)

// slowAckReader hands out its messages and takes ackTook to confirm each
// ack (a loaded cluster's round trip), failing it when ctx ends first.
type slowAckReader struct {
	msgs    chan *storage.Message
	ackTook time.Duration
	acking  chan struct{} // closed when the first ack starts

	mu    sync.Mutex
	acked []uint64
}

func (r *slowAckReader) Next(ctx context.Context) (*storage.Message, error) {
	select {
	case m := <-r.msgs:
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (r *slowAckReader) Ack(ctx context.Context, m *storage.Message) error {
	r.mu.Lock()
	if len(r.acked) == 0 && r.acking != nil {
		close(r.acking)
		r.acking = nil
	}
	r.mu.Unlock()
	select {
	case <-time.After(r.ackTook):
	case <-ctx.Done():
		return ctx.Err()
	}
	r.mu.Lock()
	r.acked = append(r.acked, m.Seq)
	r.mu.Unlock()
	return nil
}

// TestPartitionAcksAtStop: when the relay stops while the partition's
// acks are in flight or queued, and its lease still holds, every one is
// sent, however long the store takes to confirm them: an ack cut short
// is a delivered message read again. Once the lease ran out, the acks
// not sent yet are given up (the next owner reads them again).
func TestPartitionAcksAtStop(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lease bool // the lease holds until the end
		want  []uint64
	}{
		{"LeaseHeld", true, []uint64{1, 2, 3}},
		{"LeaseRanOut", false, []uint64{1}},
	} {
		t.Run(tc.name, func(t *testing.T) { testAcksAtStop(t, tc.lease, tc.want) })
	}
}

func testAcksAtStop(t *testing.T, lease bool, want []uint64) {
	synctest.Test(t, func(t *testing.T) {
		lane := storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: "k"}
		r := &slowAckReader{msgs: make(chan *storage.Message, 3), ackTook: 3 * time.Second, acking: make(chan struct{})}
		acking := r.acking
		for seq := range uint64(3) {
			r.msgs <- &storage.Message{Seq: seq + 1, Lane: lane, Accepted: time.Now(), Records: []storage.Record{{OrderKey: []byte("o"), Data: []byte("x")}}}
		}
		// A form lane's runner whose upstream takes everything.
		ok := senderFunc(func(context.Context, *upstream.Request) upstream.Result { return upstream.Result{Kind: upstream.OK} })
		p, err := NewForm(FormConfig{Name: "gi", Lanes: lane.Kind, Kind: &Form{Field: "f", MaxItems: 10, MaxBodyBytes: 1 << 10},
			URL: func(string) string { return "http://up" }, Store: spool.NewBackend(nil), FormTiming: FormTiming{Linger: -1}}, ok, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		stop, cancel := context.WithCancel(context.Background())
		// As the engine's: ownership ends with the relay's stop, while
		// the store's lease holds until its Run gives it up.
		var held atomic.Bool
		held.Store(true)
		owned := storage.WithLease(stop, held.Load)
		done := make(chan error)
		go func() {
			done <- p.deliverPartition(stop, owned, r, func() {})
		}()
		<-acking
		held.Store(lease)
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(r.acked, want) {
			t.Fatalf("acknowledged %v at stop, want %v", r.acked, want)
		}
	})
}

// partitionStore hands its one queue (a partition, not a lane) to deliver
// and counts the acks sent after its Run's context ended: the lease given
// up while they were still to come.
type partitionStore struct {
	r        *slowAckReader
	ctx      context.Context // Run's
	lateAcks atomic.Int32
}

func (s *partitionStore) Run(ctx context.Context, deliver storage.DeliverFunc) error {
	s.ctx = ctx
	return deliver(ctx, s)
}

func (s *partitionStore) Next(ctx context.Context) (*storage.Message, error) { return s.r.Next(ctx) }

func (s *partitionStore) Ack(ctx context.Context, m *storage.Message) error {
	if s.ctx.Err() != nil {
		s.lateAcks.Add(1)
	}
	return s.r.Ack(ctx, m)
}

func (s *partitionStore) PutDead(context.Context, []storage.DeadLetter) error { return nil }

// TestEngineHoldsPartitionsWhileDraining: when the relay stops with a
// request of a partition in flight, the store's Run (which holds the
// partition's lease) outlives the stop until the answer came and its ack
// was sent, so that a standby taking over reads nothing again.
func TestEngineHoldsPartitionsWhileDraining(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lane := storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: "k"}
		st := &partitionStore{r: &slowAckReader{msgs: make(chan *storage.Message, 1)}}
		st.r.msgs <- &storage.Message{Seq: 1, Lane: lane, Accepted: time.Now(), Records: []storage.Record{{OrderKey: []byte("o"), Data: []byte("x")}}}
		sending := make(chan struct{})
		slow := senderFunc(func(context.Context, *upstream.Request) upstream.Result {
			close(sending)
			time.Sleep(2 * time.Second) // under the drain time-out (5 s)
			return upstream.Result{Kind: upstream.OK}
		})
		p, err := NewForm(FormConfig{Name: "gi", Lanes: lane.Kind, Kind: &Form{Field: "f", MaxItems: 10, MaxBodyBytes: 1 << 10},
			URL: func(string) string { return "http://up" }, Store: st, FormTiming: FormTiming{Linger: -1}}, slow, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- p.Run(ctx) }()
		<-sending
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(st.r.acked, []uint64{1}) || st.lateAcks.Load() != 0 {
			t.Fatalf("acknowledged %v, %d of them after the store's Run ended; want [1], none late", st.r.acked, st.lateAcks.Load())
		}
	})
}
