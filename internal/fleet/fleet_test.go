package fleet

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/svcrelay/relay/internal/natstest"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

// TestFleet runs its cases at once against one real 3-node cluster
// (started once: about 3-5 s), each case in a namespace of its own: most
// of their time is spent waiting on leases, heartbeats and the cluster's
// answers, not on the CPU. The cases that kill nodes are TestFleetNodes'.
func TestFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node NATS cluster")
	}
	t.Parallel()
	// A lease a loaded machine renews in time with the other cases
	// running (a renewal later than LeaseTTL-LeaseMargin gives the
	// partition up, and a case fails with ErrLost); the cases that test
	// leases set their own.
	env := &testEnv{c: natstest.Start(t, natstest.Config{}), leaseTTL: 20 * time.Second}
	env.runParallel(t, []fleetCase{
		{"Dial", env.testDial},
		{"AppendReadAck", env.testAppendReadAck},
		{"Conformance", env.testConformance},
		{"ConcurrentOpen", env.testConcurrentOpen},
		{"Metrics", env.testMetrics},
		{"LeadersSpread", env.testLeadersSpread},
		{"LeadersRebalanced", env.testLeadersRebalanced},
		{"GroupCommit", env.testGroupCommit},
		{"LayoutFound", env.testLayoutFound},
		{"Retention", env.testRetention},
		{"WorkQueueOfBefore", env.testWorkQueueOfBefore},
		{"AllOrNothing", env.testAllOrNothing},
		{"Dedup", env.testDedup},
		{"Full", env.testFull},
		{"DeadLetters", env.testDeadLetters},
		{"Pauses", env.testPauses},
		{"PauseOnTakeOver", env.testPauseOnTakeOver},
		{"PauseUnstoredHoldsLease", env.testPauseUnstoredHoldsLease},
		{"PartitionsFixed", env.testPartitionsFixed},
		{"KeepAlive", env.testKeepAlive},
		{"Nak", env.testNak},
		{"Removal", env.testRemoval},
		{"RemovalNak", env.testRemovalNak},
		{"AckWithoutConsumer", env.testAckWithoutConsumer},
		{"AckLater", env.testAckLater},
		{"RecentRead", env.testRecentRead},
		{"Spill", env.testSpill},
		{"SpillStepDown", env.testSpillStepDown},
		{"RelayRestart", env.testRelayRestart},
		{"LeaseStolen", env.testLeaseStolen},
		{"KindMembers", env.testKindMembers},
		{"Failover", env.testFailover},
	})
}

// TestFleetNodes runs the cases that kill and restart nodes, one at a
// time, on a cluster of their own (beside TestFleet's).
func TestFleetNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node NATS cluster")
	}
	t.Parallel()
	env := &testEnv{c: natstest.Start(t, natstest.Config{})}
	// First, on the fresh cluster: a node killed then re-elects only its
	// own few groups.
	t.Run("ConsumerNodeGone", env.testConsumerNodeGone)
	t.Run("NodeRestart", env.testNodeRestart)
	t.Run("NoQuorum", env.testNoQuorum)
	t.Run("PauseStoredLater", env.testPauseStoredLater)
}

type fleetCase struct {
	name string
	run  func(*testing.T)
}

// runParallel runs the cases as parallel subtests of t.
func (e *testEnv) runParallel(t *testing.T, cases []fleetCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t)
		})
	}
}

type testEnv struct {
	c        *natstest.Cluster
	ns       atomic.Int64
	leaseTTL time.Duration // open's default Config.LeaseTTL; zero: the package's
}

// namespace returns a fresh namespace for a case.
func (e *testEnv) namespace() string {
	return "T" + strconv.FormatInt(e.ns.Add(1), 10)
}

func (e *testEnv) connect(t *testing.T) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(e.c.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func (e *testEnv) open(t *testing.T, nc *nats.Conn, cfg Config) *Fleet {
	t.Helper()
	if cfg.PublishTimeout == 0 {
		// Not the default 10 s: a loaded machine's cluster can take longer
		// to acknowledge a publish, and a test that does not test the
		// time-out must not fail on it.
		cfg.PublishTimeout = polltest.Max
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = e.leaseTTL
	}
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	defer cancel()
	var log *zap.Logger
	if os.Getenv("FLEET_TEST_LOG") != "" {
		log = zaptest.NewLogger(t)
	}
	f, err := Open(ctx, nc, cfg, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func bg(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*polltest.Max)
	t.Cleanup(cancel)
	return ctx
}

var lane = storage.LaneKey{Kind: storage.KindEvents, APIKey: "key-1"}

// rec is record n of key k; its data is "k/n".
func rec(k string, n int) storage.Record {
	return storage.Record{OrderKey: []byte(k), Data: []byte(k + "/" + strconv.Itoa(n))}
}

func parse(r storage.Record) (string, int) {
	k, n, _ := strings.Cut(string(r.Data), "/")
	i, _ := strconv.Atoi(n)
	return k, i
}

// collector records what a deliver function read, per key in order.
type collector struct {
	mu   sync.Mutex
	got  map[string][]int
	set  map[string]bool // "key/n" read
	msgs int
	own  *owners
}

// owners counts the deliver calls running at once per partition, across
// the relays whose collectors share it.
type owners struct {
	mu  sync.Mutex
	now map[slot]int
	max int
}

func newCollector() *collector {
	return &collector{got: make(map[string][]int), set: make(map[string]bool), own: &owners{now: make(map[slot]int)}}
}

func (c *collector) add(m *Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs++
	for _, r := range m.Records {
		k, n := parse(r)
		c.got[k] = append(c.got[k], n)
		c.set[string(r.Data)] = true
	}
}

func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.got {
		n += len(v)
	}
	return n
}

// deliver reads and acks everything (ack(m) false: holds m unacknowledged).
func (c *collector) deliver(ack func(*Message) bool) DeliverFunc {
	return func(ctx context.Context, p *Partition) error {
		s := slot{p.Kind(), p.ID()}
		o := c.own
		o.mu.Lock()
		o.now[s]++
		o.max = max(o.max, o.now[s])
		o.mu.Unlock()
		defer func() {
			o.mu.Lock()
			o.now[s]--
			o.mu.Unlock()
		}()
		for {
			m, err := p.Next(ctx)
			if err != nil {
				return err
			}
			c.add(m)
			if ack == nil || ack(m) {
				if err := p.Ack(ctx, m); err != nil {
					return err
				}
			}
		}
	}
}

// run runs f.Run in the background until the returned stop is called.
func run(f *Fleet, deliver DeliverFunc) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Run(ctx, deliver)
	}()
	return func() { cancel(); <-done }
}

// runEvents is run with deliver called for the events stream's partitions
// only; the other kinds' partitions are held, untouched, until stop.
func runEvents(f *Fleet, deliver DeliverFunc) (stop func()) {
	return run(f, func(ctx context.Context, p *Partition) error {
		if p.Kind() != storage.KindEvents {
			<-ctx.Done()
			return nil
		}
		return deliver(ctx, p)
	})
}

// waitFor polls cond every 20 ms for at most d.
// waitFor polls cond until it holds. d is how long it takes on a quiet
// machine at most; the bound is never below polltest.Max, so that a loaded
// machine (two CPU hogs beside the race detector and a NATS cluster) does
// not fail a test whose outcome only comes late.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	d = max(d, polltest.Max)
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// streamMsgs is the messages held by kind k's streams.
func streamMsgs(t *testing.T, f *Fleet, k storage.Kind) uint64 {
	t.Helper()
	var n uint64
	for g := range f.cfg.Streams {
		s, err := f.js.Stream(bg(t), f.n.stream(k, g))
		if err != nil {
			t.Fatal(err)
		}
		n += s.CachedInfo().State.Msgs
	}
	return n
}

// checkOrder fails unless each key's records were read exactly once each,
// 1..want[key] in order.
func checkOrder(t *testing.T, got map[string][]int, want map[string]int) {
	t.Helper()
	for k, n := range want {
		vs := got[k]
		if len(vs) != n {
			t.Errorf("key %s: read %d records, want %d", k, len(vs), n)
		}
		for i, v := range vs {
			if v != i+1 {
				t.Errorf("key %s: record %d read as number %d", k, v, i+1)
				break
			}
		}
	}
}

