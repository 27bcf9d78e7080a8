package operator

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

// Now is the pinned time, or the real time until Set is called.
func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.t.IsZero() {
		return time.Now()
	}
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// startSim starts a simulator whose clock the test may pin.
func startSim(t testing.TB) (*simtest.Sim, string, *clock) {
	t.Helper()
	c := &clock{}
	s, u := forwardtest.StartSim(t, sim.Config{Now: c.Now})
	return s, u, c
}

// credsFile writes a credentials file with project "web" (key proj) in
// organization "acme" (key org).
func credsFile(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "creds.yaml")
	err := os.WriteFile(p, []byte(forwardtest.WebOrgCredsYAML), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// ingest sends events (JSON objects) for api key proj at the sim's current time.
func ingest(t testing.TB, up string, events ...string) {
	t.Helper()
	body := `{"api_key":"proj","events":[` + strings.Join(events, ",") + `]}`
	resp, err := http.Post(up+"/2/httpapi", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("ingest: %d %s", resp.StatusCode, b)
	}
}

type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

func runCmd(ctx context.Context, name string, args ...string) result {
	var out, errb bytes.Buffer
	code := Main(ctx, name, args, &out, &errb)
	return result{code, out.String(), errb.String()}
}

var fastRetry = []string{"--retry-initial=10ms", "--retry-max=50ms", "--retry-time=2s"}

func TestProgressTerminalAndPlain(t *testing.T) {
	var b bytes.Buffer
	p := &progress{w: &b, tty: true}
	p.update("piece %d", 1)
	p.update("piece %d", 2) // within 100 ms: not drawn
	p.logf("done %d", 1)
	p.done()
	if got := b.String(); got != "\r\033[Kpiece 1\r\033[Kdone 1\n" {
		t.Fatalf("terminal output %q", got)
	}
	b.Reset()
	p = newProgress(&b) // not a terminal: only log lines
	p.update("piece %d", 1)
	p.logf("done %d", 1)
	p.done()
	if got := b.String(); got != "done 1\n" {
		t.Fatalf("plain output %q", got)
	}
}

// TestMainFlow: the flow every command shares (Main): exit codes, the
// "relay NAME: ERR" line, which base flag each command takes, required
// flags, and usage errors from the credentials. No case reaches an
// upstream (the bases are a closed port).
func TestMainFlow(t *testing.T) {
	creds := credsFile(t)
	dir := t.TempDir()
	invalidIDs := filepath.Join(dir, "ids.txt")
	os.WriteFile(invalidIDs, []byte("svc_id:x\n"), 0o644)
	badItems := filepath.Join(dir, "items.jsonl")
	os.WriteFile(badItems, []byte(`{"unique_id":"n","conversation_parts":[{"body":""}]}`+"\n"), 0o644)
	const closed = "http://127.0.0.1:1"
	for _, c := range []struct {
		name   string
		args   []string
		code   int
		stderr string // "" : no "relay NAME:" line at all
	}{
		{"nope", nil, 2, "relay: no operator command"},
		{"export", []string{"-h"}, 0, ""},
		{"dsar", []string{"--bogus"}, 2, ""},
		{"feedback", []string{"--source", "s", "stray"}, 2, `relay feedback: unexpected argument "stray"`},
		// Each command takes the base flag of its kind only.
		{"feedback", []string{"--analytics-url", closed}, 2, ""},
		{"export", []string{"--feedback-url", closed}, 2, ""},
		{"delete-users", []string{"--feedback-url", closed}, 2, ""},
		{"dsar", []string{"--feedback-url", closed}, 2, ""},
		// Required flags, in the order each command checks them.
		{"delete-users", []string{"--requester", "r"}, 2, "relay delete-users: --ids-file is required"},
		{"delete-users", []string{"--ids-file", invalidIDs}, 2, "relay delete-users: --requester is required"},
		{"feedback", []string{"--file", badItems}, 2, "relay feedback: --source is required"},
		{"feedback", []string{"--source", "s"}, 2, "relay feedback: --file is required"},
		{"export", []string{"--start", "20260101T00", "--end", "20260101T00"}, 2, "relay export: --out is required"},
		{"dsar", []string{"--user-id", "u", "--start", "2026-01-01", "--end", "2026-01-02"}, 2, "relay dsar: --out is required"},
		// Credentials: usage errors.
		{"feedback", []string{"--source", "s", "--file", badItems}, 2, "relay feedback: --credentials is required"},
		{"export", []string{"--credentials", creds, "--start", "20260101T00", "--end", "20260101T00", "--out", "x"}, 2, "relay export: --project is required"},
		{"export", []string{"--credentials", creds, "--project", "nope", "--start", "20260101T00", "--end", "20260101T00", "--out", "x"}, 2, `relay export: --project "nope" is not in`},
		{"feedback", []string{"--credentials", creds, "--project", "web", "--source", "s", "--file", badItems}, 2, "relay feedback: no upstream base: give --feedback-url"},
		{"export", []string{"--credentials", filepath.Join(dir, "missing.yaml"), "--project", "web", "--start", "20260101T00", "--end", "20260101T00", "--out", "x"}, 2, "relay export: "},
		// A failure: exit 1 with its line.
		{"delete-users", []string{"--ids-file", invalidIDs, "--requester", "r"}, 1, "relay delete-users: no valid id in --ids-file"},
		// Items failed and reported: exit 1, no "relay NAME:" line.
		{"feedback", []string{"--credentials", creds, "--project", "web", "--feedback-url", closed, "--source", "s", "--file", badItems}, 1, ""},
	} {
		r := runCmd(context.Background(), c.name, c.args...)
		if r.code != c.code {
			t.Errorf("%s %q: %v", c.name, c.args, r)
			continue
		}
		if c.stderr == "" && strings.Contains(r.stderr, "relay "+c.name+":") || !strings.Contains(r.stderr, c.stderr) {
			t.Errorf("%s %q: stderr %q, want %q", c.name, c.args, r.stderr, c.stderr)
		}
	}
}
