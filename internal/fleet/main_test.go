package fleet

import (
	"os"
	"testing"

	"github.com/svcrelay/relay/internal/polltest"
)

// TestMain runs up to 4 cases at once: they wait on leases, heartbeats and
// the cluster's answers far more than they use the CPU.
func TestMain(m *testing.M) {
	polltest.SetParallel(4)
	os.Exit(m.Run())
}