func (e *testEnv) testDial(t *testing.T) {
	nc, err := Dial(ConnConfig{Servers: e.c.URLs()[:1]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// The client learned the other servers from the cluster.
	waitFor(t, 10*time.Second, "the other servers discovered", func() bool { return len(nc.Servers()) >= e.c.Len() })
	if _, err := Dial(ConnConfig{Servers: e.c.URLs(), CredsFile: t.TempDir() + "/none.creds"}, nil); err == nil {
		t.Error("dial with a missing credentials file succeeded")
	}
	if _, err := Dial(ConnConfig{Servers: e.c.URLs(), TLSCertFile: "x"}, nil); err == nil {
		t.Error("dial with a certificate but no key succeeded")
	}
}

func (e *testEnv) testAppendReadAck(t *testing.T) {
	nc := e.connect(t)
	f := e.open(t, nc, Config{Namespace: e.namespace(), Partitions: 4})
	ctx := bg(t)
	want := map[string]int{}
	// 30 requests of 5 keys, 3 records each: each request spans several
	// partitions (an atomic batch) or one (a single publish).
	for r := range 30 {
		var recs []storage.Record
		for k := range 1 + r%5 {
			key := "d:" + strconv.Itoa(k)
			for range 3 {
				want[key]++
				recs = append(recs, rec(key, want[key]))
			}
		}
		if err := f.Append(ctx, Request{Lane: lane, Records: recs}); err != nil {
			t.Fatal(err)
		}
	}
	total := 0
	for _, n := range want {
		total += n
	}
	col := newCollector()
	stop := run(f, col.deliver(nil))
	waitFor(t, 20*time.Second, "every record read", func() bool { return col.count() >= total })
	waitFor(t, 10*time.Second, "stream empty after acks", func() bool { return streamMsgs(t, f, storage.KindEvents) == 0 })
	stop()
	if col.count() != total {
		t.Errorf("read %d records, want %d", col.count(), total)
	}
	checkOrder(t, col.got, want)
	if col.own.max != 1 {
		t.Errorf("a partition had %d readers at once", col.own.max)
	}
	// The lane and the acceptance time travel with the message.
	if err := f.Append(ctx, Request{Lane: storage.LaneKey{Kind: storage.KindEvents, APIKey: "k2", Options: `{"min_id_length":1}`}, Accepted: time.UnixMilli(1234567), Records: []storage.Record{{OrderKey: []byte("u:x"), UserID: []byte("x"), Data: []byte("{}")}}}); err != nil {
		t.Fatal(err)
	}
	var got *Message
	var mu sync.Mutex
	stop = run(f, func(ctx context.Context, p *Partition) error {
		m, err := p.Next(ctx)
		if err != nil {
			return err
		}
		mu.Lock()
		got = m
		mu.Unlock()
		return p.Ack(ctx, m)
	})
	waitFor(t, 20*time.Second, "the message read", func() bool { mu.Lock(); defer mu.Unlock(); return got != nil })
	stop()
	if got.Lane.APIKey != "k2" || got.Lane.Options != `{"min_id_length":1}` || got.Accepted.UnixMilli() != 1234567 ||
		string(got.Records[0].UserID) != "x" || got.Partition != PartitionOf([]byte("u:x"), 4) {
		t.Errorf("message %+v", got)
	}
}

// gauge returns the value of a metric (summed over its series; a
// histogram's count), -1 when absent.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		v := 0.0
		for _, m := range mf.GetMetric() {
			switch {
			case m.Gauge != nil:
				v += m.GetGauge().GetValue()
			case m.Counter != nil:
				v += m.GetCounter().GetValue()
			case m.Histogram != nil:
				v += float64(m.GetHistogram().GetSampleCount())
			}
		}
		return v
	}
	return -1
}

func (e *testEnv) testMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	ctx := bg(t)
	f, err := Open(ctx, e.connect(t), Config{Namespace: e.namespace(), Partitions: 2, LeaseTTL: e.leaseTTL}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec("d:a", 1)}}); err != nil {
		t.Fatal(err)
	}
	if got := gauge(t, reg, "relay_fleet_append_seconds"); got != 1 {
		t.Errorf("append_seconds count %v, want 1", got)
	}
	read := make(chan *Message, 1)
	var held *Partition
	var mu sync.Mutex
	stop := run(f, func(ctx context.Context, p *Partition) error {
		if p.Kind() == storage.KindEvents {
			m, err := p.Next(ctx)
			if err != nil {
				return err
			}
			mu.Lock()
			held = p
			mu.Unlock()
			select {
			case read <- m:
			case <-ctx.Done(): // read again after a lost lease: the test failed
			}
		}
		<-ctx.Done()
		return nil
	})
	defer stop()
	var m *Message
	select {
	case m = <-read:
	case <-time.After(polltest.Max):
		t.Fatal("nothing read")
	}
	waitFor(t, 30*time.Second, "every partition owned", func() bool { return gauge(t, reg, "relay_fleet_partitions_owned") == 6 })
	if got := gauge(t, reg, "relay_fleet_messages_held"); got != 1 {
		t.Errorf("messages_held %v with one message read, want 1", got)
	}
	waitFor(t, 10*time.Second, "the backlog shows the message", func() bool { return gauge(t, reg, "relay_fleet_partition_backlog") == 1 })
	mu.Lock()
	p := held
	mu.Unlock()
	if err := p.Ack(ctx, m); err != nil {
		t.Fatal(err)
	}
	if got := gauge(t, reg, "relay_fleet_messages_held"); got != 0 {
		t.Errorf("messages_held %v after the ack, want 0", got)
	}
	waitFor(t, 10*time.Second, "the backlog empties", func() bool { return gauge(t, reg, "relay_fleet_partition_backlog") == 0 })
	stop()
	if got := gauge(t, reg, "relay_fleet_partitions_owned"); got != 0 {
		t.Errorf("partitions_owned %v after Run returned", got)
	}
}

func (e *testEnv) testAllOrNothing(t *testing.T) {
	nc := e.connect(t)
	// The stream takes messages up to MaxMessageBytes+1024; a record far
	// larger goes alone into a message the server refuses.
	f := e.open(t, nc, Config{Namespace: e.namespace(), Partitions: 8, MaxMessageBytes: 4096})
	ctx := bg(t)
	var recs []storage.Record
	for k := range 8 {
		recs = append(recs, rec("d:"+strconv.Itoa(k), 1))
	}
	recs = append(recs, storage.Record{OrderKey: []byte("d:big"), Data: make([]byte, 64<<10)})
	err := f.Append(ctx, Request{Lane: lane, Records: recs})
	if err == nil {
		t.Fatal("append with a message the stream refuses succeeded")
	}
	if n := streamMsgs(t, f, storage.KindEvents); n != 0 {
		t.Fatalf("a refused request left %d messages in the stream", n)
	}
	// Without the big record, the same request is stored whole; a record
	// larger than MaxMessageBytes but within the stream's limit splits.
	recs = recs[:8]
	recs = append(recs, storage.Record{OrderKey: []byte("d:0"), Data: make([]byte, 3000)}, storage.Record{OrderKey: []byte("d:0"), Data: make([]byte, 3000)})
	if err := f.Append(ctx, Request{Lane: lane, Records: recs}); err != nil {
		t.Fatal(err)
	}
	parts := map[int]bool{}
	for _, r := range recs[:8] {
		parts[PartitionOf(r.OrderKey, 8)] = true
	}
	if n := streamMsgs(t, f, storage.KindEvents); n != uint64(len(parts)+1) {
		t.Fatalf("stream holds %d messages, want %d (one per partition, one more for d:0's split)", n, len(parts)+1)
	}
}

