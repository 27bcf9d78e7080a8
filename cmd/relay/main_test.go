package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"go.uber.org/zap"
)

// TestRunRefusals: a bad configuration exits 2 with one line on stderr and
// starts nothing.
func TestRunRefusals(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"max-batch-events", []string{"--max-batch-events", "2000"}, nil, "--max-batch-events 2000 is above 1999"},
		{"credentials without token", []string{"--credentials", "x.yaml"}, nil, "--credentials needs an admin token"},
		{"admin listener open to the network", []string{"--admin-listen", "0.0.0.0:0"}, nil, `--admin-listen "0.0.0.0:0" is not a loopback address and no admin-token (or admin-token-file) is set`},
		{"credentials file invalid", []string{"--credentials", "../../internal/credentials/testdata/unknown_key.yaml", "--admin-token", "t0ken"}, nil, "--credentials: "},
		{"token with white space", []string{"--admin-token", "t0 ken"}, nil, "--admin-token: "},
		{"env value", nil, []string{"RELAY_SPOOL_MAX_BYTES=lots"}, "spool-max-bytes (from variable RELAY_SPOOL_MAX_BYTES)"},
		{"unknown subcommand-like argument", []string{"frobnicate"}, nil, `unexpected argument "frobnicate"`},
		{"spool without a subcommand", []string{"spool"}, nil, "usage: relay spool (dump|verify|salvage|import)"},
		// The operator commands go to operator.Main, each under its own name.
		{"export without flags", []string{"export"}, nil, "relay export: --start and --end are required"},
		{"dsar without flags", []string{"dsar"}, nil, "relay dsar: bad DSAR request"},
		{"delete-users without flags", []string{"delete-users"}, nil, "relay delete-users: --ids-file is required"},
		{"feedback without flags", []string{"feedback"}, nil, "relay feedback: --source is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tt.args, tt.env, &stdout, &stderr)
			if code != exitUsage {
				t.Fatalf("exit %d, want %d; stderr %q", code, exitUsage, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.want) || strings.Count(stderr.String(), "\n") != 1 {
				t.Fatalf("stderr %q: want one line containing %q", stderr.String(), tt.want)
			}
		})
	}
}

func TestVersionAndHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"version"}, nil, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "relay ") {
		t.Fatalf("version: %d %q", code, stdout.String())
	}
	stdout.Reset()
	if code := run([]string{"--help"}, nil, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "RELAY_INGEST_URL") {
		t.Fatalf("help: %d %q", code, stderr.String())
	}
}

// TestLifecycle: stops run last-started first, all of them even when one
// fails, and the failures are returned.
func TestLifecycle(t *testing.T) {
	var order []string
	lc := &lifecycle{log: zap.NewNop()}
	boom := errors.New("boom")
	for _, name := range []string{"spool", "delivery", "ingest"} {
		lc.onStop(name, func(context.Context) error {
			order = append(order, name)
			if name == "delivery" {
				return boom
			}
			return nil
		})
	}
	err := lc.stopAll(context.Background())
	if got := strings.Join(order, ","); got != "ingest,delivery,spool" {
		t.Fatalf("stop order %s", got)
	}
	if !errors.Is(err, boom) {
		t.Fatalf("err %v, want boom", err)
	}
}

