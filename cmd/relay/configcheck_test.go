package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigCheck: `relay config check` validates without serving, prints
// every setting with its source and no secret, and exits 0 or 2.
func TestConfigCheck(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "relay.yaml")
	if err := os.WriteFile(file, []byte("listen: 127.0.0.1:7000\nmax-batch-events: 10\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(dir, "credentials.yaml")
	if err := os.WriteFile(creds, []byte("projects:\n  - name: web-prod\n    api_key: \"k-s3cret-key\"\n    secret_key: \"s-s3cret-key\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, statErr := os.Stat("relay-data") // the default --data-dir
	var stdout, stderr bytes.Buffer
	code := run([]string{"config", "check", "--config", file, "--sync", "none", "--credentials", creds},
		[]string{"RELAY_ADMIN_TOKEN=t0ken-s3cret", "RELAY_INGEST_URL=https://u:pa55-s3cret@ingest.example.test"}, &stdout, &stderr)
	if code != exitOK {
		t.Fatalf("exit %d; stderr %q", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{
		"listen                127.0.0.1:7000",
		file + " line 1",
		"sync                  none",
		"flag --sync",
		"variable RELAY_ADMIN_TOKEN",
		"admin token: set (from variable RELAY_ADMIN_TOKEN)",
		"credentials: " + creds + ": 1 project(s) [web-prod]",
		"flush-interval        200ms",
		"mode: upstream https://u:xxxxx@ingest.example.test",
		"configuration OK",
	} {
		// Columns are as wide as the longest setting name: compare with
		// runs of spaces as one.
		if !strings.Contains(squeezeSpaces(out), squeezeSpaces(want)) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "s3cret") || strings.Contains(stderr.String(), "s3cret") {
		t.Fatalf("a secret is printed:\n%s", out)
	}
	if _, err := os.Stat("relay-data"); err == nil && statErr != nil {
		t.Fatal("config check created the data dir")
	}

	stdout.Reset()
	stderr.Reset()
	code = run([]string{"config", "check", "--config", file}, []string{"RELAY_FLUSH_INTERVAL=soon"}, &stdout, &stderr)
	if code != exitUsage || !strings.Contains(stderr.String(), "flush-interval (from variable RELAY_FLUSH_INTERVAL): invalid duration") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	if strings.Contains(stderr.String(), "--flush-interval") {
		t.Fatalf("error names a flag that was not given: %q", stderr.String())
	}

	stderr.Reset()
	if code := run([]string{"config"}, nil, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "usage: relay config check") {
		t.Fatalf("bare config: %d %q", code, stderr.String())
	}
}

// TestConfigCheckAdminOpen: config check refuses a non-loopback admin
// listener without a token as serving does (exit 2, one line naming
// admin-listen and admin-token), and says so when the operator opted out.
func TestConfigCheckAdminOpen(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"config", "check"}, []string{"RELAY_ADMIN_LISTEN=0.0.0.0:8081"}, &stdout, &stderr)
	if code != exitUsage || strings.Count(stderr.String(), "\n") != 1 ||
		!strings.Contains(stderr.String(), `admin-listen "0.0.0.0:8081" is not a loopback address and no admin-token (or admin-token-file) is set`) ||
		!strings.Contains(stderr.String(), "admin-insecure-open") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	code = run([]string{"config", "check", "--admin-insecure-open"}, []string{"RELAY_ADMIN_LISTEN=0.0.0.0:8081"}, &stdout, &stderr)
	if code != exitOK || !strings.Contains(stdout.String(), "every admin route is open to the network (admin-insecure-open, from flag --admin-insecure-open)") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}

func TestVersionFlag(t *testing.T) {
	for _, arg := range []string{"--version", "-version", "version"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{arg}, nil, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "relay ") {
			t.Fatalf("%s: %d %q", arg, code, stdout.String())
		}
	}
}

// squeezeSpaces replaces every run of spaces in s by one space.
func squeezeSpaces(s string) string {
	for strings.Contains(s, "  ") {
		s = strings.ReplaceAll(s, "  ", " ")
	}
	return s
}

// TestConfigCheckDiffFlags: --admin and --token-file go with --diff, and
// --diff's own flags are parsed with the settings (exit 2 when wrong).
func TestConfigCheckDiffFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--admin", "http://127.0.0.1:1"}, "--admin and --token-file go with --diff"},
		{[]string{"--token-file=/nonexistent"}, "--admin and --token-file go with --diff"},
		{[]string{"--diff", "--admin"}, "flag needs an argument: -admin"},
		{[]string{"--diff", "--admin", "http://127.0.0.1:1", "--token-file", "/nonexistent/token"}, "config check --diff: open /nonexistent/token"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"config", "check"}, tt.args...), nil, &stdout, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), tt.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tt.args, code, stderr.String(), tt.want)
		}
	}
}
