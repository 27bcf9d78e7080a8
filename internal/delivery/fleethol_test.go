package delivery

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/throttle"
	"github.com/svcrelay/relay/internal/upstream"
)

// Head-of-line inside a fleet partition: a partition carries
// many lanes; a lane that takes nothing must not stop the others.

// muxStore is a fleet partition as the engine sees it, over the local
// spool: one queue carrying every lane's messages in the order the test
// appended them, that can spill (Spill, Reread, MaxSpilled, as the fleet's
// partition reader). Each lane's spool.Backend reader is read into a list;
// Next hands the lists' messages out in append order; Ack acknowledges in
// the spool. The store keeps the bodies (it is the store): Spill only
// counts.
type muxStore struct {
	loc        *spool.Backend
	sp         *spool.Spool
	maxSpilled int

	mu        sync.Mutex
	order     []storage.LaneKey // the lane of each appended message, in order
	next      int
	ready     map[storage.LaneKey][]muxHeld
	out       map[uint64]muxHeld // by the partition's sequence
	seq       uint64
	changed   chan struct{}
	spilled   map[uint64]bool
	maxSeen   int // most messages spilled at once
	rereads   int
	readerErr error
}

type muxHeld struct {
	r storage.Reader
	m *storage.Message
}

func newMuxStore(sp *spool.Spool, maxSpilled int) *muxStore {
	return &muxStore{loc: spool.NewBackend(sp), sp: sp, maxSpilled: maxSpilled,
		ready: map[storage.LaneKey][]muxHeld{}, out: map[uint64]muxHeld{}, changed: make(chan struct{}), spilled: map[uint64]bool{}}
}

func (s *muxStore) readyLens() map[string]int {
	m := map[string]int{}
	for k, q := range s.ready {
		m[k.APIKey] = len(q)
	}
	return m
}

func (s *muxStore) wakeLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// appended records that the test appended one message to lane.
func (s *muxStore) appended(lane storage.LaneKey) {
	s.mu.Lock()
	s.order = append(s.order, lane)
	s.wakeLocked()
	s.mu.Unlock()
}

func (s *muxStore) PutDead(ctx context.Context, dls []storage.DeadLetter) error {
	return s.sp.PutDead(ctx, dls)
}

// Run hands one partition, the mux, to deliver.
func (s *muxStore) Run(ctx context.Context, deliver storage.DeliverFunc) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() {
		s.loc.Run(lctx, func(ctx context.Context, r storage.Reader) error {
			for {
				m, err := r.Next(ctx)
				if err != nil {
					return nil
				}
				s.mu.Lock()
				s.ready[m.Lane] = append(s.ready[m.Lane], muxHeld{r, m})
				s.wakeLocked()
				s.mu.Unlock()
			}
		})
	})
	return deliver(ctx, &muxReader{s})
}

// muxReader is the partition's reader; the spilling methods are on it
// (not on muxStore) as on the fleet's.
type muxReader struct{ s *muxStore }

func (r *muxReader) Name() string { return "events-0" }

