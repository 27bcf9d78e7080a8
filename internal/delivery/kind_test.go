package delivery

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/poll"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/upstream"
)

// startUpstream starts the simulator on 127.0.0.1 (closed at cleanup) and
// returns it, its base URL and a client.
func startUpstream(t *testing.T) (*sim.Sim, string, *upstream.Client) {
	t.Helper()
	s := sim.New(sim.Config{}, nil)
	url, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	cli, err := upstream.New(upstream.Config{Timeout: 5 * time.Second}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, url, cli
}

// namingKind is a Form whose first answer names record 1 of the request
// dead (as an upstream naming invalid records by index would).
type namingKind struct {
	Form
	answered atomic.Int32
}

func (k *namingKind) Classify(res *upstream.Result, n int) Verdict {
	if k.answered.Add(1) == 1 {
		return Verdict{Outcome: DeadSome, Dead: map[int]string{1: "named"}}
	}
	return k.Form.Classify(res, n)
}

// The runner acts on its kind's verdict: the records a DeadSome names are
// dead letters, the others are sent again at once, in order, and the chunk
// is acknowledged after both.
func TestKindVerdict(t *testing.T) {
	s, url, cli := startUpstream(t)
	sp := openSpool(t)
	k := &namingKind{Form: Form{Field: "identification", MaxItems: 1024, MaxBodyBytes: 1 << 20}}
	d, err := NewFormLanes(FormConfig{Name: "groupidentify", Lanes: storage.KindGroupIdentify, Kind: k,
		URL: func(string) string { return url + "/groupidentify" }, FormTiming: FormTiming{Linger: -1}, Store: spool.NewBackend(sp, nil)}, cli, nil, nil)
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
	poll.Until(t, "the lane acknowledged", func() bool { return l.Stats().Records == 0 })
	var got []string
	for _, g := range s.GroupIdentifies("k") {
		got = append(got, g.GroupValue)
	}
	if want := []string{"v0", "v1", "v2", "v0", "v2"}; !slices.Equal(got, want) {
		t.Fatalf("upstream got %v, want %v (the request, then the two not named, in order)", got, want)
	}
	dead, err := sp.ListDead(storage.DeadFilter{}, 0, 0)
	if err != nil || len(dead) != 1 || dead[0].Reason != "named" || string(dead[0].Record.Data) != `{"group_type":"org","group_value":"v1"}` {
		t.Fatalf("dead letters %+v (%v), want v1 alone, reason named", dead, err)
	}
}

// firstKind is a Form whose first answer is replaced by first's verdict.
type firstKind struct {
	Form
	first    func(n int) Verdict
	answered atomic.Int32
}

func (k *firstKind) Classify(res *upstream.Result, n int) Verdict {
	if k.answered.Add(1) == 1 {
		return k.first(n)
	}
	return k.Form.Classify(res, n)
}

// A request sent again after a wait leaves out the records that expired
// meanwhile (their body is packed again): the older chunk's record is a
// dead letter, the younger one is resent alone.
func TestResendWithoutExpired(t *testing.T) {
	s, url, cli := startUpstream(t)
	sp := openSpool(t)
	ctx, cancel := context.WithCancel(context.Background())
	l, err := sp.Lane(ctx, storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	var appended [2]time.Time // after each append
	for i := range 2 {
		var b storage.Batch
		b.Add(storage.Record{OrderKey: []byte("org"), Data: fmt.Appendf(nil, `{"group_type":"org","group_value":"v%d"}`, i)})
		if err := sp.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
		appended[i] = time.Now()
		time.Sleep(5 * time.Millisecond) // the second chunk is accepted later
	}
	const maxAge = time.Hour
	var clock atomic.Int64 // unix nanos; 0: the real time
	firstN := make(chan int, 1)
	k := &firstKind{Form: Form{Field: "identification", MaxItems: 1024, MaxBodyBytes: 1 << 20}, first: func(n int) Verdict {
		firstN <- n
		clock.Store(appended[0].Add(maxAge).UnixNano()) // v0 has expired, v1 not
		return Verdict{Outcome: Wait}
	}}
	d, err := NewFormLanes(FormConfig{Name: "groupidentify", Lanes: storage.KindGroupIdentify, Kind: k,
		URL: func(string) string { return url + "/groupidentify" }, Store: spool.NewBackend(sp, nil),
		FormTiming: FormTiming{Linger: -1, MaxAge: maxAge, RetryInitial: time.Millisecond, RetryMax: time.Millisecond},
		Now: func() time.Time {
			if c := clock.Load(); c != 0 {
				return time.Unix(0, c)
			}
			return time.Now()
		}}, cli, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	runForms(t, ctx, cancel, d, sp)
	poll.Until(t, "the lane acknowledged", func() bool { return l.Stats().Records == 0 })
	if n := <-firstN; n != 2 {
		t.Fatalf("first request of %d records, want both chunks'", n)
	}
	var got []string
	for _, g := range s.GroupIdentifies("k") {
		got = append(got, g.GroupValue)
	}
	// The first request reached the upstream (its answer was taken for a
	// wait), then v1 alone.
	if want := []string{"v0", "v1", "v1"}; !slices.Equal(got, want) {
		t.Fatalf("upstream got %v, want %v", got, want)
	}
	dead, err := sp.ListDead(storage.DeadFilter{}, 0, 0)
	if err != nil || len(dead) != 1 || dead[0].Reason != ReasonExpired || string(dead[0].Record.Data) != `{"group_type":"org","group_value":"v0"}` {
		t.Fatalf("dead letters %+v (%v), want v0 alone, expired", dead, err)
	}
}

// runForms runs d until the test ends, then cancels ctx, waits for Run to
// return and closes sp.
func runForms(t *testing.T, ctx context.Context, cancel context.CancelFunc, d *FormLanes, sp *spool.Spool) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		sp.Close()
	})
}

// A lane lingers for more records while what it read fits one request, and
// sends as soon as a read fills it: records read one chunk at a time merge
// into requests of MaxItems (never a lone first record, never a wait for
// the linger's end once a read overflows the request; the overflow goes in
// the next request at once).
func TestLingerUntilFull(t *testing.T) {
	s, url, cli := startUpstream(t)
	sp := openSpool(t)
	d, err := NewFormLanes(FormConfig{Name: "groupidentify", Lanes: storage.KindGroupIdentify,
		Kind: &Form{Field: "identification", MaxItems: 2, MaxBodyBytes: 1 << 20},
		URL:  func(string) string { return url + "/groupidentify" }, Store: spool.NewBackend(sp, nil),
		ReadBytes:  1,                                     // one chunk per read
		FormTiming: FormTiming{Linger: 10 * time.Minute}}, // longer than poll.Until waits
		cli, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l, err := sp.Lane(ctx, storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // three chunks of one record
		var b storage.Batch
		b.Add(storage.Record{OrderKey: []byte("org"), Data: fmt.Appendf(nil, `{"group_type":"org","group_value":"v%d"}`, i)})
		if err := sp.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
	}
	runForms(t, ctx, cancel, d, sp)
	poll.Until(t, "the lane acknowledged", func() bool { return l.Stats().Records == 0 })
	var got []string
	for _, g := range s.GroupIdentifies("k") {
		got = append(got, fmt.Sprintf("%s@%d", g.GroupValue, g.Request))
	}
	if want := []string{"v0@1", "v1@1", "v2@2"}; !slices.Equal(got, want) {
		t.Fatalf("identifications@request %v, want %v", got, want)
	}
}