func (e *testEnv) testDedup(t *testing.T) {
	nc := e.connect(t)
	f := e.open(t, nc, Config{Namespace: e.namespace(), Partitions: 4})
	ctx := bg(t)
	one := Request{ID: "req-1", Lane: lane, Records: []storage.Record{rec("d:a", 1), rec("d:a", 2)}}
	var many []storage.Record
	for k := range 6 {
		many = append(many, rec("d:"+strconv.Itoa(k), 1))
	}
	batch := Request{ID: "req-2", Lane: lane, Records: many}
	for range 3 {
		for _, r := range []Request{one, batch} {
			if err := f.Append(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	parts := map[int]bool{}
	for _, r := range many {
		parts[PartitionOf(r.OrderKey, 4)] = true
	}
	if len(parts) < 2 {
		t.Fatal("test needs a request over several partitions")
	}
	if n := streamMsgs(t, f, storage.KindEvents); n != uint64(1+len(parts)) {
		t.Fatalf("stream holds %d messages after three tries of each request, want %d", n, 1+len(parts))
	}
	if err := f.Append(ctx, Request{ID: "bad id!", Lane: lane, Records: many}); err == nil {
		t.Error("a request id with spaces was taken")
	}
	// No id (what the ingest and the form intakes send): a fresh one for
	// each Append, so both are stored.
	for range 2 {
		if err := f.Append(ctx, Request{Lane: lane, Records: one.Records}); err != nil {
			t.Fatal(err)
		}
	}
	if n := streamMsgs(t, f, storage.KindEvents); n != uint64(3+len(parts)) {
		t.Fatalf("stream holds %d messages after two requests without id, want %d", n, 3+len(parts))
	}
}

func (e *testEnv) testFull(t *testing.T) {
	nc := e.connect(t)
	f := e.open(t, nc, Config{Namespace: e.namespace(), Partitions: 2, MaxBytes: 64 << 10})
	ctx := bg(t)
	var err error
	for i := range 100 {
		err = f.Append(ctx, Request{Lane: lane, Records: []storage.Record{{OrderKey: []byte("d:" + strconv.Itoa(i)), Data: make([]byte, 4000)}}})
		if err != nil {
			break
		}
	}
	if !errors.Is(err, ErrFull) {
		t.Fatalf("append to a full stream: %v, want ErrFull", err)
	}
	if errors.Is(err, ErrUnavailable) {
		t.Error("a full stream also reported as unavailable")
	}
}

func (e *testEnv) testDeadLetters(t *testing.T) {
	nc := e.connect(t)
	ns := e.namespace()
	f := e.open(t, nc, Config{Namespace: ns, Partitions: 2})
	ctx := bg(t)
	now := time.Now().Truncate(time.Millisecond)
	gi := storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: "k"}
	dls := []storage.DeadLetter{
		{Lane: lane, Reason: "silenced", Answer: []byte(`{"code":400}`), Accepted: now, Died: now, Record: rec("d:a", 1)},
		{Lane: lane, Reason: "expired", Accepted: now, Died: now, Record: rec("d:a", 2)},
		{Lane: gi, Reason: "invalid_fields", Accepted: now, Died: now, Record: rec("g:x", 1)},
	}
	if err := f.PutDead(ctx, dls); err != nil {
		t.Fatal(err)
	}
	if !(dls[0].ID < dls[1].ID && dls[1].ID < dls[2].ID) {
		t.Fatalf("ids %d %d %d: want increasing", dls[0].ID, dls[1].ID, dls[2].ID)
	}
	// A retried PutDead stores nothing new.
	again := append([]storage.DeadLetter(nil), dls...)
	if err := f.PutDead(ctx, again); err != nil {
		t.Fatal(err)
	}
	// Another relay lists them.
	g := e.open(t, e.connect(t), Config{Namespace: ns, Partitions: 2})
	all, err := g.ListDead(ctx, storage.DeadFilter{}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 || again[0].ID != dls[0].ID {
		t.Fatalf("listed %d dead letters (retry got id %d, first %d), want 3", len(all), again[0].ID, dls[0].ID)
	}
	if d := all[0]; d.Reason != "silenced" || string(d.Answer) != `{"code":400}` || d.Lane != lane || !d.Accepted.Equal(now) ||
		string(d.Record.Data) != "d:a/1" || string(d.Record.OrderKey) != "d:a" {
		t.Errorf("dead letter read back as %+v", d)
	}
	for _, c := range []struct {
		f     storage.DeadFilter
		after uint64
		limit int
		want  int
	}{
		{storage.DeadFilter{Lane: &gi}, 0, 0, 1},
		{storage.DeadFilter{Reason: "expired"}, 0, 0, 1},
		{storage.DeadFilter{}, dls[0].ID, 0, 2},
		{storage.DeadFilter{}, 0, 2, 2},
		{storage.DeadFilter{Lane: &lane}, 0, 0, 2},
	} {
		got, err := g.ListDead(ctx, c.f, c.after, c.limit)
		if err != nil || len(got) != c.want {
			t.Errorf("ListDead(%+v, %d, %d): %d, %v; want %d", c.f, c.after, c.limit, len(got), err, c.want)
		}
	}
	if err := g.DeleteDead(ctx, []uint64{dls[1].ID, 999999}); err != nil {
		t.Fatal(err)
	}
	all, err = f.ListDead(ctx, storage.DeadFilter{}, 0, 0)
	if err != nil || len(all) != 2 || all[1].ID != dls[2].ID {
		t.Fatalf("after delete: %v %v", all, err)
	}
}

func (e *testEnv) testPauses(t *testing.T) {
	ns := e.namespace()
	a := e.open(t, e.connect(t), Config{Namespace: ns, Partitions: 2})
	b := e.open(t, e.connect(t), Config{Namespace: ns, Partitions: 2})
	ctx := bg(t)
	// Long enough that no stall of a loaded machine ends it (nor its key's
	// TTL in the bucket) before the checks below; the expiry is checked
	// with a pause of its own at the end.
	until := time.Now().Add(time.Minute)
	key := []byte("d:device with spaces/and ünïcode")
	if err := a.Pause(ctx, key, until); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.PausedUntil(key); !ok {
		t.Fatal("the pausing relay does not see its pause")
	}
	waitFor(t, 5*time.Second, "the other relay sees the pause", func() bool {
		u, ok := b.PausedUntil(key)
		return ok && u.UnixMilli() == until.UnixMilli()
	})
	if _, ok := b.PausedUntil([]byte("d:other")); ok {
		t.Error("an unpaused key is paused")
	}
	// A shorter pause does not shorten it.
	if err := b.Pause(ctx, key, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if u, _ := a.PausedUntil(key); u.UnixMilli() != until.UnixMilli() {
		t.Errorf("pause shortened to %v", u)
	}
	// Nor does it from a relay that has not seen the longer one yet: the
	// stored pause is compared, not overwritten.
	b.pause.mu.Lock()
	clear(b.pause.until)
	b.pause.mu.Unlock()
	if err := b.Pause(ctx, key, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if e, err := a.pause.kv.Get(ctx, pauseKey(key)); err != nil || int64(binary.BigEndian.Uint64(e.Value())) != until.UnixMilli() {
		t.Fatalf("stored pause after a shorter one from a stale relay: %v", err)
	}
	// A relay opened later sees the pause at once (Open waits for the
	// bucket's current values).
	c := e.open(t, e.connect(t), Config{Namespace: ns, Partitions: 2})
	if _, ok := c.PausedUntil(key); !ok {
		t.Error("a relay opened during the pause does not see it")
	}
	short := []byte("d:short")
	if err := a.Pause(ctx, short, time.Now().Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the pause ends", func() bool { _, ok := a.PausedUntil(short); return !ok })
	// The key is gone from the bucket (per-key TTL), not just past its time.
	waitFor(t, 10*time.Second, "the pause's key expires in the bucket", func() bool {
		_, err := a.pause.kv.Get(ctx, pauseKey(short))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
}

// testPauseOnTakeOver: a relay taking a partition over knows the pauses
// stored before it sends, even those its watcher has not delivered (its
// consumer lost with a node, and made again only after missed heartbeats).
func (e *testEnv) testPauseOnTakeOver(t *testing.T) {
	ns := e.namespace()
	a := e.open(t, e.connect(t), Config{Namespace: ns, Partitions: 1})
	b := e.open(t, e.connect(t), Config{Namespace: ns, Partitions: 1})
	key := []byte("d:paused by the previous owner")
	if err := a.Pause(bg(t), key, time.Now().Add(2*polltest.Max)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the watcher delivers the pause", func() bool { _, ok := b.PausedUntil(key); return ok })
	// As if b's watcher had lagged: b forgets what it delivered.
	b.pause.mu.Lock()
	clear(b.pause.until)
	b.pause.mu.Unlock()
	seen := make(chan bool, 1)
	stop := runEvents(b, func(ctx context.Context, p *Partition) error {
		_, ok := b.PausedUntil(key)
		select {
		case seen <- ok:
		default:
		}
		<-ctx.Done()
		return nil
	})
	defer stop()
	select {
	case ok := <-seen:
		if !ok {
			t.Error("a partition was handed to deliver before the stored pause of one of its keys was known")
		}
	case <-time.After(polltest.Max):
		t.Fatal("no partition taken")
	}
}

// testPauseUnstoredHoldsLease: a relay with a pause not stored yet does
// not hand a partition over (it would go to a relay that cannot know the
// pause) until the pause is stored.
func (e *testEnv) testPauseUnstoredHoldsLease(t *testing.T) {
	ns := e.namespace()
	// A lease a loaded machine still renews in time (a renewal later than
	// LeaseTTL-LeaseMargin gives it up, and b would take it).
	cfg := Config{Namespace: ns, Partitions: 2, LeaseTTL: 15 * time.Second}
	a := e.open(t, e.connect(t), cfg)
	var aOwned, bOwned atomic.Int32
	ended := make(chan string, 4)
	count := func(n *atomic.Int32, ended chan string) DeliverFunc {
		return func(ctx context.Context, p *Partition) error {
			n.Add(1)
			<-ctx.Done()
			n.Add(-1)
			if ended != nil {
				ended <- strconv.Itoa(p.ID())
			}
			return nil
		}
	}
	stopA := runEvents(a, count(&aOwned, ended))
	defer stopA()
	waitFor(t, 10*time.Second, "a owns both partitions", func() bool { return aOwned.Load() == 2 })
	// A pause a could not store (as after a failed write; no rewrite is
	// kicked, so it stays unstored until the test stores it).
	key := []byte("d:unstored")
	until := time.Now().Add(2 * polltest.Max)
	a.pause.mu.Lock()
	a.pause.unsaved[pauseKey(key)] = until
	a.pause.mu.Unlock()
	b := e.open(t, e.connect(t), cfg)
	stopB := runEvents(b, count(&bOwned, nil))
	defer stopB()
	var gone string
	select {
	case gone = <-ended:
	case <-time.After(polltest.Max):
		t.Fatal("a gave no partition up to b")
	}
	// Three heartbeats: b would have taken it within one.
	time.Sleep(cfg.LeaseTTL)
	if n := bOwned.Load(); n != 0 {
		t.Errorf("b took %d partition(s) (a gave up %s) while a pause of a was not stored", n, gone)
	}
	if err := a.pause.write(bg(t), pauseKey(key), until, false); err != nil {
		t.Fatal(err)
	}
	a.pause.mu.Lock()
	delete(a.pause.unsaved, pauseKey(key))
	a.pause.mu.Unlock()
	waitFor(t, 10*time.Second, "b takes the partition once the pause is stored", func() bool { return bOwned.Load() == 1 })
}

// testPauseStoredLater: a pause that cannot be stored (no quorum) holds
// on the relay at once and reaches the bucket once the cluster is back,
// for any relay to see.
func (e *testEnv) testPauseStoredLater(t *testing.T) {
	ns := e.namespace()
	a := e.open(t, e.connect(t), Config{Namespace: ns, Partitions: 1, PublishTimeout: 2 * time.Second})
	key := []byte("d:paused without a quorum")
	down := []int{0, 1}
	for _, i := range down {
		e.c.Kill(i)
	}
	if err := a.Pause(bg(t), key, time.Now().Add(2*polltest.Max)); err == nil {
		t.Error("a pause stored without a quorum")
	}
	if _, ok := a.PausedUntil(key); !ok {
		t.Error("a pause not stored does not hold on its relay")
	}
	if !a.pause.unwritten() {
		t.Error("a pause not stored is not marked so")
	}
	for _, i := range down {
		e.c.Restart(i)
	}
	waitFor(t, 30*time.Second, "the pause stored once the cluster is back", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := a.pause.kv.Get(ctx, pauseKey(key))
		return err == nil && !a.pause.unwritten()
	})
}

func (e *testEnv) testPartitionsFixed(t *testing.T) {
	nc := e.connect(t)
	ns := e.namespace()
	e.open(t, nc, Config{Namespace: ns, Partitions: 4})
	ctx := bg(t)
	_, err := Open(ctx, nc, Config{Namespace: ns, Partitions: 8}, nil, nil)
	if !errors.Is(err, ErrPartitions) {
		t.Fatalf("open with another partition count: %v, want ErrPartitions", err)
	}
}

// testKeepAlive: a message held (not acknowledged, as a paused key's is)
// past AckWait is not delivered again while its owner holds it, and does
// not hold back the next message of its partition (another key's).
func (e *testEnv) testKeepAlive(t *testing.T) {
	// AckWait 8 s: keep-alives every 2.7 s, so only a stall of over 5.3 s
	// on a loaded machine could cause a redelivery (at 4 s, one of 2.6 s).
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1, AckWait: 8 * time.Second})
	ctx := bg(t)
	for _, k := range []string{"d:paused", "d:other"} {
		if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec(k, 1)}}); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		held, other, again *Message
		err                error
	}
	res := make(chan result, 1)
	stop := runEvents(f, func(ctx context.Context, p *Partition) error {
		var r result
		defer func() { res <- r }()
		if r.held, r.err = p.Next(ctx); r.err != nil {
			return r.err
		}
		if r.other, r.err = p.Next(ctx); r.err != nil {
			return r.err
		}
		if r.err = p.Ack(ctx, r.other); r.err != nil {
			return r.err
		}
		// Hold the first for 2.5 AckWaits: nothing may come again.
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		r.again, r.err = p.Next(wctx)
		cancel()
		if err := p.Ack(ctx, r.held); err != nil {
			r.err = err
		}
		return nil
	})
	defer stop()
	select {
	case r := <-res:
		if r.held == nil || r.other == nil {
			t.Fatalf("read %v %v: %v", r.held, r.other, r.err)
		}
		if string(r.held.Records[0].OrderKey) != "d:paused" || string(r.other.Records[0].OrderKey) != "d:other" {
			t.Fatalf("read %s then %s", r.held.Records[0].OrderKey, r.other.Records[0].OrderKey)
		}
		if r.again != nil {
			t.Fatalf("held message delivered again (seq %d, delivery %d)", r.again.Seq, r.again.Delivered)
		}
		if !errors.Is(r.err, context.DeadlineExceeded) {
			t.Fatalf("waiting for nothing: %v", r.err)
		}
	case <-time.After(polltest.Max):
		t.Fatal("deliver did not finish")
	}
	waitFor(t, 10*time.Second, "the stream empties", func() bool { return streamMsgs(t, f, storage.KindEvents) == 0 })
}

// testNak: a message given back is read again (after the delay), counted
// as a second delivery.
func (e *testEnv) testNak(t *testing.T) {
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1})
	ctx := bg(t)
	if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec("d:a", 1)}}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		again *Message
		after time.Duration
		err   error
	}
	res := make(chan result, 1)
	stop := runEvents(f, func(ctx context.Context, p *Partition) error {
		var r result
		defer func() { res <- r }()
		m, err := p.Next(ctx)
		if err != nil {
			r.err = err
			return err
		}
		start := time.Now()
		if r.err = p.Nak(m, 500*time.Millisecond); r.err != nil {
			return r.err
		}
		if p.Held() != 0 {
			r.err = fmt.Errorf("%d held after Nak", p.Held())
			return r.err
		}
		r.again, r.err = p.Next(ctx)
		r.after = time.Since(start)
		if r.err == nil {
			r.err = p.Ack(ctx, r.again)
		}
		return r.err
	})
	defer stop()
	select {
	case r := <-res:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.again.Delivered != 2 || string(r.again.Records[0].Data) != "d:a/1" {
			t.Errorf("read again: delivery %d, %s", r.again.Delivered, r.again.Records[0].Data)
		}
		if r.after < 400*time.Millisecond {
			t.Errorf("read again after %v, before its 500ms delay", r.after)
		}
	case <-time.After(polltest.Max):
		t.Fatal("deliver did not finish")
	}
}

