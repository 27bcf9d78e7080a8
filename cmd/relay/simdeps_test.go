package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBinaryHasNoFaultInjection: the simulator's fault injection and test
// knobs (internal/simtest) are not compiled into the relay binary.
func TestBinaryHasNoFaultInjection(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(goBin, "list", "-deps", "github.com/svcrelay/relay/cmd/relay").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	model := false
	for _, d := range deps {
		switch {
		case d == "github.com/svcrelay/relay/internal/sim":
			model = true
		case strings.HasPrefix(d, "github.com/svcrelay/relay/internal/sim/"), strings.HasPrefix(d, "github.com/svcrelay/relay/test/"):
			t.Errorf("the relay binary imports %s (test-only)", d)
		}
	}
	if !model {
		t.Error("the relay binary does not import internal/sim (sandbox mode and `relay sim` need the model)")
	}
}
