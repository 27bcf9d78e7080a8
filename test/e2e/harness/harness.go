// Package harness starts the real relay binary and its simulated upstream
// (`relay sim`) as separate processes on 127.0.0.1 for the binary-level
// tests under test/. The simulator runs in its own process so that it
// survives SIGKILLs of the relay; tests read what it ingested over its /sim/
// routes (internal/sim's Control).
//
// Invariants: every process a test starts is killed by t.Cleanup; every
// address is 127.0.0.1 with a free port (see FreeAddr); every wait is
// bounded in time.
package harness

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/porttest"
	"github.com/svcrelay/relay/internal/simtest"
)

// Build builds the relay binary into a temp dir (once for all the tests
// after ShareBuild) and returns its path. When
// E2E_RELAY_BIN names a binary, that one is used instead (for iterating on
// the tests while the checkout does not build; CI leaves it unset).
func Build(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("E2E_RELAY_BIN"); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("E2E_RELAY_BIN: %v", err)
		}
		t.Logf("using E2E_RELAY_BIN=%s, not a fresh build", bin)
		return bin
	}
	trackSources(t)
	shared.Lock()
	defer shared.Unlock()
	if shared.bin != "" {
		return shared.bin
	}
	dir := shared.dir
	if dir == "" {
		dir = t.TempDir()
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	bin := filepath.Join(dir, "relay")
	cmd := exec.Command(goBin, "build", "-o", bin, "github.com/svcrelay/relay/cmd/relay")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if shared.dir != "" {
		shared.bin = bin
	}
	return bin
}

// shared is the one build of the test binary's tests after ShareBuild.
var shared struct {
	sync.Mutex
	dir string // ShareBuild's; "" builds once per test
	bin string // built in dir
}

// ShareBuild makes Build build the relay once for all the tests of the
// test binary, into dir, which outlives every test: TestMain makes it
// before m.Run and removes it after. (Linking the relay takes seconds of
// CPU on a loaded machine: once per test adds up where tests run at once.)
func ShareBuild(dir string) {
	shared.Lock()
	defer shared.Unlock()
	shared.dir, shared.bin = dir, ""
}

// trackSources stats the module's non-test Go sources: the go command
// caches a test result by the files the test touched, and the binary is
// built in a subprocess, so without this an edit to the relay would not
// invalidate a cached pass.
func trackSources(t testing.TB) {
	t.Helper()
	root := moduleRoot(t)
	for _, f := range []string{"go.mod", "go.sum"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{"cmd", "internal", "test/e2e/harness/simserver"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
				_, err = os.Stat(p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// moduleRoot finds the directory of go.mod above the working directory.
func moduleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		dir = filepath.Dir(dir)
	}
	t.Fatal("go.mod not found above the test's directory")
	return ""
}

// ModuleRoot is the checkout's root directory (where go.mod is).
func ModuleRoot(t testing.TB) string { return moduleRoot(t) }

// FreeAddr returns a 127.0.0.1 address nothing listens on (just freed),
// for a process started later (which may restart on it): a port below the
// kernel's ephemeral range (porttest).
func FreeAddr(t testing.TB) string {
	t.Helper()
	ports, err := porttest.Free(1)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", ports[0])
}

// CleanEnv is the environment without RELAY_* variables.
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RELAY_") {
			env = append(env, kv)
		}
	}
	return env
}

// Proc is one started process of the relay binary.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	Log  string // path of its combined stdout/stderr
	done chan struct{}
	err  error
}

