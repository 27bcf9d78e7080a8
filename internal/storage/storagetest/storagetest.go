// Package storagetest is the conformance suite of the storage seam: every
// backend (the local spool, the fleet) runs Run against itself, so that the
// delivery engine and the ingest can rely on the invariants of package
// storage whichever store is configured.
package storagetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

// Options are what a test asks of the store it opens.
type Options struct {
	// MaxBytes is the store's quota (local: Config.MaxBytes; fleet: each
	// stream's); zero means none.
	MaxBytes int64
}

// OpenFunc opens the store of one test: every call opens the same store
// (after the previous Backend was closed: a restart, as a new process
// would), with the same Options.
type OpenFunc func(t *testing.T, o Options) storage.Backend

// Config is a backend under test.
type Config struct {
	// New makes a fresh, empty store for one test.
	New func(t *testing.T) OpenFunc
	// LaneQueues says each queue holds one lane (the local spool); false:
	// a queue carries several lanes (the fleet's partitions).
	LaneQueues bool
	// Wait bounds each wait for records to be read; zero means polltest.Max
	// (a loaded machine's backend may take far longer than a quiet one's).
	Wait time.Duration
	// Damage makes the record whose data holds marker, appended to b
	// and not yet read, fail its checksum when it is read, as damage on
	// the store's medium would. It returns the store to go on with: b,
	// or another one opened with open once b is closed (the local spool
	// flips bytes of the closed spool.db). Nil skips the Damaged case.
	Damage func(t *testing.T, open OpenFunc, b storage.Backend, marker []byte) storage.Backend
	// NoSpace opens a fresh store, as New and its OpenFunc do, whose
	// space a test can take away: after fill an Append fails for want of
	// space (the local spool: its filesystem full; the fleet: its streams
	// at their byte limit), after free it succeeds again. Nil skips the
	// NoSpace case.
	NoSpace func(t *testing.T) (open OpenFunc, fill, free func())
}

// Run runs the suite's cases in parallel, each on a fresh store of its
// own (Config.New, Config.NoSpace): most of their time is spent waiting on
// the store (fsyncs, leases, a cluster's answers), not on the CPU.
func Run(t *testing.T, cfg Config) {
	if cfg.Wait == 0 {
		cfg.Wait = polltest.Max
	}
	s := &suite{cfg: cfg}
	for _, c := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"AppendReadOrder", s.testAppendReadOrder},
		{"AckRemoves", s.testAckRemoves},
		{"UnackedReturnAfterRestart", s.testUnackedReturn},
		{"DeadLetters", s.testDeadLetters},
		{"ConcurrentAppends", s.testConcurrentAppends},
		{"AllOrNothing", s.testAllOrNothing},
		{"Crash", s.testCrash},
		{"Damaged", s.testDamaged},
		{"NoSpace", s.testNoSpace},
		{"Delivery", s.testDelivery},
		{"DeliveryNoSpace", s.testDeliveryNoSpace},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t)
		})
	}
}

// ReasonDamaged is the dead-letter reason of records that failed their
// checksum when read.
const ReasonDamaged = "damaged"

// Crasher is a Backend that can stop as a crash of its process would:
// nothing flushed, nothing released (the fleet: its connection dropped,
// its leases left to expire). After Crash, Run returns soon and Close is
// not called; the next open must find every appended record not
// acknowledged.
//
// The local spool is no Crasher: its file lock keeps a second open in the
// same process out until Close, so its crash behaviour is checked by
// killing a child process (internal/spool's crash test, test/crash), and
// the suite's Crash case is skipped for it.
type Crasher interface {
	Crash()
}

// unwrapper is a wrapper of a Backend (Broken's).
type unwrapper interface {
	Unwrap() storage.Backend
}

func crasher(b storage.Backend) (Crasher, bool) {
	for {
		if c, ok := b.(Crasher); ok {
			return c, true
		}
		u, ok := b.(unwrapper)
		if !ok {
			return nil, false
		}
		b = u.Unwrap()
	}
}

type suite struct{ cfg Config }

// The lanes the tests write: two of one kind, one of another, so that
// both backends have several queues.
var lanes = []storage.LaneKey{
	{Kind: storage.KindEvents, APIKey: "key-1"},
	{Kind: storage.KindEvents, APIKey: "key-2", Options: `{"min_id_length":1}`},
	{Kind: storage.KindGroupIdentify, APIKey: "key-1"},
}

