package main

import (
	"bufio"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
)

func TestDefaultMemoryLimit(t *testing.T) {
	tests := []struct {
		name    string
		environ []string
		want    bool
	}{
		{"no environment", nil, true},
		{"other variables", []string{"HOME=/root", "GOGC=100", "XGOMEMLIMIT=1GiB"}, true},
		{"GOMEMLIMIT set", []string{"HOME=/root", "GOMEMLIMIT=1GiB"}, false},
		{"GOMEMLIMIT off", []string{"GOMEMLIMIT=off"}, false},
		{"GOMEMLIMIT empty (the runtime ignores it)", []string{"GOMEMLIMIT="}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limit, ok := defaultMemoryLimit(tt.environ)
			if ok != tt.want || (ok && limit != DefaultMemoryLimit) {
				t.Fatalf("got %d %v, want set=%v", limit, ok, tt.want)
			}
		})
	}
}

func TestMemoryLimitField(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	for _, tt := range []struct {
		limit int64
		want  string
	}{
		{math.MaxInt64, "none"},
		{128 << 20, "128 MiB"},
		{1_500_000_000, "1500000000 bytes"},
	} {
		debug.SetMemoryLimit(tt.limit)
		if got := memoryLimitField().String; got != tt.want {
			t.Errorf("limit %d logged as %q, want %q", tt.limit, got, tt.want)
		}
	}
}

// TestRelayProcessMemoryLimit runs the relay (this test binary re-executed
// as `relay` in sandbox mode) and reads the memory limit its configuration
// log line reports: the default without GOMEMLIMIT, GOMEMLIMIT's own value
// (the runtime applies it; the relay must not override it) otherwise.
func TestRelayProcessMemoryLimit(t *testing.T) {
	tests := []struct {
		env, want string
	}{
		{"", "120 MiB"},
		{"GOMEMLIMIT=200MiB", "200 MiB"},
		{"GOMEMLIMIT=off", "none"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := childConfig(t, tt.env).MemoryLimit; got != tt.want {
				t.Fatalf("with %q the relay logged memory_limit %q, want %q", tt.env, got, tt.want)
			}
		})
	}
}

func TestDefaultMaxProcs(t *testing.T) {
	tests := []struct {
		name        string
		environ     []string
		procs, cpus int
		want        int // 0: left as it is
	}{
		{"no limit", nil, 2, 2, 3},
		{"one CPU", []string{"HOME=/root"}, 1, 1, 2},
		{"GOMAXPROCS set", []string{"GOMAXPROCS=2"}, 2, 2, 0},
		{"GOMAXPROCS empty (the runtime ignores it)", []string{"GOMAXPROCS="}, 8, 8, 9},
		{"a CPU limit below the CPUs", nil, 2, 8, 0},
		{"raised already (run called again)", nil, 3, 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, ok := defaultMaxProcs(tt.environ, tt.procs, tt.cpus)
			if ok != (tt.want != 0) || (ok && n != tt.want) {
				t.Fatalf("got %d %v, want %d", n, ok, tt.want)
			}
		})
	}
}

// TestRelayProcessMaxProcs: the relay runs with one P more than its
// default when GOMAXPROCS is not set and no CPU limit lowered the default,
// and with GOMAXPROCS's own value when it is set.
func TestRelayProcessMaxProcs(t *testing.T) {
	if got := childConfig(t, "GOMAXPROCS=1").GOMAXPROCS; got != 1 {
		t.Errorf("with GOMAXPROCS=1 the relay logged gomaxprocs %d", got)
	}
	if os.Getenv("GOMAXPROCS") != "" {
		t.Skip("GOMAXPROCS is set for the test: the child's default is unknown")
	}
	// The default, as the child's runtime sets it: not this process's
	// GOMAXPROCS, which go test's -cpu flag sets (with -cpu 1 the test
	// wanted 1 and failed).
	prev := runtime.GOMAXPROCS(0)
	runtime.SetDefaultGOMAXPROCS()
	want := runtime.GOMAXPROCS(prev)
	if want == runtime.NumCPU() {
		want++
	}
	if got := childConfig(t, "").GOMAXPROCS; got != want {
		t.Errorf("without GOMAXPROCS the relay logged gomaxprocs %d, want %d", got, want)
	}
}

// TestMain lets the test binary run as the relay: with RELAY_TEST_CHILD=1
// it calls run with the arguments after "--".
func TestMain(m *testing.M) {
	if os.Getenv("RELAY_TEST_CHILD") == "1" {
		args := os.Args[1:]
		for i, a := range args {
			if a == "--" {
				args = args[i+1:]
				break
			}
		}
		os.Exit(run(args, os.Environ(), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// configLine is what the tests read of the relay's configuration log line.
type configLine struct {
	Msg         string `json:"msg"`
	MemoryLimit string `json:"memory_limit"`
	GOMAXPROCS  int    `json:"gomaxprocs"`
}

// childConfig starts the relay as a child process with env added (and
// without the test's own GOMEMLIMIT and GOMAXPROCS), waits for its
// configuration log line, stops it with SIGTERM and returns the line.
func childConfig(t *testing.T, env string) configLine {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	cmd := exec.Command(os.Args[0], "-test.run=^$", "--",
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", dir,
		"--spool-min-free-bytes", "0", "--drain-timeout", "1s")
	cmd.Env = append(without(os.Environ(), "GOMEMLIMIT=", "GOMAXPROCS="), "RELAY_TEST_CHILD=1")
	if env != "" {
		cmd.Env = append(cmd.Env, env)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	found := make(chan configLine, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var line configLine
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "configuration" {
				found <- line
			}
		}
		exited <- cmd.Wait()
	}()
	var got configLine
	select {
	case got = <-found:
	case err := <-exited:
		t.Fatalf("relay exited before its configuration line: %v", err)
	case <-time.After(polltest.Max):
		cmd.Process.Kill()
		t.Fatalf("no configuration line within %v", polltest.Max)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("relay stopped with %v", err)
		}
	case <-time.After(polltest.Max):
		cmd.Process.Kill()
		t.Fatalf("relay did not stop within %v of SIGTERM", polltest.Max)
	}
	return got
}

// without returns environ without the variables of the given prefixes.
func without(environ []string, prefixes ...string) []string {
	var out []string
	for _, kv := range environ {
		if !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(kv, p) }) {
			out = append(out, kv)
		}
	}
	return out
}