// start runs bin with args, its output appended to logPath.
func start(t testing.TB, name, bin, logPath string, args ...string) *Proc {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = CleanEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	p := &Proc{Name: name, Cmd: cmd, Log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.Exited() {
			p.Cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill sends SIGKILL and waits (polltest.Max at most) for the process to end.
func (p *Proc) Kill(t testing.TB) {
	t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil && !p.Exited() {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(polltest.Max):
		t.Fatalf("%s: did not exit %v after SIGKILL", p.Name, polltest.Max)
	}
}

// Stop sends SIGTERM and returns the exit error (nil for status 0); after
// wait (at least polltest.Max: wait is what a quiet machine needs, and a
// shutdown that hangs is caught all the same) it kills the process and
// fails the test.
func (p *Proc) Stop(t testing.TB, wait time.Duration) error {
	t.Helper()
	wait = max(wait, polltest.Max)
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil && !p.Exited() {
		t.Fatal(err)
	}
	select {
	case <-p.done:
		return p.err
	case <-time.After(wait):
		p.Cmd.Process.Kill()
		<-p.done
		t.Fatalf("%s: did not stop within %v of SIGTERM (log %s)", p.Name, wait, p.Log)
		return nil
	}
}

// LogTail is the last n bytes of the process's log.
func (p *Proc) LogTail(n int) string {
	b, _ := os.ReadFile(p.Log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// waitHealthy polls url until it answers 200, the process exits, or
// polltest.Max passes (a restart on a full spool under load may take seconds).
func (p *Proc) waitHealthy(t testing.TB, url string) {
	t.Helper()
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(polltest.Max)
	for time.Now().Before(deadline) {
		if p.Exited() {
			t.Fatalf("%s exited during start: %v\n%s", p.Name, p.err, p.LogTail(4000))
		}
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.Cmd.Process.Kill()
	t.Fatalf("%s not healthy within %v\n%s", p.Name, polltest.Max, p.LogTail(4000))
}

// Sim is a `relay sim` process (StartSim) or a simserver one (StartFaultSim).
type Sim struct {
	*Proc
	Base string // http://127.0.0.1:PORT
	Ctl  *simtest.Control
}

// StartSim starts `relay sim` on a free port with the extra flags and waits
// for /sim/healthz. Its /sim/ routes only read (the product has no fault
// injection); tests that inject faults use StartFaultSim.
func StartSim(t testing.TB, bin, dir string, extra ...string) *Sim {
	t.Helper()
	return startSim(t, bin, dir, append([]string{"sim"}, extra...))
}

// StartFaultSim builds and starts the simserver test helper (the simulated
// upstream with internal/simtest's fault routes) on a free port with the
// extra flags (those of `relay sim`), and waits for /sim/healthz.
func StartFaultSim(t testing.TB, dir string, extra ...string) *Sim {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	bin := filepath.Join(t.TempDir(), "simserver")
	cmd := exec.Command(goBin, "build", "-o", bin, "github.com/svcrelay/relay/test/e2e/harness/simserver")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build simserver: %v\n%s", err, out)
	}
	return startSim(t, bin, dir, extra)
}

func startSim(t testing.TB, bin, dir string, args []string) *Sim {
	t.Helper()
	addr := FreeAddr(t)
	args = append(args, "--listen", addr, "--log-format", "json", "--log-level", "warn")
	p := start(t, "sim", bin, filepath.Join(dir, "sim.log"), args...)
	base := "http://" + addr
	p.waitHealthy(t, base+"/sim/healthz")
	return &Sim{Proc: p, Base: base, Ctl: &simtest.Control{Base: base, Client: &http.Client{Timeout: 30 * time.Second}}}
}

// RelayOpts are what a test chooses of a relay's command line.
type RelayOpts struct {
	Listen, AdminListen string // fixed across restarts; "" picks free ones
	DataDir             string
	IngestURL           string
	Extra               []string // more flags
}

// Relay is a serving relay process.
type Relay struct {
	*Proc
	Listen, AdminListen string
}

// StartRelay starts the relay and waits until its ingest /healthz answers.
// Its log goes to dir/relay.log (appended across restarts).
func StartRelay(t testing.TB, bin, dir string, o *RelayOpts) *Relay {
	t.Helper()
	if o.Listen == "" {
		o.Listen = FreeAddr(t)
	}
	if o.AdminListen == "" {
		o.AdminListen = FreeAddr(t)
	}
	args := []string{
		"--listen", o.Listen,
		"--admin-listen", o.AdminListen,
		"--data-dir", o.DataDir,
		"--spool-min-free-bytes", "0",
		"--log-format", "json",
	}
	if o.IngestURL != "" {
		args = append(args, "--ingest-url", o.IngestURL)
	}
	args = append(args, o.Extra...)
	p := start(t, "relay", bin, filepath.Join(dir, "relay.log"), args...)
	p.waitHealthy(t, "http://"+o.Listen+"/healthz")
	return &Relay{Proc: p, Listen: o.Listen, AdminListen: o.AdminListen}
}

// Metric reads the sum of the samples of the relay's metric name whose
// label text contains every one of labels (e.g. `code="200"`); 0 when none.
func (r *Relay) Metric(name string, labels ...string) (float64, error) {
	resp, err := (&http.Client{Timeout: polltest.Max}).Get("http://" + r.AdminListen + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		var v float64
		if i := strings.LastIndexByte(rest, ' '); i >= 0 {
			if _, err := fmt.Sscan(rest[i+1:], &v); err == nil {
				sum += v
			}
		}
	}
	return sum, sc.Err()
}

// NewClient is an HTTP client for posting to the relay, for tests that fail
// on an error: its time-out is polltest.Max, not the 5 s a relay committing to
// a busy disk on a loaded machine could reach.
func NewClient() *http.Client { return &http.Client{Timeout: polltest.Max} }

// Post sends body to the relay's ingest path and returns status and body.
func (r *Relay) Post(hc *http.Client, path string, body []byte) (int, []byte, error) {
	resp, err := hc.Post("http://"+r.Listen+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes(), err
}

// SeqEvent is what the end-to-end tests read back of an event they sent:
// its device, its insert_id and the sequence number they put in its
// event_properties.
type SeqEvent struct {
	DeviceID        string `json:"device_id"`
	InsertID        string `json:"insert_id"`
	EventProperties struct {
		Seq int `json:"seq"`
	} `json:"event_properties"`
}
