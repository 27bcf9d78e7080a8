package fleet

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/svcrelay/relay/internal/natstest"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

// TestFleetDelivery runs the delivery cases on a cluster of their own (so
// that TestFleet's list stays as it is).
func TestFleetDelivery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node NATS cluster")
	}
	t.Parallel()
	env := &testEnv{c: natstest.Start(t, natstest.Config{})}
	t.Run("MissedDelivery", env.testMissedDelivery)
	t.Run("MissedHeartbeat", env.testMissedHeartbeat)
	t.Run("Writable", env.testWritable) // kills nodes: last
}

// testMissedDelivery: a message the partition's consumer delivered into
// the void (a pull whose reply died with the reader's NATS server, or a
// delivery to the previous owner by a consumer that outlived its reset)
// must not be overtaken by the partition's later messages. Made here with
// the real server: a second reader pulls the first message and drops it
// without acknowledging, as a dead connection would. test/fleet's
// Both scenario saw it (a message acknowledged to its client
// at the instant of the kills came ~14 s after later ones of its device).
func (e *testEnv) testMissedDelivery(t *testing.T) {
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1})
	ctx := bg(t)
	for n := 1; n <= 3; n++ {
		if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec("d:a", n)}}); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := f.createConsumer(ctx, storage.KindEvents, 0)
	if err != nil {
		t.Fatal(err)
	}
	lost := func() {
		t.Helper()
		// Right after its create, the consumer of a replicated stream may
		// have no leader taking pulls yet: "no responders", nothing
		// delivered, and the pull is asked again.
		for deadline := time.Now().Add(polltest.Max); ; time.Sleep(50 * time.Millisecond) {
			b, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
			n := 0
			if err == nil {
				for range b.Messages() {
					n++ // dropped: neither acknowledged nor given back
				}
				err = b.Error()
			}
			if n == 0 && errors.Is(err, nats.ErrNoResponders) && time.Now().Before(deadline) {
				continue
			}
			if n != 1 || err != nil {
				t.Fatalf("lost delivery: %d messages, %v", n, err)
			}
			return
		}
	}
	lost() // record 1, delivery 1

	// The reader of that consumer must not hand out record 2.
	p, err := f.readPartition(ctx, storage.KindEvents, 0, cons)
	if err != nil {
		t.Fatal(err)
	}
	m, err := p.Next(ctx)
	if err == nil {
		p.close()
		t.Fatalf("read %s while record 1 waits for its ack wait: a delivery missed went unnoticed", m.Records[0].Data)
	}
	if !errors.Is(err, ErrLost) {
		p.close()
		t.Fatalf("read after a missed delivery: %v, want ErrLost", err)
	}
	if _, err := p.Next(ctx); !errors.Is(err, ErrLost) {
		t.Errorf("read again after a missed delivery: %v, want ErrLost", err)
	}
	p.close()

	// A consumer that delivered before is refused by a create (here the
	// create of an existing consumer, as when a reset's delete did not
	// take: the server answers with the old one).
	if _, err := f.createConsumer(ctx, storage.KindEvents, 0); !errors.Is(err, errStaleConsumer) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("create over a consumer that delivered: %v, want a stale consumer refused (unavailable)", err)
	}

	// Opened again (the reset), the partition reads 1, 2, 3.
	p, err = f.openPartition(ctx, ctx, storage.KindEvents, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	for want := 1; want <= 3; want++ {
		nctx, cancel := context.WithTimeout(ctx, polltest.Max) // a pull lost to a leader election: up to 2 expiries
		m, err := p.Next(nctx)
		cancel()
		if err != nil {
			t.Fatalf("read record %d after the reset: %v", want, err)
		}
		if k, n := parse(m.Records[0]); k != "d:a" || n != want {
			t.Fatalf("read %s/%d after the reset, want d:a/%d", k, n, want)
		}
		if err := p.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
}

// lateHeartbeat reports one missed heartbeat, as the iterator does when a
// busy server's heartbeats come late, and then reads on.
type lateHeartbeat struct {
	jetstream.MessagesContext
	reported bool
}

func (l *lateHeartbeat) Next(opts ...jetstream.NextOpt) (jetstream.Msg, error) {
	if !l.reported {
		l.reported = true
		return nil, jetstream.ErrNoHeartbeat
	}
	return l.MessagesContext.Next(opts...)
}

// testMissedHeartbeat: a late heartbeat is not an error of the partition:
// its reader pulls again and hands out the next message.
func (e *testEnv) testMissedHeartbeat(t *testing.T) {
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1})
	ctx := bg(t)
	if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec("d:a", 1)}}); err != nil {
		t.Fatal(err)
	}
	p, err := f.openPartition(ctx, ctx, storage.KindEvents, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	late := &lateHeartbeat{MessagesContext: p.it}
	p.it = late
	m, err := p.Next(ctx)
	if err != nil {
		t.Fatalf("read after a late heartbeat: %v", err)
	}
	if !late.reported {
		t.Fatal("the late heartbeat was never reported")
	}
	if k, n := parse(m.Records[0]); k != "d:a" || n != 1 {
		t.Fatalf("read %s/%d, want d:a/1", k, n)
	}
}

// testWritable: Writable is nil while the events stream has a quorum,
// ErrUnavailable (within its context's bound) once two of the three nodes
// are down, and nil again after they are back.
func (e *testEnv) testWritable(t *testing.T) {
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1})
	ctx := bg(t)
	// A context that a loaded machine's NATS round trip cannot outlast.
	check := func() error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return f.Writable(cctx)
	}
	if err := check(); err != nil {
		t.Fatalf("writable with every node up: %v", err)
	}
	down := []int{0, 1}
	for _, i := range down {
		e.c.Kill(i)
	}
	// Killed nodes show as offline (or stop answering) within seconds.
	killed := time.Now()
	deadline := killed.Add(polltest.Max)
	for {
		start := time.Now()
		err := check()
		// A Writable that ignores its context would hang here.
		if d := time.Since(start); d > polltest.Max {
			t.Fatalf("Writable took %v with a 10s context", d)
		}
		if err != nil {
			t.Logf("without a quorum after %v: %v", time.Since(killed).Round(time.Millisecond), err)
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("without a quorum: %v, want ErrUnavailable", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still writable %v after two of three nodes died", polltest.Max)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, i := range down {
		e.c.Restart(i)
	}
	waitFor(t, 30*time.Second, "writable again", func() bool { return check() == nil })
}