// rec is record n of key k; its data is "k/n".
func rec(k string, n int) storage.Record {
	return storage.Record{OrderKey: []byte(k), UserID: []byte("u-" + k), Data: []byte(k + "/" + strconv.Itoa(n))}
}

func bg(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*polltest.Max)
	t.Cleanup(cancel)
	return ctx
}

// id names a lane and key in the collector.
func id(l storage.LaneKey, key string) string {
	return fmt.Sprintf("%s|%s|%s|%s", l.Kind, l.APIKey, l.Options, key)
}

// counter counts what a test appended, per lane and key.
type counter map[string]int

func (c counter) total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// appendN appends one request of n records of each key to lane l,
// numbering them on from want.
func appendN(t *testing.T, b storage.Appender, want counter, l storage.LaneKey, n int, keys ...string) {
	t.Helper()
	var recs []storage.Record
	for _, k := range keys {
		for range n {
			want[id(l, k)]++
			recs = append(recs, rec(k, want[id(l, k)]))
		}
	}
	if err := b.Append(bg(t), request(l, recs)); err != nil {
		t.Fatalf("append: %v", err)
	}
}

// request is a request of recs to lane l.
func request(l storage.LaneKey, recs []storage.Record) storage.Request {
	var b storage.Batch
	for _, r := range recs {
		b.Add(r)
	}
	return storage.Request{Kind: l.Kind, APIKey: []byte(l.APIKey), Options: []byte(l.Options), Batch: &b}
}

// collector is a deliver function that records what it read.
type collector struct {
	// ack says whether to acknowledge a message (nil: all).
	ack func(m *storage.Message) bool

	mu      sync.Mutex
	got     map[string][]int // per lane and key, in read order
	n       int
	readers int
	errs    []string
}

func newCollector(ack func(*storage.Message) bool) *collector {
	return &collector{ack: ack, got: make(map[string][]int)}
}

// first is the number of m's first record.
func first(m *storage.Message) int {
	_, n := parse(m.Records[0])
	return n
}

func parse(r storage.Record) (string, int) {
	k, v, _ := strings.Cut(string(r.Data), "/")
	v, _, _ = strings.Cut(v, "/") // padding, a marker
	n, _ := strconv.Atoi(v)
	return k, n
}

func (c *collector) deliver(ctx context.Context, r storage.Reader) error {
	c.mu.Lock()
	c.readers++
	c.mu.Unlock()
	var lane *storage.LaneKey
	for {
		m, err := r.Next(ctx)
		if err != nil {
			return err
		}
		c.mu.Lock()
		if lane == nil {
			lane = &m.Lane
		}
		if *lane != m.Lane {
			c.errs = append(c.errs, fmt.Sprintf("a queue carried lanes %v and %v", *lane, m.Lane))
		}
		for _, rec := range m.Records {
			k, n := parse(rec)
			if want := "u-" + k; string(rec.UserID) != want || string(rec.OrderKey) != k {
				c.errs = append(c.errs, fmt.Sprintf("record %s/%d read with order key %q, user %q", k, n, rec.OrderKey, rec.UserID))
			}
			c.got[id(m.Lane, k)] = append(c.got[id(m.Lane, k)], n)
			c.n++
		}
		c.mu.Unlock()
		if c.ack == nil || c.ack(m) {
			// On a context of its own, as the engine's acker: a test
			// stops Run once it counted the records, and an ack cut
			// short then would bring an acknowledged message back.
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), polltest.Max)
			err := r.Ack(actx, m)
			cancel()
			if err != nil {
				return err
			}
		}
	}
}

func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// running is a backend's Run in the background.
type running struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func start(b storage.Backend, c *collector) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		b.Run(ctx, c.deliver)
	}()
	return r
}

func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(polltest.Max):
		t.Fatalf("Run did not return within %v of its context's end", polltest.Max)
	}
}

// waitCount waits until c read at least n records.
// readN runs b with a new collector until it has read n records, stops it
// and returns the collector.
func (s *suite) readN(t *testing.T, b storage.Backend, n int) *collector {
	t.Helper()
	c := newCollector(nil)
	run := start(b, c)
	s.waitCount(t, c, n)
	run.stop(t)
	return c
}