// testRelayRestart: a relay stops with a message read and not
// acknowledged; started again, it reads that message first.
func (e *testEnv) testRelayRestart(t *testing.T) {
	ns := e.namespace()
	f := e.open(t, e.connect(t), Config{Namespace: ns, Partitions: 1})
	ctx := bg(t)
	for n := 1; n <= 3; n++ {
		if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec("d:a", n)}}); err != nil {
			t.Fatal(err)
		}
	}
	firstRun := make(chan error, 1)
	stop := runEvents(f, func(ctx context.Context, p *Partition) error {
		m, err := p.Next(ctx)
		if err == nil {
			err = p.Ack(ctx, m) // record 1 done
		}
		if err == nil {
			_, err = p.Next(ctx) // record 2 read, not acknowledged
		}
		firstRun <- err
		<-ctx.Done()
		return nil
	})
	if err := <-firstRun; err != nil {
		t.Fatal(err)
	}
	stop()
	// A new process: a new connection and Fleet.
	g := e.open(t, e.connect(t), Config{Namespace: ns, Partitions: 1})
	col := newCollector()
	stop = run(g, col.deliver(nil))
	defer stop()
	waitFor(t, 20*time.Second, "records 2 and 3 read again", func() bool { return col.count() >= 2 })
	col.mu.Lock()
	defer col.mu.Unlock()
	if got := col.got["d:a"]; len(got) != 2 || got[0] != 2 || got[1] != 3 {
		t.Fatalf("after the restart read %v, want [2 3]", got)
	}
}

// testLeaseStolen: when the lease is taken from its holder (here: deleted
// behind its back, as an expiry would), the holder's deliver context ends
// at its next renewal, and a reader of the reset consumer gets everything
// not acknowledged.
func (e *testEnv) testLeaseStolen(t *testing.T) {
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1, LeaseTTL: 3 * time.Second})
	ctx := bg(t)
	ended := make(chan time.Time, 4)
	started := make(chan struct{}, 4)
	stop := runEvents(f, func(ctx context.Context, p *Partition) error {
		started <- struct{}{}
		<-ctx.Done()
		ended <- time.Now()
		return nil
	})
	defer stop()
	select {
	case <-started:
	case <-time.After(polltest.Max):
		t.Fatal("partition never taken")
	}
	key := slot{storage.KindEvents, 0}.key()
	stolen := time.Now()
	if err := f.kv.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-ended:
		t.Logf("deliver stopped %v after its lease was taken", at.Sub(stolen).Round(time.Millisecond))
	case <-time.After(polltest.Max):
		t.Fatal("deliver never stopped after its lease was taken")
	}
	// The relay takes the partition again (it is still assigned to it).
	select {
	case <-started:
	case <-time.After(polltest.Max):
		t.Fatal("partition not taken again")
	}
}

