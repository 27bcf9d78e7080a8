package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/backfill"
	"github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/polltest"
)

// TestSummaryThrottled: the summary gives the 429s per million events sent,
// 0 when nothing was sent.
func TestSummaryThrottled(t *testing.T) {
	for _, tt := range []struct {
		c    backfill.Counts
		want string
	}{
		{backfill.Counts{Sent: 2_000_000, Throttled: 3, Elapsed: time.Second}, "3 answered 429 (1.5 per million events sent)"},
		{backfill.Counts{}, "0 answered 429 (0.0 per million events sent)"},
	} {
		if s := summary(tt.c, backfill.Config{}); !strings.Contains(s, tt.want) {
			t.Errorf("%q lacks %q", s, tt.want)
		}
	}
}

// migrateFields are the fields of an ingested event that the export
// carries and ingestion takes: a migration must keep each one.
var migrateFields = []string{"event_type", "user_id", "device_id", "time", "event_id", "session_id",
	"event_properties", "user_properties", "groups", "group_properties",
	"platform", "os_name", "os_version", "country", "language", "ip"}

// TestMigrate: `relay migrate` exports a project from the simulator and
// backfills it into a second project; every field ingestion takes is the
// same in both (an object field absent in the source is {} in the export),
// insert_ids are kept, and one is derived for events that had none. Run
// again, it sends nothing.
func TestMigrate(t *testing.T) {
	s, up, clk := startSim(t)
	clk.Set(time.Date(2026, 3, 1, 10, 15, 0, 0, time.UTC))
	var evs []string
	for i := range 40 {
		ev := fmt.Sprintf(`{"event_type":"t%d","device_id":"device-%d","time":%d,"event_id":%d,"session_id":%d,`+
			`"event_properties":{"i":%d,"deep":{"a":[1,"x",null]}},"platform":"iOS","os_name":"ios","os_version":"17.1",`+
			`"country":"France","language":"fr","ip":"192.0.2.%d"`, i, i%7, 1772359200000+int64(i)*1000, i, 1772359000000+int64(i%3), i, i)
		if i%2 == 0 {
			ev += fmt.Sprintf(`,"user_id":"user-%d","user_properties":{"$set":{"plan":"pro"}},"groups":{"org":"acme"},"group_properties":{"size":%d}`, i%5, i)
		}
		if i%3 != 0 {
			ev += fmt.Sprintf(`,"insert_id":"orig-%d"`, i)
		}
		evs = append(evs, ev+"}")
	}
	ingest(t, up, evs...)
	clk.Set(time.Time{}) // the real clock again, for the rate windows of the import

	creds := filepath.Join(t.TempDir(), "creds.yaml")
	os.WriteFile(creds, []byte(forwardtest.WebCredsYAML+`  - name: copy
    api_key: "copy-key"
    secret_key: "copy-secret"
`), 0o600)
	dir := t.TempDir()
	args := append([]string{"--credentials", creds, "--from-project", "web", "--to-project", "copy",
		"--analytics-url", up, "--ingest-url", up, "--start", "20260301T00", "--end", "20260301T23",
		"--data-dir", dir, "--max-eps", "5000"}, fastRetry...)
	// Interrupted during the backfill, once it sent an event, then run
	// again: it resumes at the backfill. Paced at 4 events/s (one a
	// request), the other 39 would take 10 s: however late a loaded
	// machine sees the first, the cancel comes before the end.
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer cancel()
		for deadline := time.Now().Add(polltest.Max); len(s.Events("copy-key")) < 1 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
	}()
	slow := append(append([]string(nil), args...), "--max-eps", "4")
	r := runCmd(ctx, "migrate", slow...)
	if r.code != 1 || !strings.Contains(r.stderr, "run the same command again to resume") {
		t.Fatal(r)
	}
	r = runCmd(context.Background(), "migrate", args...)
	if r.code != 0 || !strings.Contains(r.stderr, "export done already") ||
		!strings.Contains(r.stdout, "40 events read, 0 waiting, 0 dead letters") {
		t.Fatal(r)
	}
	src, dst := s.Events("proj"), s.Events("copy-key")
	if len(src) != 40 || len(dst) != 40 {
		t.Fatalf("%d events in the source, %d in the copy", len(src), len(dst))
	}
	// Order is kept per device only: match by event_id.
	byID := map[any]int{}
	for j := range dst {
		byID[fields(t, dst[j].Raw)["event_id"]] = j
	}
	for i := range src {
		a := fields(t, src[i].Raw)
		j, ok := byID[a["event_id"]]
		if !ok {
			t.Fatalf("event %d is not in the copy", i)
		}
		b := fields(t, dst[j].Raw)
		for _, f := range migrateFields {
			if !reflect.DeepEqual(a[f], b[f]) {
				t.Errorf("event %d: %s %v became %v", i, f, a[f], b[f])
			}
		}
		got, want := dst[j].InsertID, src[i].InsertID
		if want == "" && (!strings.HasPrefix(got, "bf-") || len(got) != 35) || want != "" && got != want {
			t.Errorf("event %d: insert_id %q became %q", i, src[i].InsertID, dst[j].InsertID)
		}
	}

	requests := s.Stats().Requests
	r = runCmd(context.Background(), "migrate", args...)
	if r.code != 0 || !strings.Contains(r.stderr, "export done already") {
		t.Fatal(r)
	}
	if n := s.Stats().Requests; n != requests {
		t.Fatalf("a second migrate sent %d requests", n-requests)
	}
}

