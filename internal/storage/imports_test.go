package storage

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// deps lists what `go list -deps` says each of pkgs depends on (pkgs are
// paths under the module's internal/).
func deps(t *testing.T, test bool, pkgs ...string) map[string][]string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out := map[string][]string{}
	for _, p := range pkgs {
		args := []string{"list", "-deps"}
		if test {
			args = append(args, "-test")
		}
		b, err := exec.Command(goBin, append(args, "github.com/svcrelay/relay/internal/"+p)...).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", p, err)
		}
		out[p] = strings.Fields(string(b))
	}
	return out
}

// TestImports: the seam is written in its own types, so it imports neither
// backend, and the backends (the local spool, the fleet) do not import
// each other, their tests included: what both need is here.
func TestImports(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	forbidden := map[string][]string{
		"storage": {"spool", "fleet"},
		"spool":   {"fleet"},
		"fleet":   {"spool"},
	}
	for _, test := range []bool{false, true} {
		for p, ds := range deps(t, test, "storage", "spool", "fleet") {
			for _, f := range forbidden[p] {
				if slices.Contains(ds, "github.com/svcrelay/relay/internal/"+f) {
					t.Errorf("internal/%s depends on internal/%s (tests included: %v)", p, f, test)
				}
			}
		}
	}
}
