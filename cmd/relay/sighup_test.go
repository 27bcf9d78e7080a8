package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/polltest"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// servedRelay is serve running in this process on 127.0.0.1 ports.
type servedRelay struct {
	admin      string // http://host:port
	ingest     string
	adminAddr  string // host:port
	ingestAddr string
	dir        string // the data directory
	logs       *observer.ObservedLogs

	cancel  context.CancelFunc
	done    chan error // serve's result
	stopped bool       // done was read
}

// startServe runs serve with args (plus free ports and a temporary data
// dir, which args may override) until the test ends, and returns once it
// logged "relay serving" (every listener open, every SIGHUP reloader in).
func startServe(t *testing.T, args ...string) *servedRelay {
	t.Helper()
	return startServeWith(t, serveHooks{}, args...)
}

// startServeWith is startServe with test hooks.
func startServeWith(t *testing.T, hooks serveHooks, args ...string) *servedRelay {
	t.Helper()
	return startServeArgs(t, hooks, append([]string{"--listen", "127.0.0.1:0"}, args...)...)
}

// startServeArgs is startServeWith without a default --listen (a test
// gives it in its --config file).
func startServeArgs(t *testing.T, hooks serveHooks, args ...string) *servedRelay {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	args = append([]string{
		"--admin-listen", "127.0.0.1:0", "--data-dir", dir,
		"--spool-min-free-bytes", "0", "--drain-timeout", "2s",
	}, args...)
	cfg, err := config.Load(args, nil)
	if err != nil {
		t.Fatal(err)
	}
	if hooks.load == nil { // a reload reads the same flags again, as run's
		hooks.load = func() (config.Config, error) { return config.Load(args, nil) }
	}
	var enab zapcore.LevelEnabler = zapcore.DebugLevel
	if hooks.level != nil {
		enab = hooks.level
	}
	core, logs := observer.New(enab)
	ctx, cancel := context.WithCancel(context.Background())
	r := &servedRelay{dir: cfg.DataDir, logs: logs, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- serveWith(ctx, func() {}, cfg, zap.New(core), hooks) }()
	t.Cleanup(func() { _ = r.stop(t) })
	r.waitLog(t, "relay serving", 1)
	addr := func(msg string) string { return logs.FilterMessage(msg).All()[0].ContextMap()["addr"].(string) }
	r.adminAddr, r.ingestAddr = addr("admin listening"), addr("ingest listening")
	r.admin, r.ingest = "http://"+r.adminAddr, "http://"+r.ingestAddr
	return r
}

// stop cancels serve and returns its result; once stopped, nil.
func (r *servedRelay) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	if r.stopped {
		return nil
	}
	r.stopped = true
	select {
	case err := <-r.done:
		return err
	case <-time.After(polltest.Max):
		t.Fatalf("serve did not stop within %v", polltest.Max)
		return nil
	}
}

// waitLog waits for n log lines with message msg; it fails at once if
// serve returns, and after polltest.Max.
func (r *servedRelay) waitLog(t *testing.T, msg string, n int) {
	t.Helper()
	polltest.Until(t, fmt.Sprintf("%d %q log lines", n, msg), func() bool {
		select {
		case err := <-r.done:
			r.stopped = true
			t.Fatalf("serve returned while waiting for %q: %v", msg, err)
		default:
		}
		return r.logs.FilterMessage(msg).Len() >= n
	})
}

func getWithToken(t *testing.T, url, token string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestSIGHUPReloads: SIGHUP swaps the admin token file and the credentials
// file for their new content, keeps both when the new files are bad, and
// does not stop the relay.
func TestSIGHUPReloads(t *testing.T) {
	dir := t.TempDir()
	tokenFile, credsFile := filepath.Join(dir, "admin.token"), filepath.Join(dir, "credentials.yaml")
	write := func(path, body string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(tokenFile, "token-one\n")
	write(credsFile, "projects:\n  - name: old-project\n    api_key: \"k-old\"\n    secret_key: \"s-old\"\n")
	r := startServe(t, "--admin-token-file", tokenFile, "--credentials", credsFile)
	lanes := r.admin + "/relay/v1/lanes"
	if code := getWithToken(t, lanes, "token-one"); code != 200 {
		t.Fatalf("first token: %d", code)
	}

	write(tokenFile, "token-two\n")
	write(credsFile, "projects:\n  - name: new-project\n    api_key: \"k-new\"\n    secret_key: \"s-new\"\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	r.waitLog(t, "reload: credentials reloaded", 1)
	if code := getWithToken(t, lanes, "token-two"); code != 200 {
		t.Fatalf("new token after SIGHUP: %d", code)
	}
	if code := getWithToken(t, lanes, "token-one"); code != 403 {
		t.Fatalf("old token after SIGHUP: %d, want 403", code)
	}
	e := r.logs.FilterMessage("reload: credentials reloaded").All()[0]
	if got := e.ContextMap()["credentials"]; got == nil {
		t.Fatal("the reload log does not show the new credentials' names")
	}

	// Bad new files: the configuration is refused whole, what is in force
	// stays, and the log says why.
	write(tokenFile, "two words\n")
	write(credsFile, "projects: [oops\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	r.waitLog(t, "configuration not reloaded; the settings in force stay", 1)
	if code := getWithToken(t, lanes, "token-two"); code != 200 {
		t.Fatalf("token after a bad reload: %d, want the one in force", code)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("serve: %v", err)
	}
}

// TestSIGHUPWarningNamesSource: the reload's warning about a token file
// others can read is said once, and says where the setting came from, not a
// flag not given.
func TestSIGHUPWarningNamesSource(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("a-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"RELAY_ADMIN_TOKEN_FILE=" + file}
	cfg, err := config.Load(nil, env)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	hup := &reloaders{}
	hup.add(func(c config.Config) { reloadFiles(c, log, func(*admintoken.Token) {}, func(*credentials.Store) {}) })
	r := newConfigReloader(cfg, func() (config.Config, error) { return config.Load(nil, env) }, hup, log)
	if res := r.reload("test"); !res.Reloaded {
		t.Fatalf("reload refused: %s", res.Error)
	}
	w := logs.FilterLevelExact(zapcore.WarnLevel).All()
	want := "admin-token-file " + file + " is readable by group or others: chmod 600 it (from variable RELAY_ADMIN_TOKEN_FILE)"
	if len(w) != 1 || w[0].Message != want {
		t.Fatalf("warnings %v, want one: %q", w, want)
	}
}