// fields decodes an event, with the object fields an export always carries
// as {} when absent.
func fields(t *testing.T, raw []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"event_properties", "user_properties", "groups", "group_properties"} {
		if m[f] == nil {
			m[f] = map[string]any{}
		}
	}
	return m
}

// TestBackfillCommand: usage errors exit 2; --api-key may name a project of
// --credentials; a finished run exits 0 with its summary on stdout and,
// off a terminal, plain progress lines on stderr.
func TestBackfillCommand(t *testing.T) {
	s, up, _ := startSim(t)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	os.WriteFile(in, []byte(`{"event_type":"a","device_id":"device-1"}`+"\n"+`{"events":[{"event_type":"b","device_id":"device-1"}]}`+"\n"), 0o644)
	creds := credsFile(t)
	data := filepath.Join(dir, "data")
	for _, c := range []struct {
		args   []string
		stderr string
	}{
		{[]string{"--ingest-url", up, "--data-dir", data, in}, "--api-key is required"},
		{[]string{"--ingest-url", up, "--api-key", "k", "--data-dir", data}, "no input file"},
		{[]string{"--ingest-url", up, "--api-key", "k", in}, "--data-dir is required"},
		{[]string{"--api-key", "k", "--data-dir", data, in}, "--ingest-url is required"},
		{[]string{"--ingest-url", up, "--api-key", "k", "--data-dir", data, "--max-eps", "0", in}, "--max-eps and --device-eps must be at least 1"},
		{[]string{"--ingest-url", up, "--api-key", "k", "--data-dir", data, "--sync", "sometimes", in}, "--sync must be always or none"},
	} {
		if r := runCmd(context.Background(), "backfill", c.args...); r.code != 2 || !strings.Contains(r.stderr, c.stderr) {
			t.Errorf("%q: %v", c.args, r)
		}
	}
	r := runCmd(context.Background(), "backfill", "--credentials", creds, "--api-key", "web", "--ingest-url", up, "--data-dir", data, in)
	if r.code != 0 || !strings.Contains(r.stdout, "backfill: 2 events read, 0 waiting, 0 dead letters") ||
		!strings.HasPrefix(r.stderr, "read ") {
		t.Fatal(r)
	}
	if n := len(s.Events("proj")); n != 2 { // web's api_key
		t.Fatalf("%d events in the project named by --api-key", n)
	}
}