// testFailover: relays A and B share 4 partitions; A holds some messages
// unacknowledged, then its connection dies. B must take A's partitions
// within bounded time and read, in order, everything not acknowledged:
// per key, nothing lost and never a later record before an earlier one.
func (e *testEnv) testFailover(t *testing.T) {
	ns := e.namespace()
	// AckWait far above the wait below: a take-over that waited for A's
	// unacknowledged messages to expire (the wrong way) cannot pass, however
	// loaded the machine.
	// A 20 s lease: B must keep its own however loaded the machine (a
	// renewal later than LeaseTTL-LeaseMargin resets its consumers, and
	// it reads again what it read, out of the order checked below); A's
	// is taken over about 27 s after A died.
	cfg := Config{Namespace: ns, Partitions: 4, LeaseTTL: 20 * time.Second, AckWait: 10 * time.Minute}
	ncA := e.connect(t)
	a := e.open(t, ncA, Config{Namespace: ns, Partitions: 4, LeaseTTL: 20 * time.Second, AckWait: 10 * time.Minute, Name: "relay-a"})
	cfg.Name = "relay-b"
	b := e.open(t, e.connect(t), cfg)
	ctx := bg(t)

	colA, colB := newCollector(), newCollector()
	colB.own = colA.own // one count of readers per partition across both relays
	// A acknowledges the first half of what it reads and holds the rest.
	var mu sync.Mutex
	readA := 0
	stopA := run(a, colA.deliver(func(*Message) bool {
		mu.Lock()
		defer mu.Unlock()
		readA++
		return readA <= 20
	}))
	defer stopA()
	stopB := run(b, colB.deliver(nil))
	defer stopB()

	// Both relays own partitions: wait until each has read something.
	want := map[string]int{}
	publish := func(n int) {
		for range n {
			var recs []storage.Record
			for k := range 8 {
				key := "d:" + strconv.Itoa(k)
				want[key]++
				recs = append(recs, rec(key, want[key]))
			}
			if err := b.Append(ctx, Request{Lane: lane, Records: recs}); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, 20*time.Second, "both relays own partitions", func() bool {
		publish(1)
		return colA.count() > 0 && colB.count() > 0
	})
	publish(10)
	waitFor(t, 20*time.Second, "A holds messages unacknowledged", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return readA > 25
	})
	// A dies (its connection, as when its process or network goes).
	killed := time.Now()
	ncA.Close()
	publish(5)
	total := 0
	for _, n := range want {
		total += n
	}
	// B reads everything A did not acknowledge, and the rest.
	waitFor(t, 30*time.Second, "B reads every record", func() bool {
		colB.mu.Lock()
		defer colB.mu.Unlock()
		for k, n := range want {
			seen := map[int]bool{}
			for _, v := range colB.got[k] {
				seen[v] = true
			}
			colA.mu.Lock()
			for _, v := range colA.got[k] {
				seen[v] = true
			}
			colA.mu.Unlock()
			if len(seen) < n {
				return false
			}
		}
		return true
	})
	t.Logf("B took over and read everything %v after A died", time.Since(killed))
	// Per key, B's reads are in order (the redelivered ones first).
	colB.mu.Lock()
	for k, vs := range colB.got {
		for i := 1; i < len(vs); i++ {
			if vs[i] <= vs[i-1] {
				t.Errorf("key %s: B read %d after %d", k, vs[i], vs[i-1])
			}
		}
	}
	colB.mu.Unlock()
	// Everything A read but did not ack was read again by B (nothing lost).
	colA.mu.Lock()
	colB.mu.Lock()
	both := 0
	for k := range colA.set {
		if colB.set[k] {
			both++
		}
	}
	if both == 0 {
		t.Error("B read nothing A had read: the failover redelivered nothing, the test tests nothing")
	}
	for k, n := range want {
		seen := map[int]bool{}
		for _, v := range colB.got[k] {
			seen[v] = true
		}
		// A's unacknowledged records are those after its last acknowledged
		// one per partition: check the union covers 1..n and that B's
		// first record of each key is at most A's last + 1.
		for _, v := range colA.got[k] {
			seen[v] = true
		}
		for v := 1; v <= n; v++ {
			if !seen[v] {
				t.Errorf("key %s: record %d lost", k, v)
			}
		}
	}
	colA.own.mu.Lock()
	if colA.own.max > 1 {
		t.Errorf("a partition had %d readers at once across the relays", colA.own.max)
	}
	colA.own.mu.Unlock()
	colB.mu.Unlock()
	colA.mu.Unlock()
	waitFor(t, 10*time.Second, "the stream empties", func() bool { return streamMsgs(t, b, storage.KindEvents) == 0 })
}

// dropStreams deletes every stream (KV buckets included) the earlier cases
// left: a case that kills nodes then waits for the re-election of its own
// streams only, not of a hundred others' (on a loaded 2-core machine the
// re-election of every earlier namespace's raft groups took longer than the
// case's 30 s bound, every run, once the suite had grown).
func (e *testEnv) dropStreams(t *testing.T) {
	t.Helper()
	js, err := jetstream.New(e.connect(t))
	if err != nil {
		t.Fatal(err)
	}
	// Deleting every case's streams so far takes long on a loaded
	// machine (30 s was missed once, at a load average of 30).
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	defer cancel()
	names := js.StreamNames(ctx)
	var all []string
	for n := range names.Name() {
		all = append(all, n)
	}
	if err := names.Err(); err != nil {
		t.Fatalf("list streams: %v", err)
	}
	for _, n := range all {
		if err := js.DeleteStream(ctx, n); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("delete stream %s: %v", n, err)
		}
	}
}

// testNodeRestart appends while the stream's leader is killed and
// restarted: every Append that returned nil is read back.
func (e *testEnv) testNodeRestart(t *testing.T) {
	e.dropStreams(t)
	nc := e.connect(t)
	f := e.open(t, nc, Config{Namespace: e.namespace(), Partitions: 4, PublishTimeout: polltest.Max})
	ctx := bg(t)
	var (
		mu    sync.Mutex
		acked = map[string]int{} // key -> highest acknowledged record
		fails int
	)
	stopPub := make(chan struct{})
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		n := 0
		for i := 0; i < 2000; i++ {
			select {
			case <-stopPub:
				return
			default:
			}
			n++
			var recs []storage.Record
			for k := range 3 {
				recs = append(recs, rec(fmt.Sprintf("d:%d", (i+k)%10), n))
			}
			err := f.Append(ctx, Request{Lane: lane, Records: recs})
			mu.Lock()
			if err == nil {
				for _, r := range recs {
					k, v := parse(r)
					acked[k+"/"+strconv.Itoa(v)]++
				}
			} else {
				fails++
			}
			mu.Unlock()
		}
	}()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }
	waitFor(t, 20*time.Second, "some appends", func() bool { return count() > 30 })
	l := e.c.StreamLeader(f.n.stream(storage.KindEvents, 0))
	if l < 0 {
		t.Fatal("no stream leader")
	}
	e.c.Kill(l)
	before := count()
	waitFor(t, 30*time.Second, "appends go on with a node down", func() bool { return count() > before+30 })
	e.c.Restart(l)
	after := count()
	waitFor(t, 30*time.Second, "appends go on after the restart", func() bool { return count() > after+30 })
	close(stopPub)
	<-pubDone
	mu.Lock()
	t.Logf("%d records acknowledged, %d appends failed", len(acked), fails)
	mu.Unlock()

	col := newCollector()
	stop := run(f, col.deliver(nil))
	defer stop()
	waitFor(t, 30*time.Second, "every acknowledged record read", func() bool {
		col.mu.Lock()
		defer col.mu.Unlock()
		mu.Lock()
		defer mu.Unlock()
		for k := range acked {
			if !col.set[k] {
				return false
			}
		}
		return true
	})
}

