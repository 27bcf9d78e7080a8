package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// TestSandboxGuard: a relay restarted without its --ingest-url (sandbox
// mode), or with another one, over a spool whose records wait for the
// first upstream refuses to start with one line saying why; with
// --spool-upstream-change=allow it starts.
func TestSandboxGuard(t *testing.T) {
	if testing.Short() {
		t.Skip("binary-level test; skipped under -short")
	}
	t.Parallel()
	bin := harness.Build(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	prod := "http://" + harness.FreeAddr(t) // nothing listens: the records wait
	r := harness.StartRelay(t, bin, dir, &harness.RelayOpts{DataDir: data, IngestURL: prod})
	body := `{"api_key":"guard-key","events":[{"event_type":"e","device_id":"device-1"}]}`
	if code, b, err := r.Post(harness.NewClient(), "/2/httpapi", []byte(body)); err != nil || code != 200 {
		t.Fatalf("post: %d %s %v", code, b, err)
	}
	if err := r.Stop(t, 15*time.Second); err != nil {
		t.Fatalf("stop: %v", err)
	}

	run := func(extra ...string) (string, error) {
		args := append([]string{"--listen", harness.FreeAddr(t), "--admin-listen", harness.FreeAddr(t),
			"--data-dir", data, "--spool-min-free-bytes", "0", "--log-format", "json"}, extra...)
		cmd := exec.Command(bin, args...)
		cmd.Env = harness.CleanEnv()
		done := make(chan struct{})
		var out []byte
		var err error
		go func() { out, err = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
			return string(out), err
		case <-time.After(polltest.Max):
			cmd.Process.Kill()
			<-done
			return string(out), fmt.Errorf("still running after %v", polltest.Max)
		}
	}
	for _, tc := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"sandbox", nil, `would deliver them to \"sandbox\"`},
		{"another upstream", []string{"--ingest-url", "http://" + harness.FreeAddr(t)}, "spool upstream changed"},
	} {
		out, err := run(tc.extra...)
		if err == nil || !strings.Contains(out, tc.want) || !strings.Contains(out, prod) ||
			!strings.Contains(out, "--spool-upstream-change=allow") {
			t.Fatalf("%s: err %v, output:\n%s", tc.name, err, out)
		}
		var errLines int
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, `"level":"error"`) {
				errLines++
			}
		}
		if errLines != 1 {
			t.Fatalf("%s: %d error lines, want one:\n%s", tc.name, errLines, out)
		}
	}
	// Allowed: it starts (and serves) in sandbox mode.
	r = harness.StartRelay(t, bin, dir, &harness.RelayOpts{DataDir: data, Extra: []string{"--spool-upstream-change", "allow"}})
	if err := r.Stop(t, 15*time.Second); err != nil {
		t.Fatalf("stop: %v", err)
	}
}
