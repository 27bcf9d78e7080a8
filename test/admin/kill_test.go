package admin

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// TestKillBeforeDelivery: group identifies and mappings answered 200 while
// the upstream is down survive a SIGKILL of the relay, and after a restart
// with the upstream up each is delivered exactly once (counted at the sim),
// the mappings of one user in the order they were accepted.
func TestKillBeforeDelivery(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the relay binary")
	}
	const (
		key      = "kill-test-key"
		requests = 10
		perReq   = 5
	)
	dir := t.TempDir()
	data := dir + "/data"
	down := "http://" + harness.FreeAddr(t) // nothing listens: nothing is delivered
	log := &syncBuf{}
	r := startRelay(t, data, log, "--ingest-url", down, "--alias-url", down, "--analytics-url", down)

	var wantGroups, wantUsers []string
	for i := range requests {
		var ids, maps []string
		for j := range perReq {
			g := fmt.Sprintf("g-%02d-%d", i, j)
			u := fmt.Sprintf("u-%02d-%d", i, j)
			wantGroups, wantUsers = append(wantGroups, g), append(wantUsers, u)
			ids = append(ids, fmt.Sprintf(`{"group_type":"org","group_value":%q,"group_properties":{"$set":{"n":%d}}}`, g, j))
			maps = append(maps, fmt.Sprintf(`{"user_id":%q,"global_user_id":"global-%s"}`, u, u))
		}
		a := call(t, "POST", r.admin+"/groupidentify", form("api_key", key, "identification", "["+strings.Join(ids, ",")+"]"), "Content-Type", formType)
		if a.status != 200 {
			t.Fatalf("groupidentify: %d %s", a.status, a.body)
		}
		a = call(t, "POST", r.admin+"/usermap?"+form("api_key", key, "mapping", "["+strings.Join(maps, ",")+"]"), "")
		if a.status != 200 {
			t.Fatalf("usermap: %d %s", a.status, a.body)
		}
		// One user remapped in every request: the last must win.
		a = call(t, "POST", r.admin+"/usermap?"+form("api_key", key, "mapping", fmt.Sprintf(`{"user_id":"order-u","global_user_id":"order-g%02d"}`, i)), "")
		if a.status != 200 {
			t.Fatalf("usermap: %d %s", a.status, a.body)
		}
	}
	r.kill()

	s, simURL := forwardtest.StartSim(t, sim.Config{})
	// The records were accepted for the dead address: the sandbox guard
	// needs the change allowed.
	r = startRelay(t, data, log, "--ingest-url", simURL, "--alias-url", simURL, "--analytics-url", simURL, "--spool-upstream-change", "allow")
	total := requests * perReq
	polltest.Until(t, "every group identify and mapping at the sim", func() bool {
		return len(simtest.GroupIdentifies(s, key)) >= total && len(simtest.MappingCalls(s)) >= total+requests
	})
	time.Sleep(500 * time.Millisecond) // a duplicate would arrive by now
	r.stopClean()

	var groups []string
	for _, g := range simtest.GroupIdentifies(s, key) {
		groups = append(groups, g.GroupValue)
	}
	slices.Sort(groups)
	if !slices.Equal(groups, wantGroups) {
		t.Fatalf("group identifies at the sim: %d (%v...), want each of %d once", len(groups), groups[:min(5, len(groups))], total)
	}
	var users, order []string
	for _, m := range simtest.MappingCalls(s) {
		if m.UserID == "order-u" {
			order = append(order, m.GlobalUserID)
			continue
		}
		users = append(users, m.UserID)
	}
	slices.Sort(users)
	if !slices.Equal(users, wantUsers) {
		t.Fatalf("mappings at the sim: %d, want each of %d once", len(users), total)
	}
	if len(order) != requests || !slices.IsSorted(order) {
		t.Fatalf("order-u's mappings arrived as %v", order)
	}
	if g, _ := simtest.MappedTo(s, key, "order-u"); g != fmt.Sprintf("order-g%02d", requests-1) {
		t.Fatalf("order-u maps to %q", g)
	}
}

// TestStartRefusals: the binary refuses a credentials file without an admin
// token, and a credentials file with a typo, with exit status 2 and one line
// on stderr that holds no secret value.
func TestStartRefusals(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the relay binary")
	}
	dir := t.TempDir()
	good, tokenFile := writeFiles(t, dir, "http://127.0.0.1:1")
	typo := dir + "/typo.yaml"
	if err := os.WriteFile(typo, []byte("projects:\n  - name: p\n    api_key: \""+projAPIKey+"\"\n    secret_kye: \""+projSecret+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := dir + "/bad.yaml"
	if err := os.WriteFile(bad, []byte("projects:\n  - name: p\n    api_key: [\""+projAPIKey+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no token", []string{"--credentials", good}, "--credentials needs an admin token"},
		{"typo", []string{"--credentials", typo, "--admin-token-file", tokenFile}, "secret_kye"},
		{"yaml error", []string{"--credentials", bad, "--admin-token-file", tokenFile}, "--credentials"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(relayBin(t), append([]string{"--data-dir", dir + "/data", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, tt.args...)...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit %v, want 2: %s", err, out)
			}
			if !strings.Contains(string(out), tt.want) || strings.Count(string(out), "\n") != 1 {
				t.Fatalf("stderr %q: want one line with %q", out, tt.want)
			}
			for _, sec := range secrets {
				if strings.Contains(string(out), sec) {
					t.Fatalf("stderr holds a secret: %q", out)
				}
			}
		})
	}
}