func (s *suite) waitCount(t *testing.T, c *collector, n int) {
	t.Helper()
	deadline := time.Now().Add(s.cfg.Wait)
	for c.count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("read %d records within %v, want %d", c.count(), s.cfg.Wait, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitLast waits until c read the last record want names of every key.
func (s *suite) waitLast(t *testing.T, c *collector, want counter) {
	t.Helper()
	deadline := time.Now().Add(s.cfg.Wait)
	for {
		c.mu.Lock()
		missing := ""
		for k, n := range want {
			if got := c.got[k]; len(got) == 0 || got[len(got)-1] != n {
				missing = k
				break
			}
		}
		c.mu.Unlock()
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: record %d not read last within %v", missing, want[missing], s.cfg.Wait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// check fails unless c read exactly the records from[key]..want[key] of
// each key, in order, and nothing else; and, with LaneQueues, no queue
// carried two lanes.
func (s *suite) check(t *testing.T, c *collector, from, want counter) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.errs {
		if s.cfg.LaneQueues || !strings.HasPrefix(e, "a queue carried") {
			t.Error(e)
		}
	}
	for k, n := range want {
		lo := from[k] + 1
		var exp []int
		for i := lo; i <= n; i++ {
			exp = append(exp, i)
		}
		if got := c.got[k]; !slices.Equal(got, exp) {
			t.Errorf("%s: read %v, want %v", k, got, exp)
		}
	}
	for k, got := range c.got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: read %v, never appended", k, got)
		}
	}
}

func (s *suite) open(t *testing.T, o Options) (OpenFunc, storage.Backend) {
	open := s.cfg.New(t)
	return open, open(t, o)
}

func closeB(t *testing.T, b storage.Backend) {
	t.Helper()
	if err := b.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// testAppendReadOrder: what is appended is read, once, in order per key,
// with its lane, order key and user id.
func (s *suite) testAppendReadOrder(t *testing.T) {
	_, b := s.open(t, Options{})
	want := counter{}
	for r := range 24 {
		keys := []string{"d:0", "d:1", "d:2", "d:3"}[:1+r%4]
		appendN(t, b, want, lanes[r%len(lanes)], 2, keys...)
	}
	c := s.readN(t, b, want.total())
	s.check(t, c, counter{}, want)
	closeB(t, b)
}

// testAckRemoves: an acknowledged message is not read again after a
// restart.
func (s *suite) testAckRemoves(t *testing.T) {
	open, b := s.open(t, Options{})
	want := counter{}
	for r := range 9 {
		appendN(t, b, want, lanes[r%len(lanes)], 3, "d:a", "d:b")
	}
	c := s.readN(t, b, want.total())
	s.check(t, c, counter{}, want)
	closeB(t, b)

	b = open(t, Options{})
	// A marker behind everything of key d:a in every lane: had any
	// acknowledged message come back, it would be read before it.
	from := maps(want)
	for _, l := range lanes {
		appendN(t, b, want, l, 1, "d:a")
	}
	c = s.readN(t, b, len(lanes))
	for k := range from {
		if !strings.HasSuffix(k, "|d:a") {
			delete(want, k)
			delete(from, k)
		}
	}
	s.check(t, c, from, want)
	closeB(t, b)
}

func maps(c counter) counter {
	out := make(counter, len(c))
	for k, v := range c {
		out[k] = v
	}
	return out
}

// testUnackedReturn: messages read and not acknowledged come back after a
// restart, in order and in front of what is appended after it; those
// acknowledged do not.
func (s *suite) testUnackedReturn(t *testing.T) {
	open, b := s.open(t, Options{})
	want := counter{}
	for range 5 {
		for _, l := range lanes {
			appendN(t, b, want, l, 1, "d:a", "d:b")
		}
	}
	// Acknowledge records 1 and 2 of each key only.
	c := newCollector(func(m *storage.Message) bool { return first(m) <= 2 })
	run := start(b, c)
	s.waitCount(t, c, want.total())
	run.stop(t)
	s.check(t, c, counter{}, want)
	closeB(t, b)

	b = open(t, Options{})
	from := counter{}
	for k := range want {
		from[k] = 2
	}
	for range 3 {
		for _, l := range lanes {
			appendN(t, b, want, l, 1, "d:a", "d:b")
		}
	}
	c = s.readN(t, b, want.total()-from.total())
	s.check(t, c, from, want)
	closeB(t, b)
}

// testConcurrentAppends: appends from several goroutines at once keep
// each key's order.
func (s *suite) testConcurrentAppends(t *testing.T) {
	_, b := s.open(t, Options{})
	const workers, requests = 6, 20
	var wg sync.WaitGroup
	wants := make([]counter, workers)
	errs := make(chan error, workers)
	for w := range workers {
		wants[w] = counter{}
		wg.Go(func() {
			l := lanes[w%len(lanes)]
			keys := []string{"g" + strconv.Itoa(w) + ":a", "g" + strconv.Itoa(w) + ":b"}
			for range requests {
				var recs []storage.Record
				for _, k := range keys {
					for range 2 {
						wants[w][id(l, k)]++
						recs = append(recs, rec(k, wants[w][id(l, k)]))
					}
				}
				if err := b.Append(bg(t), request(l, recs)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Read while they append.
	c := newCollector(nil)
	run := start(b, c)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("append: %v", err)
	}
	want := counter{}
	for _, w := range wants {
		for k, v := range w {
			want[k] = v
		}
	}
	s.waitCount(t, c, want.total())
	run.stop(t)
	s.check(t, c, counter{}, want)
	closeB(t, b)
}

// testDeadLetters: dead letters keep their lane, reason, answer and
// record, are listed by increasing ID with filters and paging, survive a
// restart, and go on DeleteDead.
func (s *suite) testDeadLetters(t *testing.T) {
	open, b := s.open(t, Options{})
	ctx := bg(t)
	accepted := time.UnixMilli(1_700_000_000_000)
	dls := []storage.DeadLetter{
		{Lane: lanes[0], Reason: "invalid_fields", Answer: []byte("HTTP 400: bad"), Accepted: accepted, Died: accepted.Add(time.Second), Record: rec("d:a", 1)},
		{Lane: lanes[1], Reason: "silenced", Answer: []byte("HTTP 400: silenced"), Accepted: accepted, Died: accepted.Add(time.Second), Record: rec("d:b", 1)},
		{Lane: lanes[0], Reason: "silenced", Accepted: accepted, Died: accepted.Add(2 * time.Second), Record: rec("d:c", 1)},
	}
	if err := b.PutDead(ctx, dls[:1]); err != nil {
		t.Fatal(err)
	}
	if err := b.PutDead(ctx, dls[1:]); err != nil {
		t.Fatal(err)
	}
	for i := range dls {
		if dls[i].ID == 0 || i > 0 && dls[i].ID <= dls[i-1].ID {
			t.Fatalf("dead-letter ids %d, %d, %d: not set or not increasing", dls[0].ID, dls[1].ID, dls[2].ID)
		}
	}
	list := func(b storage.Backend, f storage.DeadFilter, after uint64, limit int) []storage.DeadLetter {
		t.Helper()
		got, err := b.ListDead(ctx, f, after, limit)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	same := func(got []storage.DeadLetter, want ...storage.DeadLetter) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("listed %d dead letters, want %d", len(got), len(want))
		}
		for i := range want {
			g, w := got[i], want[i]
			if g.ID != w.ID || g.Lane != w.Lane || g.Reason != w.Reason || string(g.Answer) != string(w.Answer) ||
				!g.Accepted.Equal(w.Accepted) || !g.Died.Equal(w.Died) ||
				string(g.Record.Data) != string(w.Record.Data) || string(g.Record.OrderKey) != string(w.Record.OrderKey) ||
				string(g.Record.UserID) != string(w.Record.UserID) {
				t.Errorf("dead letter %d listed as %+v, want %+v", i, g, w)
			}
		}
	}
	same(list(b, storage.DeadFilter{}, 0, 100), dls...)
	same(list(b, storage.DeadFilter{Reason: "silenced"}, 0, 100), dls[1], dls[2])
	same(list(b, storage.DeadFilter{Lane: &lanes[0]}, 0, 100), dls[0], dls[2])
	same(list(b, storage.DeadFilter{}, dls[0].ID, 1), dls[1])
	closeB(t, b)

	b = open(t, Options{})
	same(list(b, storage.DeadFilter{}, 0, 100), dls...)
	if err := b.DeleteDead(ctx, []uint64{dls[1].ID, dls[2].ID + 1000}); err != nil {
		t.Fatal(err)
	}
	same(list(b, storage.DeadFilter{}, 0, 100), dls[0], dls[2])
	// Ids are never reused.
	more := []storage.DeadLetter{{Lane: lanes[2], Reason: "x", Accepted: accepted, Died: accepted, Record: rec("d:d", 1)}}
	if err := b.PutDead(ctx, more); err != nil {
		t.Fatal(err)
	}
	if more[0].ID <= dls[2].ID {
		t.Errorf("dead letter after a restart got id %d, not above %d", more[0].ID, dls[2].ID)
	}
	closeB(t, b)

	b = open(t, Options{})
	same(list(b, storage.DeadFilter{}, 0, 100), dls[0], dls[2], more[0])
	closeB(t, b)
}

// testAllOrNothing: a request refused for space fails with ErrFull and
// nothing of it is ever read, while requests before and after it are.
func (s *suite) testAllOrNothing(t *testing.T) {
	const quota = 64 << 10
	open, b := s.open(t, Options{MaxBytes: quota})
	want := counter{}
	appendN(t, b, want, lanes[0], 1, "d:a")
	// Over the quota as a whole, spread over many keys (partitions), each
	// record well under it.
	var recs []storage.Record
	for k := range 16 {
		key := "big:" + strconv.Itoa(k)
		r := rec(key, 1)
		r.Data = append(r.Data, make([]byte, quota/8)...)
		recs = append(recs, r)
	}
	err := b.Append(bg(t), request(lanes[0], recs))
	if err == nil {
		t.Fatal("append over the quota succeeded")
	}
	if !errors.Is(err, storage.ErrFull) {
		t.Fatalf("append over the quota: %v, want one matching storage.ErrFull", err)
	}
	appendN(t, b, want, lanes[0], 1, "d:a")
	closeB(t, b)

	// Read after a restart, behind a marker of every key of the refused
	// request: had any of it been stored, it would be read before its
	// key's marker (and its number, 1 plus padding, reads as 0).
	b = open(t, Options{MaxBytes: quota})
	keys := []string{"d:a"}
	for _, r := range recs {
		keys = append(keys, string(r.OrderKey))
	}
	appendN(t, b, want, lanes[0], 1, keys...)
	c := s.readN(t, b, want.total())
	s.check(t, c, counter{}, want)
	closeB(t, b)
}

// testCrash: after a crash, every record not acknowledged comes back in
// order, in front of what is appended after; an acknowledged one may come
// back only if its ack was the last thing before the crash (so each key's
// records read again start at most at its first unacknowledged one).
func (s *suite) testCrash(t *testing.T) {
	open, b := s.open(t, Options{})
	cr, ok := crasher(b)
	if !ok {
		closeB(t, b)
		t.Skip("the backend cannot crash in-process (see Crasher)")
	}
	want := counter{}
	for range 4 {
		for _, l := range lanes {
			appendN(t, b, want, l, 1, "d:a", "d:b")
		}
	}
	c := newCollector(func(m *storage.Message) bool { return first(m) <= 2 })
	run := start(b, c)
	s.waitCount(t, c, want.total())
	cr.Crash()
	run.stop(t)

	b = open(t, Options{})
	for range 2 {
		for _, l := range lanes {
			appendN(t, b, want, l, 1, "d:a", "d:b")
		}
	}
	c = newCollector(nil)
	run = start(b, c)
	from := counter{}
	for k := range want {
		from[k] = 2
	}
	s.waitLast(t, c, want)
	run.stop(t)
	// Each key: a run n..want ending at the last appended, n <= 3.
	c.mu.Lock()
	for k, n := range want {
		got := c.got[k]
		if len(got) == 0 || got[0] > from[k]+1 {
			t.Errorf("%s: read %v after the crash, want from at most %d to %d", k, got, from[k]+1, n)
			continue
		}
		for i, v := range got {
			if v != got[0]+i {
				t.Errorf("%s: read %v after the crash: not in order", k, got)
				break
			}
		}
		if got[len(got)-1] != n {
			t.Errorf("%s: read %v after the crash, want up to %d", k, got, n)
		}
	}
	c.mu.Unlock()
	closeB(t, b)
}

// testDamaged: a record that fails its checksum when read becomes a dead
// letter with reason damaged (never handed to deliver), and the records of
// its lane after it are read, in order.
func (s *suite) testDamaged(t *testing.T) {
	if s.cfg.Damage == nil {
		t.Skip("the backend has no way to damage a record (Config.Damage)")
	}
	open, b := s.open(t, Options{})
	want := counter{}
	appendN(t, b, want, lanes[0], 1, "d:a", "d:b")
	appendN(t, b, want, lanes[1], 1, "d:a")
	// The damaged request holds one record of key d:a (a backend may split
	// a request by key), marked.
	marker := []byte("damage-me-0123456789")
	r := rec("d:a", 0)
	r.Data = append(append(r.Data, '/'), marker...)
	if err := b.Append(bg(t), request(lanes[0], []storage.Record{r})); err != nil {
		t.Fatal(err)
	}
	b = s.cfg.Damage(t, open, b, marker)
	appendN(t, b, want, lanes[0], 1, "d:a", "d:b")
	appendN(t, b, want, lanes[1], 1, "d:a")
	c := newCollector(nil)
	run := start(b, c)
	s.waitLast(t, c, want)
	run.stop(t)
	s.check(t, c, counter{}, want)
	// Its dead letter is durable before its message is acknowledged.
	deadline := time.Now().Add(s.cfg.Wait)
	for {
		dls, err := b.ListDead(bg(t), storage.DeadFilter{Reason: ReasonDamaged}, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(dls) == 1 && dls[0].Lane.Kind == lanes[0].Kind {
			break
		}
		if len(dls) > 1 || time.Now().After(deadline) {
			t.Fatalf("dead letters with reason %s: %+v, want the damaged record's", ReasonDamaged, dls)
		}
		time.Sleep(10 * time.Millisecond)
	}
	closeB(t, b)
}

// testNoSpace: an Append refused for want of space fails with ErrFull and
// stores nothing; once space is back, appends succeed and every record
// stored, before and after, is read in order.
func (s *suite) testNoSpace(t *testing.T) {
	if s.cfg.NoSpace == nil {
		t.Skip("the backend has no way to take its space away (Config.NoSpace)")
	}
	open, fill, free := s.cfg.NoSpace(t)
	b := open(t, Options{})
	want := counter{}
	for range 3 {
		for _, l := range lanes {
			appendN(t, b, want, l, 2, "d:a", "d:b")
		}
	}
	fill()
	// The next record of each key, padded (a store may have room set
	// aside, e.g. a log segment's unused end, that it fills first): stored
	// only when Append says so.
	pad := "/" + strings.Repeat("p", 8<<10)
	next := func(l storage.LaneKey) error {
		recs := []storage.Record{rec("d:a", want[id(l, "d:a")]+1), rec("d:b", want[id(l, "d:b")]+1)}
		for i := range recs {
			recs[i].Data = append(recs[i].Data, pad...)
		}
		err := b.Append(bg(t), request(l, recs))
		if err == nil {
			want[id(l, "d:a")]++
			want[id(l, "d:b")]++
		}
		return err
	}
	// Append until it refuses, a bounded number of times.
	var err error
	for i := 0; err == nil; i++ {
		if i == 10_000 {
			t.Fatal("10,000 appends taken on a full store")
		}
		err = next(lanes[i%len(lanes)])
	}
	if !errors.Is(err, storage.ErrFull) {
		t.Fatalf("append without space: %v, want one matching storage.ErrFull", err)
	}
	free()
	// The store may need a moment to see the space (the local spool's
	// checkpoints move what its log held meanwhile).
	deadline := time.Now().Add(s.cfg.Wait)
	for range 3 {
		for _, l := range lanes {
			for {
				err := next(l)
				if err == nil {
					break
				}
				if !errors.Is(err, storage.ErrFull) || time.Now().After(deadline) {
					t.Fatalf("append after space came back: %v", err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	c := newCollector(nil)
	run := start(b, c)
	s.waitLast(t, c, want)
	run.stop(t)
	s.check(t, c, counter{}, want)
	closeB(t, b)
}