// TestServeSandbox runs the relay in-process in sandbox mode on real ports:
// the first log line says sandbox, both listeners answer /healthz, /readyz
// and /metrics work, an event is accepted and spooled, and a cancelled
// context stops everything cleanly.
func TestServeSandbox(t *testing.T) {
	r := startServe(t)
	ingestURL, adminURL := r.ingest, r.admin

	first := r.logs.All()[0]
	if !strings.Contains(first.Message, "sandbox mode") || first.ContextMap()["sandbox"] != true {
		t.Fatalf("first log line %q does not say sandbox mode", first.Message)
	}

	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, u := range []string{ingestURL + "/healthz", adminURL + "/healthz", adminURL + "/readyz"} {
		if code, body := get(u); code != 200 {
			t.Fatalf("%s: %d %s", u, code, body)
		}
	}
	resp, err := http.Post(ingestURL+"/2/httpapi", "application/json",
		strings.NewReader(`{"api_key":"sandbox-key","events":[{"event_type":"hello","device_id":"device-12345","insert_id":"iid-1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"events_ingested":1`) {
		t.Fatalf("post: %d %s", resp.StatusCode, b)
	}
	code, metrics := get(adminURL + "/metrics")
	if code != 200 {
		t.Fatalf("metrics %d", code)
	}
	for _, want := range []string{"relay_ingest_events_accepted_total 1", "go_goroutines", "process_open_fds"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// The admin API is mounted: group identify accepted (no token configured),
	// its lane listed with the events lane.
	resp, err = http.Post(adminURL+"/groupidentify", "application/x-www-form-urlencoded",
		strings.NewReader(`api_key=sandbox-key&identification=%5B%7B%22group_type%22%3A%22org%22%2C%22group_value%22%3A%22acme%22%2C%22group_properties%22%3A%7B%22plan%22%3A%22x%22%7D%7D%5D`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("groupidentify: %d %s", resp.StatusCode, b)
	}
	if code, body := get(adminURL + "/relay/v1/lanes"); code != 200 || !strings.Contains(body, `"kind":"groupidentify"`) || !strings.Contains(body, `"kind":"events"`) {
		t.Errorf("lanes: %d %s", code, body)
	}
	if code, _ := get(adminURL + "/sim/stats"); code != 200 {
		t.Errorf("sandbox /sim/stats on the admin listener: %d", code)
	}
	// The simulator's fault and test knobs are not mounted in the product.
	for _, p := range []string{"/sim/down", "/sim/fault", "/sim/reset"} {
		resp, err := http.Post(adminURL+p, "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("POST %s on the admin listener: %d, want 405", p, resp.StatusCode)
		}
	}
	// Both reach the sandbox upstream.
	polltest.Until(t, "delivery to the sandbox upstream", func() bool {
		_, evs := get(adminURL + "/sim/events?api_key=sandbox-key")
		_, gis := get(adminURL + "/sim/groupidentify?api_key=sandbox-key")
		return strings.Contains(evs, "iid-1") && strings.Contains(gis, "acme")
	})
	// The sim stores a request before the relay reads its answer, and a
	// form lane's request in flight at stop is abandoned (sent again at the
	// next start): wait until the relay acknowledged both, its lanes empty,
	// before stopping it (failed 1 of 6 runs under load without this).
	polltest.Until(t, "both acknowledged (every lane empty)", func() bool {
		_, body := get(adminURL + "/relay/v1/lanes")
		var out struct {
			Lanes []struct {
				Records int64 `json:"records"`
			} `json:"lanes"`
		}
		if json.Unmarshal([]byte(body), &out) != nil || len(out.Lanes) == 0 {
			return false
		}
		for _, l := range out.Lanes {
			if l.Records != 0 {
				return false
			}
		}
		return true
	})

	if err := r.stop(t); err != nil {
		t.Fatalf("serve: %v", err)
	}
	if _, err := http.Get(ingestURL + "/healthz"); err == nil {
		t.Fatal("ingest listener still open after stop")
	}

	// The spool was closed: dump can open it, and finds nothing left (both
	// records were delivered and their acks committed at close).
	var out bytes.Buffer
	if _, err := dump(context.Background(), r.dir, &out); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 {
		t.Fatalf("dump after delivery: %s", out.String())
	}
}

func TestDumpRefusals(t *testing.T) {
	var out bytes.Buffer
	if _, err := dump(context.Background(), filepath.Join(t.TempDir(), "missing"), &out); err == nil || !strings.Contains(err.Error(), "no spool in") {
		t.Fatalf("missing dir: %v", err)
	}
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := dump(context.Background(), f, &out); err == nil {
		t.Fatal("file accepted as data dir")
	}
}

// TestDumpRefusesLockedSpool: while a spool is open (as a running relay
// holds it), dump refuses at once instead of waiting.
func TestDumpRefusesLockedSpool(t *testing.T) {
	dir := t.TempDir()
	sp, err := spool.Open(spool.Config{Dir: dir, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	var out bytes.Buffer
	_, err = dump(context.Background(), dir, &out)
	if !errors.Is(err, errLocked) {
		t.Fatalf("dump of an open spool: %v, want errLocked", err)
	}
	// Refused by the lock check, not after the open's time-out.
	if !strings.Contains(err.Error(), "is locked") {
		t.Fatalf("dump of an open spool: %v, want the lock check's refusal", err)
	}
}

// TestDumpCounts: `relay spool dump` says on stderr how many records it
// printed, "0 records" for an empty spool, and keeps stdout JSON lines.
func TestDumpCounts(t *testing.T) {
	dir := t.TempDir()
	sp, err := spool.Open(spool.Config{Dir: dir, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"spool", "dump", "--data-dir", dir}, nil, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if stdout.Len() != 0 || stderr.String() != "relay spool dump: 0 records\n" {
		t.Fatalf("empty spool: stdout %q, stderr %q", stdout.String(), stderr.String())
	}

	sp, err = spool.Open(spool.Config{Dir: dir, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := sp.Lane(context.Background(), storage.LaneKey{Kind: storage.KindEvents, APIKey: "dump-key"})
	if err != nil {
		t.Fatal(err)
	}
	var b storage.Batch
	for i := range 3 {
		b.Add(storage.Record{OrderKey: []byte("d:dev"), Data: fmt.Appendf(nil, `{"event_type":"x","insert_id":"iid-%d"}`, i)})
	}
	if err := sp.Append(context.Background(), l, &b); err != nil {
		t.Fatal(err)
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"spool", "dump", "--data-dir", dir}, nil, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for i, line := range strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n") {
		if !json.Valid([]byte(line)) {
			t.Fatalf("stdout line %d is not JSON: %q", i+1, line)
		}
	}
	if strings.Count(stdout.String(), "\n") != 3 || stderr.String() != "relay spool dump: 3 records\n" {
		t.Fatalf("stdout %q, stderr %q", stdout.String(), stderr.String())
	}
}

// TestDumpContent: dump prints every live record of a closed spool as one
// JSON line with its lane label and data.
func TestDumpContent(t *testing.T) {
	dir := t.TempDir()
	sp, err := spool.Open(spool.Config{Dir: dir, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := sp.Lane(context.Background(), storage.LaneKey{Kind: storage.KindEvents, APIKey: "dump-key"})
	if err != nil {
		t.Fatal(err)
	}
	var b storage.Batch
	b.Add(storage.Record{OrderKey: []byte("d:dev"), Data: []byte(`{"event_type":"x","insert_id":"iid-1"}`)})
	b.Add(storage.Record{OrderKey: []byte("d:dev"), Data: []byte(`{"event_type":"x","insert_id":"iid-2"}`)})
	if err := sp.Append(context.Background(), l, &b); err != nil {
		t.Fatal(err)
	}
	label := l.Key().Label()
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := dump(context.Background(), dir, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if strings.Count(s, "\n") != 2 || !strings.Contains(s, `"insert_id":"iid-1"`) || !strings.Contains(s, `"insert_id":"iid-2"`) ||
		!strings.Contains(s, `"lane":"`+label+`"`) || strings.Contains(s, "dump-key") {
		t.Fatalf("dump: %s", s)
	}
}
