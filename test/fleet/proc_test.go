package fleet

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// TestMain removes the binaries the tests shared (see binaries).
func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// built is the relay and nats-server binaries, built once per run of the
// test binary (each build is a link of tens of MB: seconds on a loaded
// machine) into dir, which TestMain removes.
var built struct {
	once sync.Once
	dir  string
	env  env
}

// binaries returns the relay and nats-server binaries, built by the first
// test that asks; it fails the test when that build failed.
func binaries(t *testing.T) env {
	t.Helper()
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "fleet-test-bin-")
		if err != nil {
			t.Fatal(err)
		}
		built.dir = dir
		// harness.Build builds into this test's temp dir, removed when
		// the test ends: linked out of it (unless it names E2E_RELAY_BIN).
		relay := harness.Build(t)
		if os.Getenv("E2E_RELAY_BIN") == "" {
			if err := os.Link(relay, filepath.Join(dir, "relay")); err != nil {
				t.Fatal(err)
			}
			relay = filepath.Join(dir, "relay")
		}
		built.env = env{relayBin: relay, natsBin: buildNATSServer(t, dir)}
	})
	if built.env.natsBin == "" {
		t.Fatal("the relay or nats-server build failed (in an earlier test)")
	}
	return built.env
}

// proc is one started process (a nats-server node or a relay). Its output
// is appended to log across restarts; Cleanup kills it.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when cmd has exited
	err  error         // cmd.Wait's answer, once done
}

// startProc runs bin with args, its output appended to logPath.
func startProc(t *testing.T, name, bin, logPath string, args ...string) *proc {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = harness.CleanEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		if p.running() {
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *proc) running() bool {
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL and waits (polltest.Max at most) for the process to end.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && p.running() {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(polltest.Max):
		t.Fatalf("%s: alive %v after SIGKILL", p.name, polltest.Max)
	}
}

// tail is the last n bytes of the process's log.
func (p *proc) tail(n int) string {
	b, _ := os.ReadFile(p.log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// get answers the status of a GET of url, 0 on a transport error.
func get(hc *http.Client, url string) int {
	resp, err := hc.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
