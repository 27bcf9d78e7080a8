package operator

import (
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/simtest"
)

func dsarArgs(up, creds, out string, extra ...string) []string {
	a := []string{"--credentials", creds, "--project", "web", "--analytics-url", up, "--out", out,
		"--poll-initial", "5ms", "--poll-max", "20ms"}
	return append(append(a, fastRetry...), extra...)
}

func TestDSARCommand(t *testing.T) {
	s, up, clk := startSim(t)
	clk.Set(time.Date(2026, 1, 10, 12, 0, 0, 0, time.UTC))
	ingest(t, up, `{"event_type":"jan","user_id":"alice"}`, `{"event_type":"other","user_id":"bobby"}`)
	clk.Set(time.Date(2026, 2, 10, 12, 0, 0, 0, time.UTC))
	ingest(t, up, `{"event_type":"feb1","user_id":"alice"}`, `{"event_type":"feb2","user_id":"alice"}`)
	creds, out := credsFile(t), t.TempDir()
	// The object store fails once: the download is retried.
	s.Inject(simtest.Fault{Status: 503, PathPrefix: "/objects/"})

	r := runCmd(context.Background(), "dsar", dsarArgs(up, creds, out, "--user-id", "alice", "--start", "2026-01-01", "--end", "2026-03-31")...)
	if r.code != 0 {
		t.Fatal(r)
	}
	if !strings.Contains(r.stderr, "processing") || !strings.Contains(r.stderr, "verified") {
		t.Errorf("progress lines missing:\n%s", r.stderr)
	}
	files, _ := filepath.Glob(filepath.Join(out, "dsar-*-*.json.gz"))
	if len(files) != 2 || !strings.Contains(r.stdout, "-0.json.gz\t1 lines") || !strings.Contains(r.stdout, "-1.json.gz\t2 lines") {
		t.Fatalf("files %v\n%v", files, r)
	}
	if s.PendingFaults() != 0 {
		t.Error("the injected 503 was not met")
	}
	// Resume: the files verify and are not downloaded again.
	id := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(files[0]), "dsar-"), "-0.json.gz")
	r = runCmd(context.Background(), "dsar", dsarArgs(up, creds, out, "--request-id", id)...)
	if r.code != 0 || strings.Count(r.stderr, "already downloaded") != 2 {
		t.Fatal(r)
	}
	// A damaged file is downloaded again.
	os.WriteFile(files[1], []byte("not gzip"), 0o644)
	r = runCmd(context.Background(), "dsar", dsarArgs(up, creds, out, "--request-id", id)...)
	if r.code != 0 || strings.Count(r.stderr, "already downloaded") != 1 || strings.Count(r.stderr, "verified") != 1 {
		t.Fatal(r)
	}
}

func TestDSARCommandFailedJob(t *testing.T) {
	_, up, _ := startSim(t)
	one := 1
	if err := (&simtest.Control{Base: up}).SetDSAR(context.Background(), simtest.DSARConfig{FailNext: &one}); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	r := runCmd(context.Background(), "dsar", dsarArgs(up, credsFile(t), out, "--svc-id", "42", "--start", "2026-01-01", "--end", "2026-01-31")...)
	if r.code != 1 || !strings.Contains(r.stderr, "failed upstream") {
		t.Fatal(r)
	}
	if files, _ := filepath.Glob(filepath.Join(out, "*")); len(files) != 0 {
		t.Errorf("files written for a failed request: %v", files)
	}
}

func TestDSARCommandUsage(t *testing.T) {
	creds := credsFile(t)
	for _, args := range [][]string{
		{"--credentials", creds, "--project", "web", "--out", "x", "--start", "2026-01-01", "--end", "2026-01-31"},
		{"--credentials", creds, "--project", "web", "--out", "x", "--user-id", "u", "--svc-id", "3", "--start", "2026-01-01", "--end", "2026-01-31"},
		{"--credentials", creds, "--project", "web", "--out", "x", "--user-id", "u", "--start", "2026-02-01", "--end", "2026-01-31"},
		{"--credentials", creds, "--org", "nope", "--out", "x", "--user-id", "u", "--start", "2026-01-01", "--end", "2026-01-31"},
		{"--credentials", creds, "--project", "web", "--user-id", "u", "--start", "2026-01-01", "--end", "2026-01-31"},
	} {
		if r := runCmd(context.Background(), "dsar", args...); r.code != 2 {
			t.Errorf("%v: %v", args, r)
		}
	}
}

// TestDSARCreateNotReplayed: a create whose answer is lost is not sent
// again (it may have created a request); a 503 answer is retried.
func TestDSARCreateNotReplayed(t *testing.T) {
	s, up, _ := startSim(t)
	creds := credsFile(t)
	args := dsarArgs(up, creds, t.TempDir(), "--user-id", "nobody", "--start", "2026-01-01", "--end", "2026-01-31")
	s.Inject(simtest.Fault{Drop: simtest.DropNoAnswer, PathPrefix: "/api/2/dsar/requests"})
	r := runCmd(context.Background(), "dsar", args...)
	if r.code != 1 || !strings.Contains(r.stderr, "not retried") {
		t.Fatal(r)
	}
	s.Inject(simtest.Fault{Status: 503, PathPrefix: "/api/2/dsar/requests"})
	r = runCmd(context.Background(), "dsar", args...)
	if r.code != 0 || !strings.Contains(r.stderr, "0 files") {
		t.Fatal(r)
	}
	var creates int
	for _, rec := range s.Requests() {
		if rec.Method == "POST" && rec.Path == "/api/2/dsar/requests" {
			creates++
		}
	}
	if creates != 3 { // lost, 503, created
		t.Fatalf("%d creates, want 3", creates)
	}
}

// TestVerifyGzipJSONLines: a downloaded output is kept only as a whole gzip
// stream of JSON objects; a cut one, a plain one and a bad line are refused.
func TestVerifyGzipJSONLines(t *testing.T) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write([]byte("{\"a\":1}\n\n{\"b\":2}\n"))
	zw.Close()
	whole := buf.Bytes()
	var bad bytes.Buffer
	zw = gzip.NewWriter(&bad)
	zw.Write([]byte("{\"a\":1}\n[2]\n"))
	zw.Close()
	dir := t.TempDir()
	for _, tt := range []struct {
		name  string
		data  []byte
		lines int64
		ok    bool
	}{
		{"whole", whole, 2, true},
		{"cut", whole[:len(whole)-6], 0, false},
		{"plain", []byte("{\"a\":1}\n"), 0, false},
		{"not an object", bad.Bytes(), 0, false},
	} {
		path := filepath.Join(dir, tt.name)
		if err := os.WriteFile(path, tt.data, 0o600); err != nil {
			t.Fatal(err)
		}
		n, err := verifyGzipJSONLines(path)
		if (err == nil) != tt.ok || (tt.ok && n != tt.lines) {
			t.Errorf("%s: %d lines, %v", tt.name, n, err)
		}
	}
}