// testNoQuorum: with two of three nodes down, Append fails with
// ErrUnavailable within its PublishTimeout (never nil, never ErrFull); once
// the nodes are back, appends succeed again.
func (e *testEnv) testNoQuorum(t *testing.T) {
	e.dropStreams(t)
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 2, PublishTimeout: 3 * time.Second})
	ctx := bg(t)
	one := []storage.Record{rec("d:a", 1)}
	var two []storage.Record
	for k := range 6 {
		two = append(two, rec("d:"+strconv.Itoa(k), 1))
	}
	if err := f.Append(ctx, Request{Lane: lane, Records: one}); err != nil {
		t.Fatal(err)
	}
	down := []int{}
	for i := 0; i < e.c.Len() && len(down) < 2; i++ {
		e.c.Kill(i)
		down = append(down, i)
	}
	for _, recs := range [][]storage.Record{one, two} {
		start := time.Now()
		err := f.Append(ctx, Request{Lane: lane, Records: recs})
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrFull) {
			t.Errorf("append of %d records without a quorum: %v, want ErrUnavailable", len(recs), err)
		}
		// A hang (an append that waits for the quorum) would show here.
		if d := time.Since(start); d > polltest.Max {
			t.Errorf("append without a quorum took %v, PublishTimeout is 3s", d)
		}
	}
	for _, i := range down {
		e.c.Restart(i)
	}
	waitFor(t, 30*time.Second, "appends succeed again", func() bool {
		return f.Append(ctx, Request{Lane: lane, Records: two}) == nil
	})
}

// testConcurrentOpen: two relays opening a fresh namespace at the same
// moment (a Deployment's first rollout) both create the streams and
// buckets, racing, and both open. Before retrySetup, both waited out
// their whole context on the dead-letter stream, every time.
func (e *testEnv) testConcurrentOpen(t *testing.T) {
	ns := e.namespace()
	var wg sync.WaitGroup
	for i := range 2 {
		nc := e.connect(t)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
			defer cancel()
			t0 := time.Now()
			f, err := Open(ctx, nc, Config{Namespace: ns, Partitions: 4}, nil, nil)
			if err != nil {
				t.Errorf("relay %d: Open after %v: %v", i, time.Since(t0).Round(time.Millisecond), err)
				return
			}
			f.Close()
		})
	}
	wg.Wait()
}

