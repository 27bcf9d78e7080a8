package fleet

import (
	"bytes"
	"flag"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/storage/storagetest"
)

// broken wraps the fleet in a defect, to see the suite catch it:
// go test ./internal/fleet -run TestFleet/Conformance -broken=dropack (or
// another of storagetest.Defects) must fail.
var broken = flag.String("broken", "", "wrap the fleet backend in one of storagetest.Defects")

// testConformance runs the storage seam's suite against the fleet on the
// test's cluster: every test a fresh namespace, every open a new
// connection and Fleet (a new relay process).
func (e *testEnv) testConformance(t *testing.T) {
	var mu sync.Mutex
	nss := map[*testing.T]string{} // each test's namespace
	nsOf := func(t *testing.T) string { mu.Lock(); defer mu.Unlock(); return nss[t] }
	opener := func(ns string) storagetest.OpenFunc {
		return func(t *testing.T, o storagetest.Options) storage.Backend {
			t.Helper()
			nc := e.connect(t)
			// A lease the machine can renew however loaded: one lost
			// (a renewal later than LeaseTTL-LeaseMargin) resets the
			// partition's consumer, and what was read comes back, as
			// it must, but the suite counts it as read twice. 20 s
			// costs the one take-over after Crash 20 s.
			f := e.open(t, nc, Config{Namespace: ns, Partitions: 4, MaxBytes: o.MaxBytes, LeaseTTL: 20 * time.Second})
			var b storage.Backend = &connBackend{f.Backend(), nc}
			if *broken != "" {
				b = storagetest.Broken(b, *broken)
			}
			return b
		}
	}
	storagetest.Run(t, storagetest.Config{
		New: func(t *testing.T) storagetest.OpenFunc {
			ns := e.namespace()
			mu.Lock()
			nss[t] = ns
			mu.Unlock()
			return opener(ns)
		},
		// JetStream checks its own blocks and replicas: a flipped byte on
		// a node's disk never reaches a reader. What can reach one is a
		// message that was damaged before it was stored (or not written
		// by this package), so the marked message is replaced by a copy
		// with a byte of its body flipped, published where it was (the
		// tail of its partition: nothing was appended after it).
		Damage: func(t *testing.T, _ storagetest.OpenFunc, b storage.Backend, marker []byte) storage.Backend {
			js := e.jetStream(t)
			ctx := bg(t)
			for _, st := range e.laneStreams(t, js, nsOf(t)) {
				info, err := st.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
					m, err := st.GetMsg(ctx, seq)
					if err != nil || !bytes.Contains(m.Data, marker) {
						continue
					}
					data := bytes.Clone(m.Data)
					data[bytes.Index(data, marker)] ^= 0x20
					if err := st.DeleteMsg(ctx, seq); err != nil {
						t.Fatal(err)
					}
					if _, err := js.Publish(ctx, m.Subject, data); err != nil {
						t.Fatal(err)
					}
					return b
				}
			}
			t.Fatal("no message holds the marker")
			return nil
		},
		// A stream at its byte limit refuses a message (DiscardNew) as a
		// server out of store does; the limit set back is the space back.
		NoSpace: func(t *testing.T) (storagetest.OpenFunc, func(), func()) {
			ns := e.namespace()
			js := e.jetStream(t)
			limit := func(full bool) {
				ctx := bg(t)
				for _, st := range e.laneStreams(t, js, ns) {
					info, err := st.Info(ctx)
					if err != nil {
						t.Fatal(err)
					}
					cfg := info.Config
					cfg.MaxBytes = -1
					if full {
						cfg.MaxBytes = max(int64(info.State.Bytes), 1)
					}
					if _, err := js.UpdateStream(ctx, cfg); err != nil {
						t.Fatal(err)
					}
				}
			}
			return opener(ns), func() { limit(true) }, func() { limit(false) }
		},
	})
}

func (e *testEnv) jetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(e.connect(t))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// laneStreams are the streams of namespace ns that hold lanes' records
// (not its dead letters).
func (e *testEnv) laneStreams(t *testing.T, js jetstream.JetStream, ns string) []jetstream.Stream {
	t.Helper()
	ctx := bg(t)
	var out []jetstream.Stream
	lister := js.StreamNames(ctx)
	for name := range lister.Name() {
		if !strings.HasPrefix(name, ns+"_") || name == (names{ns: ns}).deadStream() {
			continue
		}
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, st)
	}
	if err := lister.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("namespace %s has no lane streams", ns)
	}
	return out
}

// connBackend closes its connection with the backend, as a process's exit
// would; Crash (storagetest.Crasher) closes only the connection, so that
// the leases are left to expire as a killed relay's.
type connBackend struct {
	*Backend
	nc *nats.Conn
}

func (b *connBackend) Close() error {
	err := b.Backend.Close()
	b.nc.Close()
	return err
}

func (b *connBackend) Crash() { b.nc.Close() }
