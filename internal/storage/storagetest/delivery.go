package storagetest

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/upstream"
)

// The delivery cases run the code that ships over the backend: the lane
// runner every kind shares (delivery.NewForm: here the group identify kind's)
// reading the store through the seam, sending to an upstream over
// 127.0.0.1 that answers 200, and acknowledging what it sent.

// upstreamOf records, in c, what the upstream is sent for the lane of
// kind group identify (lanes[2]): its records arrive as the form field
// "identification", a bracketed list of the records' data, comma-separated.
func upstreamOf(t *testing.T, c *collector) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		list := strings.TrimSuffix(strings.TrimPrefix(r.PostForm.Get("identification"), "["), "]")
		c.mu.Lock()
		for _, d := range strings.Split(list, ",") {
			k, n := parse(storage.Record{Data: []byte(d)})
			l := storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: r.PostForm.Get("api_key")}
			c.got[id(l, k)] = append(c.got[id(l, k)], n)
			c.n++
		}
		c.mu.Unlock()
		w.Write([]byte(`{"code":200}`))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// deliver runs delivery's form lanes over b, sending to srv, until the
// returned stop is called. stop first waits until the lanes hold nothing
// (every record read was answered and its message acknowledged to the
// partition's acker): the upstream records a request before the relay has
// its answer, and a stop gives that request only the drain time-out (on
// a loaded machine it may be ended and sent again after, as the product
// promises), which the suite would take for an acknowledgement lost.
func deliver(t *testing.T, b storage.Backend, srv *httptest.Server) (stop func()) {
	t.Helper()
	client, err := upstream.New(upstream.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fl, err := delivery.NewForm(delivery.FormConfig{Name: "suite", Lanes: storage.KindGroupIdentify,
		Kind: &delivery.Form{Field: "identification", MaxItems: 7, MaxBodyBytes: 1 << 20},
		URL:  func(string) string { return srv.URL + "/groupidentify" }, Store: b,
		FormTiming: delivery.FormTiming{Linger: -1, RetryInitial: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond}},
		client, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fl.Run(ctx) }()
	return func() {
		t.Helper()
		polltest.Until(t, "the lanes to hold nothing", func() bool {
			for _, ls := range fl.LaneStatus() {
				if ls.ReadAheadBytes != 0 {
					return false
				}
			}
			return true
		})
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("delivery: %v", err)
			}
		case <-time.After(polltest.Max):
			t.Fatalf("delivery did not return within %v of its context's end", polltest.Max)
		}
	}
}

// acked checks that everything delivered was acknowledged: the store,
// opened again, hands a reader the record appended after it first. The
// caller's last delivery was one record of key d:a in a chunk of its own:
// a lane acknowledges a chunk before it sends the next, so all before it
// was acknowledged, while its own answer may have raced the stop (a lane
// ends a request still in flight at the drain time-out, and the records
// are read again), and it may come back first.
func (s *suite) acked(t *testing.T, open OpenFunc, b storage.Backend, want counter) {
	t.Helper()
	closeB(t, b)
	b = open(t, Options{})
	k := id(lanes[2], "d:a")
	last := want[k]
	appendN(t, b, want, lanes[2], 1, "d:a")
	c := newCollector(nil)
	run := start(b, c)
	s.waitLast(t, c, counter{k: want[k]})
	run.stop(t)
	c.mu.Lock()
	for key, got := range c.got {
		if key != k || !slices.Equal(got, []int{want[k]}) && !slices.Equal(got, []int{last, want[k]}) {
			t.Errorf("%s: read %v after a restart, want only the record appended then (%s %d), after at most the last one delivered (%d)", key, got, k, want[k], last)
		}
	}
	c.mu.Unlock()
	closeB(t, b)
}

// testDelivery: every record appended to a lane, before delivery starts
// and while it runs, is delivered once, in order per key, and
// acknowledged; a record that fails its checksum becomes a dead letter
// with reason damaged, is never sent, and its lane goes on.
func (s *suite) testDelivery(t *testing.T) {
	open, b := s.open(t, Options{})
	c := newCollector(nil)
	srv := upstreamOf(t, c)
	want := counter{}
	appendN(t, b, want, lanes[2], 5, "d:a", "d:b")
	damaged := s.cfg.Damage != nil
	if damaged {
		marker := []byte("damage-me-0123456789")
		r := rec("d:a", 0)
		r.Data = append(append(r.Data, '/'), marker...)
		if err := b.Append(bg(t), request(lanes[2], []storage.Record{r})); err != nil {
			t.Fatal(err)
		}
		b = s.cfg.Damage(t, open, b, marker)
	}
	appendN(t, b, want, lanes[2], 5, "d:a", "d:b")
	stop := deliver(t, b, srv)
	s.waitLast(t, c, want)
	appendN(t, b, want, lanes[2], 20, "d:b", "d:a")
	s.waitLast(t, c, want)
	// The last delivery: one record in a chunk of its own (see acked).
	appendN(t, b, want, lanes[2], 1, "d:a")
	s.waitLast(t, c, want)
	stop()
	s.check(t, c, counter{}, want)
	if damaged { // (the fleet's damaged message names only its kind)
		dls, err := b.ListDead(bg(t), storage.DeadFilter{Reason: ReasonDamaged}, 0, 100)
		if err != nil || len(dls) != 1 || dls[0].Lane.Kind != lanes[2].Kind {
			t.Fatalf("dead letters with reason %s: %+v, %v; want the damaged record's", ReasonDamaged, dls, err)
		}
	}
	s.acked(t, open, b, want)
}

// testDeliveryNoSpace: a store without space still delivers what it holds
// (reading and acknowledging need no space), delivers what is appended
// once space is back, and every delivered record is acknowledged.
func (s *suite) testDeliveryNoSpace(t *testing.T) {
	if s.cfg.NoSpace == nil {
		t.Skip("the backend has no way to take its space away (Config.NoSpace)")
	}
	open, fill, free := s.cfg.NoSpace(t)
	b := open(t, Options{})
	c := newCollector(nil)
	srv := upstreamOf(t, c)
	want := counter{}
	for range 5 {
		appendN(t, b, want, lanes[2], 3, "d:a", "d:b")
	}
	fill()
	// Padded records until the store refuses one (it may have room set
	// aside that it fills first), a bounded number of times.
	var err error
	for i := 0; err == nil; i++ {
		if i == 10_000 {
			t.Fatal("10,000 appends taken on a full store")
		}
		r := rec("d:z", want[id(lanes[2], "d:z")]+1)
		r.Data = append(r.Data, "/"+strings.Repeat("p", 8<<10)...)
		if err = b.Append(bg(t), request(lanes[2], []storage.Record{r})); err == nil {
			want[id(lanes[2], "d:z")]++
		}
	}
	if !errors.Is(err, storage.ErrFull) {
		t.Fatalf("append without space: %v, want one matching storage.ErrFull", err)
	}
	stop := deliver(t, b, srv)
	s.waitLast(t, c, want)
	free()
	deadline := time.Now().Add(s.cfg.Wait)
	for {
		recs := []storage.Record{rec("d:a", want[id(lanes[2], "d:a")]+1)}
		if err := b.Append(bg(t), request(lanes[2], recs)); err == nil {
			want[id(lanes[2], "d:a")]++
			break
		} else if !errors.Is(err, storage.ErrFull) || time.Now().After(deadline) {
			t.Fatalf("append once space is back: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.waitLast(t, c, want)
	stop()
	s.check(t, c, counter{}, want)
	s.acked(t, open, b, want)
}