// testKindMembers: a relay that delivers some lane kinds only is
// given no partition of the others. Relay A runs events only, B every kind:
// B holds every group identify and user mapping partition, and the events
// partitions are spread over both.
func (e *testEnv) testKindMembers(t *testing.T) {
	ns := e.namespace()
	a := e.open(t, e.connect(t), Config{Namespace: ns, Partitions: 4, LeaseTTL: 2 * time.Second, Name: "relay-a"})
	b := e.open(t, e.connect(t), Config{Namespace: ns, Partitions: 4, LeaseTTL: 2 * time.Second, Name: "relay-b"})
	hold := func(ctx context.Context, _ storage.Reader) error { <-ctx.Done(); return nil }
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { a.Backend().Only(storage.KindEvents).Run(ctx, hold) }) //nolint:errcheck // ends with ctx
	wg.Go(func() { b.Backend().Run(ctx, hold) })                          //nolint:errcheck // ends with ctx
	owner := func(k storage.Kind, p int) string {
		octx, ocancel := context.WithTimeout(context.Background(), polltest.Max)
		defer ocancel()
		e, err := a.kv.Get(octx, slot{k, p}.key())
		if err != nil {
			return ""
		}
		return string(e.Value())
	}
	deadline := time.Now().Add(polltest.Max)
	for {
		var evA, evB, formsB int
		for p := range 4 {
			switch owner(storage.KindEvents, p) {
			case "relay-a":
				evA++
			case "relay-b":
				evB++
			}
			for _, k := range []storage.Kind{storage.KindGroupIdentify, storage.KindUserMap} {
				if owner(k, p) == "relay-b" {
					formsB++
				}
			}
		}
		if evA == 2 && evB == 2 && formsB == 8 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("events: A holds %d, B %d (want 2 each); B holds %d of 8 form partitions", evA, evB, formsB)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leadAll moves the leaders of f's events streams to the cluster's first
// server and returns its name.
func (e *testEnv) leadAll(t *testing.T, f *Fleet) string {
	t.Helper()
	ctx := bg(t)
	target := e.c.Server(0).Name()
	for g := range f.cfg.Streams {
		name := f.n.stream(storage.KindEvents, g)
		waitFor(t, time.Minute, name+" led by "+target, func() bool {
			pl, err := f.Placement(ctx, storage.KindEvents)
			if err != nil || pl.Leaders[name] == "" {
				return false
			}
			if pl.Leaders[name] == target {
				return true
			}
			if err := f.stepDown(ctx, name, target); err != nil {
				t.Logf("step %s down to %s: %v", name, target, err)
			}
			time.Sleep(200 * time.Millisecond)
			return false
		})
	}
	if pl, _ := f.Placement(ctx, storage.KindEvents); pl.PerNode[target] != f.cfg.Streams {
		t.Fatalf("setup: leaders %v, want all %d on %s", pl.PerNode, f.cfg.Streams, target)
	}
	return target
}

// testLeadersRebalanced: a relay running when one node comes to lead every
// events stream (here moved there on purpose, as after the other nodes
// restarted) spreads them again by itself, without a restart.
func (e *testEnv) testLeadersRebalanced(t *testing.T) {
	ns := e.namespace()
	f := e.open(t, e.connect(t), Config{Namespace: ns, Partitions: 3, Streams: 3, Rebalance: -1})
	e.leadAll(t, f)
	// The loop Open starts, with a short interval: started only now so
	// that it does not undo the setup.
	f.startRebalance(200 * time.Millisecond)
	ctx := bg(t)
	waitFor(t, time.Minute, "events stream leaders on two nodes or more", func() bool {
		pl, err := f.Placement(ctx, storage.KindEvents)
		if err != nil {
			return false
		}
		leading := 0
		for _, n := range pl.PerNode {
			if n > 0 {
				leading++
			}
		}
		return leading >= 2
	})
}

// testLeadersSpread: the events streams' leaders all on one node (moved
// there on purpose), a relay that opens the fleet spreads them over at
// least two nodes, and the leaders-per-node gauge shows it.
func (e *testEnv) testLeadersSpread(t *testing.T) {
	ns := e.namespace()
	// No rebalancing after Open (it would undo the setup): the one at
	// Open is tested.
	cfg := Config{Namespace: ns, Partitions: 6, Streams: 3, Rebalance: -1}
	f := e.open(t, e.connect(t), cfg)
	ctx := bg(t)
	e.leadAll(t, f)

	reg := prometheus.NewRegistry()
	f2, err := Open(ctx, e.connect(t), cfg, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	spread := func() map[string]int {
		pl, err := f2.Placement(ctx, storage.KindEvents)
		if err != nil {
			return nil
		}
		return pl.PerNode
	}
	waitFor(t, time.Minute, "events stream leaders on two nodes or more", func() bool {
		leading := 0
		for _, n := range spread() {
			if n > 0 {
				leading++
			}
		}
		return leading >= 2
	})
	t.Logf("leaders per node: %v", spread())
	waitFor(t, time.Minute, "the stream leaders gauge", func() bool {
		if f2.Writable(ctx) != nil {
			return false
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var sum, nodes float64
		for _, mf := range mfs {
			if mf.GetName() == "relay_fleet_stream_leaders" {
				for _, m := range mf.GetMetric() {
					sum += m.GetGauge().GetValue()
					nodes++
				}
			}
		}
		return sum == float64(f2.cfg.Streams) && nodes == 3
	})
}

// testGroupCommit: requests appended at once share batches (far fewer
// messages than requests), and every record is read once, each device's in
// order, its requests one after the other.
func (e *testEnv) testGroupCommit(t *testing.T) {
	reg := prometheus.NewRegistry()
	ctx := bg(t)
	f, err := Open(ctx, e.connect(t), Config{Namespace: e.namespace(), Partitions: 4, Streams: 1, MaxInflight: 1, Linger: 50 * time.Millisecond}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const devices, perDevice = 40, 5
	var wg sync.WaitGroup
	errs := make(chan error, devices*perDevice)
	for d := range devices {
		wg.Go(func() {
			key := "d:" + strconv.Itoa(d)
			for n := range perDevice {
				// Two records a request: 2n+1 and 2n+2.
				recs := []storage.Record{rec(key, 2*n+1), rec(key, 2*n+2)}
				if err := f.Append(ctx, Request{Lane: lane, Records: recs}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	msgs := streamMsgs(t, f, storage.KindEvents)
	t.Logf("%d requests stored in %d messages", devices*perDevice, msgs)
	if msgs > devices*perDevice/4 {
		t.Errorf("%d requests stored in %d messages: not grouped", devices*perDevice, msgs)
	}
	var batches, parts float64
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "relay_fleet_batch_requests" {
			h := mf.GetMetric()[0].GetHistogram()
			batches, parts = float64(h.GetSampleCount()), h.GetSampleSum()
		}
	}
	if batches == 0 || parts/batches < 4 {
		t.Errorf("batch_requests: %v parts in %v batches, want 4 or more a batch", parts, batches)
	}
	want := map[string]int{}
	for d := range devices {
		want["d:"+strconv.Itoa(d)] = 2 * perDevice
	}
	col := newCollector()
	stop := runEvents(f, col.deliver(nil))
	waitFor(t, 30*time.Second, "every record read", func() bool { return col.count() >= devices*perDevice*2 })
	stop()
	col.mu.Lock()
	defer col.mu.Unlock()
	checkOrder(t, col.got, want)
}

// testLayoutFound: a relay left at the default layout joins the streams it
// finds (here made with 16 partitions over 2 streams), while one configured
// otherwise than they are still refuses to start.
func (e *testEnv) testLayoutFound(t *testing.T) {
	ns := e.namespace()
	e.open(t, e.connect(t), Config{Namespace: ns, Partitions: 16, Streams: 2})
	f := e.open(t, e.connect(t), Config{Namespace: ns})
	if f.cfg.Partitions != 16 || f.cfg.Streams != 2 {
		t.Fatalf("layout taken: %d partitions, %d streams; want 16, 2", f.cfg.Partitions, f.cfg.Streams)
	}
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	defer cancel()
	if _, err := Open(ctx, e.connect(t), Config{Namespace: ns, Partitions: 3}, nil, nil); !errors.Is(err, ErrPartitions) {
		t.Fatalf("a relay configured for 3 partitions: %v, want ErrPartitions", err)
	}
}

// testRemoval: what its owner acknowledged leaves the stream (by purge),
// never a message handed out and not acknowledged, nor one not handed out.
func (e *testEnv) testRemoval(t *testing.T) {
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1})
	ctx := bg(t)
	present := storedOfDevice(t, ctx, f, 3)
	type step struct {
		msgs []*Message
		err  error
	}
	res := make(chan step)
	ack := make(chan *Message)
	stop := runEvents(f, func(ctx context.Context, p *Partition) error {
		var s step
		for range 3 {
			m, err := p.Next(ctx)
			if err != nil {
				res <- step{err: err}
				return err
			}
			s.msgs = append(s.msgs, m)
		}
		res <- s
		for {
			select {
			case m := <-ack:
				err := p.Ack(ctx, m)
				p.removed(false) // a removal it asked for is done
				res <- step{err: err}
			case <-ctx.Done():
				return nil
			}
		}
	})
	defer stop()
	s := <-res
	if s.err != nil {
		t.Fatal(s.err)
	}
	seqs := []uint64{s.msgs[0].Seq, s.msgs[1].Seq, s.msgs[2].Seq}
	// A fourth message, stored after the three were handed out.
	if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec("d:a", 4)}}); err != nil {
		t.Fatal(err)
	}
	fourth := seqs[2] + 1
	if !present(fourth) {
		t.Fatalf("the fourth message is not at %d", fourth)
	}
	for _, m := range s.msgs[1:] {
		ack <- m
		if r := <-res; r.err != nil {
			t.Fatal(r.err)
		}
	}
	if !present(seqs[0]) {
		t.Fatal("the first message, handed out and not acknowledged, was removed with the later ones")
	}
	for _, seq := range seqs[1:] {
		// A limits stream's acknowledgement removes nothing by itself:
		// the stream must still hold the backlog only (deleteAcked).
		if present(seq) {
			t.Errorf("message %d, acknowledged while an older one is held, is still in the stream", seq)
		}
	}
	ack <- s.msgs[0]
	if r := <-res; r.err != nil {
		t.Fatal(r.err)
	}
	for _, seq := range seqs {
		if present(seq) {
			t.Errorf("message %d acknowledged and still in the stream", seq)
		}
	}
	if !present(fourth) {
		t.Error("the fourth message, never handed out, was removed")
	}
}

// testRemovalNak: a message given back (Nak) is not removed with the later
// ones acknowledged meanwhile; read again and acknowledged, it is.
func (e *testEnv) testRemovalNak(t *testing.T) {
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1})
	ctx := bg(t)
	present := storedOfDevice(t, ctx, f, 2)
	type result struct {
		naked, again uint64
		kept         bool // the Nak'd message still stored after the later one's Ack
		err          error
	}
	res := make(chan result, 1)
	stop := runEvents(f, func(ctx context.Context, p *Partition) error {
		var r result
		sent := false
		defer func() {
			if !sent {
				res <- r
			}
		}()
		a, err := p.Next(ctx)
		if r.err = err; err != nil {
			return err
		}
		b, err := p.Next(ctx)
		if r.err = err; err != nil {
			return err
		}
		r.naked = a.Seq
		if r.err = p.Nak(a, 0); r.err != nil {
			return r.err
		}
		if r.err = p.Ack(ctx, b); r.err != nil {
			return r.err
		}
		p.removed(false)
		r.kept = present(a.Seq)
		again, err := p.Next(ctx)
		if r.err = err; err != nil {
			return err
		}
		r.again = again.Seq
		r.err = p.Ack(ctx, again)
		p.removed(false)
		res <- r
		sent = true
		<-ctx.Done()
		return nil
	})
	var r result
	select {
	case r = <-res:
	case <-time.After(polltest.Max):
		t.Fatal("deliver did not finish")
	}
	stop()
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !r.kept {
		t.Fatal("the message given back was removed with a later one acknowledged")
	}
	if r.again != r.naked {
		t.Errorf("read %d after the Nak of %d", r.again, r.naked)
	}
	if present(r.naked) {
		t.Error("the message read again and acknowledged is still in the stream")
	}
}

// consumerReplicas is the configured replicas of partition id's consumer
// (0: the stream's).
func consumerReplicas(t *testing.T, f *Fleet, k storage.Kind, id int) int {
	t.Helper()
	c, err := f.js.Consumer(bg(t), f.n.streamOf(k, id), consumerName(id))
	if err != nil {
		t.Fatal(err)
	}
	return c.CachedInfo().Config.Replicas
}

// testRetention: the streams a relay creates have limits retention and are
// read by consumers of one replica; a relay of before (which checks the
// format) refuses them.
func (e *testEnv) testRetention(t *testing.T) {
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1})
	ctx := bg(t)
	s, err := f.js.Stream(ctx, f.n.stream(storage.KindEvents, 0))
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.Retention != jetstream.LimitsPolicy || c.Metadata[metaFormat] != formatLimits {
		t.Fatalf("stream created with %v retention, format %q; want limits, %s", c.Retention, c.Metadata[metaFormat], formatLimits)
	}
	c := newCollector()
	stop := runEvents(f, c.deliver(nil))
	defer stop()
	if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec("d:a", 1)}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the record delivered", func() bool { return c.count() == 1 })
	if r := consumerReplicas(t, f, storage.KindEvents, 0); r != 1 {
		t.Errorf("the partition's consumer has %d replicas, want 1", r)
	}
	waitFor(t, 10*time.Second, "the delivered record removed", func() bool { return streamMsgs(t, f, storage.KindEvents) == 0 })
}

