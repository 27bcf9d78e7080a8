package e2e

import (
	"fmt"
	"os"
	"testing"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// TestMain runs up to 4 tests at once on one build of the relay: each test
// has its own relays, simulator, ports and directories, and waits on them
// (kills, restarts, pauses, a paced load) far more than it uses the CPU.
func TestMain(m *testing.M) {
	polltest.SetParallel(4)
	dir, err := os.MkdirTemp("", "e2e-relay-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	harness.ShareBuild(dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
