package fleet

import (
	"flag"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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
	storagetest.Run(t, storagetest.Config{
		New: func(t *testing.T) storagetest.OpenFunc {
			ns := e.namespace()
			return func(t *testing.T, o storagetest.Options) storage.Backend {
				t.Helper()
				nc := e.connect(t)
				f := e.open(t, nc, Config{Namespace: ns, Partitions: 4, MaxBytes: o.MaxBytes, LeaseTTL: 2 * time.Second})
				var b storage.Backend = &connBackend{f.Backend(), nc}
				if *broken != "" {
					b = storagetest.Broken(b, *broken)
				}
				return b
			}
		},
	})
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