// testWorkQueueOfBefore: a cluster whose events stream is a work queue of
// a relay of before (format 1; the server does not change a stream's
// retention to or from work queue) keeps it: this relay reads its backlog
// in order with consumers of the stream's replicas (the server refuses one
// replica there), writes to it, and removes what it delivered; the kinds
// without a stream get limits streams.
func (e *testEnv) testWorkQueueOfBefore(t *testing.T) {
	ns := e.namespace()
	nc := e.connect(t)
	n := names{ns, 1}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := bg(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:               n.stream(storage.KindEvents, 0),
		Subjects:           []string{n.subject(storage.KindEvents, 0)},
		Retention:          jetstream.WorkQueuePolicy,
		Storage:            jetstream.FileStorage,
		Replicas:           3,
		MaxBytes:           -1,
		Discard:            jetstream.DiscardNew,
		Duplicates:         DefaultDedupWindow,
		AllowAtomicPublish: true,
		Metadata:           map[string]string{metaPartitions: "1", metaStreams: "1", metaFormat: formatWorkQueue},
	}); err != nil {
		t.Fatal(err)
	}
	f := e.open(t, nc, Config{Namespace: ns, Partitions: 1})
	if f.limits[f.n.stream(storage.KindEvents, 0)] || !f.limits[f.n.stream(storage.KindUserMap, 0)] {
		t.Fatalf("retention taken: %v; want the events stream a work queue, the others limits", f.limits)
	}
	// A backlog left by the relays of before (the message format is the
	// same), read and removed in order, then new appends.
	for i := 1; i <= 5; i++ {
		if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec("d:a", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	c := newCollector()
	stop := runEvents(f, c.deliver(nil))
	defer stop()
	for i := 6; i <= 10; i++ {
		if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec("d:a", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "ten records delivered", func() bool { return c.count() == 10 })
	c.mu.Lock()
	checkOrder(t, c.got, map[string]int{"d:a": 10})
	c.mu.Unlock()
	if r := consumerReplicas(t, f, storage.KindEvents, 0); r == 1 {
		t.Error("the work queue's consumer has one replica")
	}
	waitFor(t, 10*time.Second, "the delivered records removed", func() bool { return streamMsgs(t, f, storage.KindEvents) == 0 })
	s, err := js.Stream(ctx, f.n.stream(storage.KindEvents, 0))
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.Retention != jetstream.WorkQueuePolicy || c.Metadata[metaFormat] != formatWorkQueue {
		t.Errorf("the work queue became %v retention, format %q", c.Retention, c.Metadata[metaFormat])
	}

	// The operator's move (README): drained, the work queue is deleted and
	// the relays restarted; the first makes a limits stream, read by a
	// consumer of one replica.
	stop()
	f.Close()
	if err := js.DeleteStream(ctx, n.stream(storage.KindEvents, 0)); err != nil {
		t.Fatal(err)
	}
	f = e.open(t, e.connect(t), Config{Namespace: ns, Partitions: 1})
	if !f.limits[f.n.stream(storage.KindEvents, 0)] {
		t.Fatal("the events stream made after the drain is not a limits stream")
	}
	c = newCollector()
	stop = runEvents(f, c.deliver(nil))
	defer stop()
	for i := 1; i <= 3; i++ {
		if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec("d:b", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "three records delivered after the move", func() bool { return c.count() == 3 })
	c.mu.Lock()
	checkOrder(t, c.got, map[string]int{"d:b": 3})
	c.mu.Unlock()
	if r := consumerReplicas(t, f, storage.KindEvents, 0); r != 1 {
		t.Errorf("the limits stream's consumer has %d replicas, want 1", r)
	}
}

// testConsumerNodeGone: a partition's consumer has one replica, so when its
// node dies it falls silent (no other node takes it over); the reader
// notices (the consumer answers no info request), returns ErrLost, and the
// partition opened again reads on from a consumer on a node that is up.
func (e *testEnv) testConsumerNodeGone(t *testing.T) {
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1})
	ctx := bg(t)
	if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec("d:a", 1)}}); err != nil {
		t.Fatal(err)
	}
	p, err := f.openPartition(ctx, ctx, storage.KindEvents, 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := p.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Ack(ctx, m); err != nil {
		t.Fatal(err)
	}
	ci, err := p.cons.Info(ctx)
	if err != nil || ci.Cluster == nil {
		t.Fatalf("consumer info: %v", err)
	}
	node := -1
	for i := range e.c.Len() {
		if s := e.c.Server(i); s != nil && s.Name() == ci.Cluster.Leader {
			node = i
		}
	}
	if node < 0 {
		t.Fatalf("the consumer's node %q is not in the cluster", ci.Cluster.Leader)
	}
	e.c.Kill(node)
	defer func() { e.c.Restart(node); e.c.WaitReady() }()
	if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec("d:a", 2)}}); err != nil {
		t.Fatal(err)
	}
	nctx, cancel := context.WithTimeout(ctx, polltest.Max)
	defer cancel()
	if _, err := p.Next(nctx); !errors.Is(err, ErrLost) {
		t.Fatalf("read with the consumer's node dead: %v, want ErrLost", err)
	}
	p.close()
	var again *Partition
	waitFor(t, 30*time.Second, "the partition opened again", func() bool {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		again, err = f.openPartition(octx, ctx, storage.KindEvents, 0)
		return err == nil
	})
	defer again.close()
	for {
		m, err := again.Next(nctx)
		if err != nil {
			t.Fatalf("read after the reopen: %v", err)
		}
		if _, n := parse(m.Records[0]); n == 2 {
			break
		}
	}
}

// testAckWithoutConsumer: on a limits stream, acknowledging a message while
// an older one is held deletes it from the stream and needs nothing of the
// consumer, which may have lost its state (restarted on its node): here it
// is gone altogether.
func (e *testEnv) testAckWithoutConsumer(t *testing.T) {
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1})
	ctx := bg(t)
	for i := 1; i <= 2; i++ {
		if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec("d:a", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := f.openPartition(ctx, ctx, storage.KindEvents, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	a, err := p.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stream := f.n.streamOf(storage.KindEvents, 0)
	if err := f.js.DeleteConsumer(ctx, stream, consumerName(0)); err != nil {
		t.Fatal(err)
	}
	if err := p.Ack(ctx, b); err != nil {
		t.Fatalf("ack above the floor with the consumer gone: %v", err)
	}
	st, err := f.js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetMsg(ctx, b.Seq); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the acknowledged message: %v, want it deleted", err)
	}
	if _, err := st.GetMsg(ctx, a.Seq); err != nil {
		t.Errorf("the held message: %v, want it kept", err)
	}
}

// testAckLater: a message the reader acknowledges above the floor is left
// to the purge (ackLater), but it does leave the stream while the older
// message stays held (deleted alone after a removal round), and at once
// when the partition closes; the held message stays.
func (e *testEnv) testAckLater(t *testing.T) {
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1})
	ctx := bg(t)
	present := storedOfDevice(t, ctx, f, 3)
	p, err := f.openPartition(ctx, ctx, storage.KindEvents, 0)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*Message
	for range 3 {
		m, err := p.Next(ctx)
		if err != nil {
			p.close()
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	if err := p.ackLater(ctx, msgs[1]); err != nil {
		p.close()
		t.Fatal(err)
	}
	polltest.Until(t, "the message acknowledged above a held one deleted", func() bool { return !present(msgs[1].Seq) })
	if err := p.ackLater(ctx, msgs[2]); err != nil {
		p.close()
		t.Fatal(err)
	}
	p.close()
	if present(msgs[2].Seq) {
		t.Error("the message acknowledged above a held one is still in the stream after the close")
	}
	if !present(msgs[0].Seq) {
		t.Error("the held message was removed")
	}
}

// testRecentRead: the owner reads what this relay published to its
// partition from what the committer kept (recent), none of it left
// behind, and the records are the ones appended; what it published before
// it read the partition is decompressed.
func (e *testEnv) testRecentRead(t *testing.T) {
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1})
	// zstd, as every member of a fleet of this version reads (set by the
	// heartbeats of Run, which this test does not start).
	f.compress[storage.KindEvents].Store(codecZstd)
	ctx := bg(t)
	big := func(i int) storage.Record {
		return storage.Record{OrderKey: []byte("d:a"), Data: fmt.Appendf(nil, `{"insert_id":"%d","pad":"%s"}`, i, strings.Repeat("x", 200))}
	}
	if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{big(1)}}); err != nil {
		t.Fatal(err)
	}
	p, err := f.openPartition(ctx, ctx, storage.KindEvents, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	for i := 2; i <= 4; i++ {
		if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{big(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	f.recent.mu.Lock()
	kept := len(f.recent.m)
	f.recent.mu.Unlock()
	if kept != 3 {
		t.Fatalf("%d messages kept, want the 3 published while reading", kept)
	}
	for i := 1; i <= 4; i++ {
		m, err := p.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Records) != 1 || !bytes.Equal(m.Records[0].Data, big(i).Data) {
			t.Fatalf("message %d: %d records, %.40q", i, len(m.Records), m.Records[0].Data)
		}
	}
	f.recent.mu.Lock()
	kept = len(f.recent.m)
	f.recent.mu.Unlock()
	if kept != 0 {
		t.Errorf("%d kept messages not taken by the reader", kept)
	}
	// A request large enough to be a zstd frame of its own: kept, and
	// read, as its parts.
	var many []storage.Record
	for i := range 40 {
		many = append(many, big(100+i))
	}
	if err := f.Append(ctx, Request{Lane: lane, Records: many}); err != nil {
		t.Fatal(err)
	}
	f.recent.mu.Lock()
	kept = len(f.recent.m)
	f.recent.mu.Unlock()
	m, err := p.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if kept != 1 || len(m.Records) != len(many) || !bytes.Equal(m.Records[39].Data, many[39].Data) {
		t.Fatalf("%d kept; read %d records, want %d", kept, len(m.Records), len(many))
	}
}

// storedOfDevice appends n records of one device to f's events partition 0
// and returns whether a stream sequence of that partition is still stored.
func storedOfDevice(t *testing.T, ctx context.Context, f *Fleet, n int) (present func(seq uint64) bool) {
	t.Helper()
	for i := 1; i <= n; i++ {
		if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec("d:a", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := f.js.Stream(ctx, f.n.streamOf(storage.KindEvents, 0))
	if err != nil {
		t.Fatal(err)
	}
	return func(seq uint64) bool {
		_, err := st.GetMsg(ctx, seq)
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
}
