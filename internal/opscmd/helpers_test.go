package opscmd

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

func runCmd(ctx context.Context, main func(context.Context, []string, io.Writer, io.Writer) int, args ...string) result {
	var out, errb bytes.Buffer
	code := main(ctx, args, &out, &errb)
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