func (r *muxReader) Next(ctx context.Context) (*storage.Message, error) {
	s := r.s
	for {
		s.mu.Lock()
		if s.next < len(s.order) {
			lane := s.order[s.next]
			if q := s.ready[lane]; len(q) > 0 {
				h := q[0]
				s.ready[lane] = q[1:]
				s.next++
				s.seq++
				s.out[s.seq] = h
				m := &storage.Message{Seq: s.seq, Lane: h.m.Lane, Accepted: h.m.Accepted, Records: h.m.Records}
				s.mu.Unlock()
				return m, nil
			}
		}
		c := s.changed
		s.mu.Unlock()
		select {
		case <-c:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (r *muxReader) Ack(ctx context.Context, m *storage.Message) error {
	s := r.s
	s.mu.Lock()
	h, ok := s.out[m.Seq]
	delete(s.out, m.Seq)
	spilled := s.spilled[m.Seq]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("mux: ack of %d not read", m.Seq)
	}
	if spilled {
		s.mu.Lock()
		s.readerErr = fmt.Errorf("mux: %d acknowledged while spilled", m.Seq)
		s.mu.Unlock()
	}
	return h.r.Ack(ctx, h.m)
}

// Spill takes a moment before the store knows, as a loaded machine's
// would: a runner that reads a message again before that fails the test.
func (r *muxReader) Spill(seq uint64) {
	time.Sleep(time.Millisecond)
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.out[seq]; !ok || s.spilled[seq] {
		s.readerErr = fmt.Errorf("mux: spill of %d not read or spilled twice", seq)
		return
	}
	s.spilled[seq] = true
	s.maxSeen = max(s.maxSeen, len(s.spilled))
}

func (r *muxReader) Reread(ctx context.Context, seq uint64) (*storage.Message, error) {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.out[seq]
	if !ok || !s.spilled[seq] {
		s.readerErr = fmt.Errorf("mux: reread of %d not spilled", seq)
		return nil, s.readerErr
	}
	delete(s.spilled, seq)
	s.rereads++
	return &storage.Message{Seq: seq, Lane: h.m.Lane, Accepted: h.m.Accepted, Records: h.m.Records}, nil
}

func (r *muxReader) MaxSpilled() int { return r.s.maxSpilled }

// revokingSender sends the requests of one api_key to a second simulator
// that refuses it ("Invalid API key") while revoked, and to the harness's
// otherwise.
type revokingSender struct {
	next    Sender
	key     string
	strict  string // the refusing simulator's ingest URL
	mu      sync.Mutex
	revoked bool
}

func (s *revokingSender) Do(ctx context.Context, r *upstream.Request) upstream.Result {
	s.mu.Lock()
	revoked := s.revoked
	s.mu.Unlock()
	if revoked && strings.Contains(string(r.Body[:min(len(r.Body), 200)]), `"api_key":"`+s.key+`"`) {
		rr := *r
		rr.URL = s.strict + "/2/httpapi"
		return s.next.Do(ctx, &rr)
	}
	return s.next.Do(ctx, r)
}

func (s *revokingSender) setRevoked(v bool) {
	s.mu.Lock()
	s.revoked = v
	s.mu.Unlock()
}

// TestFleetPartitionLaneHeadOfLine: one partition carries three lanes, in
// interleaved messages: "bad-key", whose api_key the upstream refuses
// (the lane stops), "quota-key", whose only device is paused (as over its
// daily quota: the lane's read-ahead fills with its events), each with a
// backlog many times the partition's queue, and "good-key" behind them.
// The good lane's events are all delivered while the others are held;
// after the key is valid again (ResumeLane) and the pause ended, the held
// lanes' events are delivered, in order per device, none lost, none
// acknowledged undelivered (the harness's checks).
func TestFleetPartitionLaneHeadOfLine(t *testing.T) {
	t.Run("held-lanes-spilled", func(t *testing.T) { testLaneHeadOfLine(t, 1000) })
	// With room to spill 100 messages only, the partition waits once
	// they are spilled (the good lane's later events with it) and goes
	// on when the held lanes take theirs again: nothing lost, in order.
	t.Run("spill-limit-reached", func(t *testing.T) { testLaneHeadOfLine(t, 100) })
}

// testLaneHeadOfLine runs the case with a quota pause of 15 s, and again
// with a longer one when a loaded machine ended the pause before the case
// could tell anything: a pipeline whose held lanes block the good one
// fails at every length (minutes late), a right one passes at the first
// the machine allows.
func testLaneHeadOfLine(t *testing.T, maxSpilled int) {
	for _, quotaFor := range []time.Duration{15 * time.Second, time.Minute, 4 * time.Minute} {
		if laneHeadOfLine(t, maxSpilled, quotaFor) {
			return
		}
		t.Logf("the %v quota ended before the good lane could be told apart; again with a longer one", quotaFor)
	}
	t.Fatal("the good lane was not delivered while the other lanes were held, even in 4 minutes")
}

// laneHeadOfLine is one run of the case; false when the quota pause ended
// before the good lane was delivered (nothing shown).
func laneHeadOfLine(t *testing.T, maxSpilled int, quotaFor time.Duration) bool {
	const (
		maxReadAhead = 64 << 10 // the partition's queue is an eighth: 8 KiB
		n            = 300      // messages per lane, ~450 bytes each
	)
	h := newHarness(t, sim.Config{}, Config{Live: Live{MaxBatchEvents: 20}, MaxReadAheadBytes: maxReadAhead, ShardsPerLane: 2}, throttle.Config{})
	strict := simtest.New(sim.Config{APIKeys: []string{"good-key", "quota-key"}}, nil)
	strictURL, err := strict.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { strict.Close() })
	rev := &revokingSender{next: h.send.next, key: "bad-key", strict: strictURL, revoked: true}
	h.send.next = rev
	st := newMuxStore(h.sp, maxSpilled)
	h.reg = prometheus.NewRegistry()
	h.p, err = NewFleet(h.cfg, st, nil, nil, h.send, h.thr, zaptest.NewLogger(t), h.reg)
	if err != nil {
		t.Fatal(err)
	}
	quotaEnds := time.Now().Add(quotaFor)
	h.thr.Pause([]string{"d:quota-device"}, quotaEnds)
	lane := func(k string) storage.LaneKey { return storage.LaneKey{Kind: storage.KindEvents, APIKey: k} }
	var good []string
	for i := range n {
		h.add("bad-key", ev{Device: "bad-device-" + fmt.Sprint(i%3), Pad: 300})
		st.appended(lane("bad-key"))
		h.add("quota-key", ev{Device: "quota-device", Pad: 300})
		st.appended(lane("quota-key"))
		good = append(good, h.add("good-key", ev{Device: "good-device-" + fmt.Sprint(i%5), Pad: 300})...)
		st.appended(lane("good-key"))
	}
	h.start()
	delivered := func(ids []string) int {
		h.send.mu.Lock()
		defer h.send.mu.Unlock()
		k := 0
		for _, id := range ids {
			if h.send.okSent[id] > 0 {
				k++
			}
		}
		return k
	}
	limited := maxSpilled < 2*n // the held lanes' messages do not all fit
	for !limited && delivered(good) < len(good) {
		if time.Now().After(quotaEnds.Add(-2 * time.Second)) {
			t.Logf("good lane: %d of %d events delivered while the other lanes are held; lanes %+v",
				delivered(good), len(good), h.p.LaneStatus())
			h.stop()
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	if limited {
		// Wait until the partition holds its limit.
		for deadline := time.Now().Add(polltest.Max); ; time.Sleep(50 * time.Millisecond) {
			st.mu.Lock()
			k := len(st.spilled)
			st.mu.Unlock()
			if k >= maxSpilled {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d spilled, want the limit %d", k, maxSpilled)
			}
		}
		if k := delivered(good); k == len(good) && !time.Now().After(quotaEnds) {
			t.Fatalf("every good event delivered past the spill limit")
		}
	}
	if time.Now().After(quotaEnds) { // the good lane may have gone after the quota
		h.stop()
		return false
	}
	var badLane uint64
	for _, ls := range h.p.LaneStatus() {
		if ls.Stopped {
			badLane = ls.ID
		}
	}
	if badLane == 0 {
		t.Fatalf("no lane stopped: %+v", h.p.LaneStatus())
	}
	st.mu.Lock()
	maxSeen, rereadsBefore := st.maxSeen, st.rereads
	st.mu.Unlock()
	if maxSeen == 0 {
		t.Fatal("nothing spilled")
	}
	if maxSeen > st.maxSpilled+maxReadAhead/8/400 { // one lane's queue over
		t.Fatalf("%d spilled at once, above MaxSpilled %d", maxSeen, st.maxSpilled)
	}
	rev.setRevoked(false)
	if err := h.p.ResumeLane(badLane); err != nil {
		t.Fatal(err)
	}
	for deadline := quotaEnds.Add(polltest.Max); ; time.Sleep(20 * time.Millisecond) {
		var left int64
		for _, l := range h.sp.Lanes() {
			left += l.Stats().Records
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			st.mu.Lock()
			t.Fatalf("spool still holds %d records; store: %d of %d read, %d unacknowledged, %d spilled, ready %v; lanes %+v",
				left, st.next, len(st.order), len(st.out), len(st.spilled), st.readyLens(), h.p.LaneStatus())
		}
	}
	h.stop()
	if dead := h.check(nil); len(dead) != 0 {
		t.Fatalf("%d dead letters", len(dead))
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.readerErr != nil {
		t.Fatal(st.readerErr)
	}
	if len(st.spilled) != 0 || len(st.out) != 0 {
		t.Fatalf("%d spilled, %d unacknowledged after the drain", len(st.spilled), len(st.out))
	}
	t.Logf("spilled at most %d at once; %d read again (%d before the resume)", maxSeen, st.rereads, rereadsBefore)
	return true
}

// lostStore is a muxStore whose spilled messages are gone when read again,
// the lease still held: the fleet's previous owner of the partition removed
// what it had acknowledged while this relay held it spilled.
type lostStore struct{ *muxStore }

func (s lostStore) Run(ctx context.Context, deliver storage.DeliverFunc) error {
	return s.muxStore.Run(ctx, func(ctx context.Context, r storage.Reader) error {
		return deliver(ctx, lostReader{r.(*muxReader)})
	})
}

type lostReader struct{ *muxReader }

func (lostReader) Reread(context.Context, uint64) (*storage.Message, error) {
	return nil, fmt.Errorf("mux: reread: %w", storage.ErrLost)
}

// TestFleetSpilledMessageLost: a spilled message that the store says is
// lost when read again ends the partition's delivery (the deliver function
// returns, as storage.ErrLost asks, and the store hands the partition out
// again), even while the lease holds. The partition's runner waited for
// the lease to end instead: its lane held that message at its head, and
// everything behind it, for good.
func TestFleetSpilledMessageLost(t *testing.T) {
	h := newHarness(t, sim.Config{}, Config{}, throttle.Config{})
	st := lostStore{newMuxStore(h.sp, 100)}
	h.reg = prometheus.NewRegistry()
	var err error
	h.p, err = NewFleet(h.cfg, st, nil, nil, h.send, h.thr, zaptest.NewLogger(t), h.reg)
	if err != nil {
		t.Fatal(err)
	}
	lane := storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"}
	h.add("k", ev{Device: "d"})
	st.appended(lane)
	h.start()
	polltest.Until(t, "the lane's runner started, its first message acknowledged", func() bool {
		ls := h.p.LaneStatus()
		return len(ls) == 1 && ls[0].Records == 0
	})
	// Stopped, the lane's next message is spilled as it comes, and read
	// again at once: lost.
	if err := h.p.StopLane(h.p.LaneStatus()[0].ID); err != nil {
		t.Fatal(err)
	}
	h.add("k", ev{Device: "d"})
	st.appended(lane)
	select {
	case err := <-h.done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		h.cancel()
		h.cancel = nil
	case <-time.After(polltest.Max):
		t.Fatalf("the partition's delivery did not end; lanes %+v", h.p.LaneStatus())
	}
}
