package operator

import (
	"archive/zip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

// exportFixture ingests events of proj at 2026-03-01 10:xx and 11:xx and
// 2026-03-03 05:xx (nothing on 03-02).
func exportFixture(t *testing.T) (*simtest.Sim, string) {
	s, up, clk := startSim(t)
	clk.Set(time.Date(2026, 3, 1, 10, 15, 0, 0, time.UTC))
	ingest(t, up, `{"event_type":"a","user_id":"alice"}`)
	clk.Set(time.Date(2026, 3, 1, 11, 15, 0, 0, time.UTC))
	ingest(t, up, `{"event_type":"b","user_id":"alice"}`)
	clk.Set(time.Date(2026, 3, 3, 5, 15, 0, 0, time.UTC))
	ingest(t, up, `{"event_type":"c","user_id":"bobby"}`)
	return s, up
}

func exportArgs(up, creds, out string, extra ...string) []string {
	a := []string{"--credentials", creds, "--project", "web", "--analytics-url", up,
		"--start", "20260301T00", "--end", "20260303T23", "--out", out}
	return append(append(a, fastRetry...), extra...)
}

func eventTypes(t *testing.T, jsonl string) string {
	t.Helper()
	var types []string
	for _, l := range strings.Split(strings.TrimSpace(jsonl), "\n") {
		var r sim.ExportRecord
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		types = append(types, r.EventType)
	}
	return strings.Join(types, ",")
}

// TestExportSplitsAndMerges: a 400 (over the size limit) halves the piece
// until it passes, a 404 is an empty piece, and the pieces merge into one
// archive and into JSON lines.
func TestExportSplitsAndMerges(t *testing.T) {
	_, up := exportFixture(t)
	ctl := &simtest.Control{Base: up}
	ctx := context.Background()
	// One record is about 700 bytes: a range with two events is "too large".
	if err := ctl.SetExport(ctx, simtest.ExportConfig{MaxBytes: 1000}); err != nil {
		t.Fatal(err)
	}
	creds, dir := credsFile(t), t.TempDir()
	zipOut := filepath.Join(dir, "out.zip")
	r := runCmd(ctx, "export", exportArgs(up, creds, zipOut)...)
	if r.code != 0 || !strings.Contains(r.stderr, "refused with 400") || !strings.Contains(r.stderr, "no data (404)") {
		t.Fatal(r)
	}
	zr, err := zip.OpenReader(zipOut)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name[strings.IndexByte(f.Name, '_')+1:])
	}
	zr.Close()
	if strings.Join(names, " ") != "2026-03-01_10#0.json 2026-03-01_11#0.json 2026-03-03_5#0.json" {
		t.Fatalf("entries %v", names)
	}
	log, _ := ctl.ExportLog(ctx)
	var statuses []int
	for _, l := range log {
		statuses = append(statuses, l.Status)
	}
	t.Logf("requests: %d, statuses %v", len(log), statuses)

	jsonOut := filepath.Join(dir, "out.jsonl")
	r = runCmd(ctx, "export", exportArgs(up, creds, jsonOut, "--jsonl")...)
	b, _ := os.ReadFile(jsonOut)
	if r.code != 0 || eventTypes(t, string(b)) != "a,b,c" {
		t.Fatalf("%v\n%s", r, b)
	}
	if _, err := os.Stat(jsonOut + ".state.json"); !os.IsNotExist(err) {
		t.Errorf("state file left after success: %v", err)
	}
	// A single hour still refused cannot be split: a clear failure.
	ctl.SetExport(ctx, simtest.ExportConfig{MaxBytes: 10})
	r = runCmd(ctx, "export", exportArgs(up, creds, filepath.Join(dir, "x.zip"))...)
	if r.code != 1 || !strings.Contains(r.stderr, "object-storage export") {
		t.Fatal(r)
	}
	// Usage errors.
	if r := runCmd(ctx, "export", "--credentials", creds, "--project", "web", "--start", "20260301T00", "--end", "20260201T00", "--out", "x"); r.code != 2 {
		t.Fatal(r)
	}
}

// TestExportResumes interrupts a run after a few pieces and runs it again:
// the second run fetches only what the first did not finish, and the result
// equals an uninterrupted run's.
func TestExportResumes(t *testing.T) {
	s, up := exportFixture(t)
	ctl := &simtest.Control{Base: up}
	creds, dir := credsFile(t), t.TempDir()
	out := filepath.Join(dir, "out.jsonl")
	args := exportArgs(up, creds, out, "--jsonl", "--piece-hours", "2")
	s.SetLatency(20 * time.Millisecond)

	ctx, cancel := context.WithCancel(context.Background())
	stop := make(chan struct{})
	go func() { // cancel once the state file records 5 finished pieces (or after polltest.Max: the checks below fail then)
		defer cancel()
		for deadline := time.Now().Add(polltest.Max); time.Now().Before(deadline); {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			var st exportState
			if b, err := os.ReadFile(out + ".state.json"); err == nil && json.Unmarshal(b, &st) == nil && len(st.Pieces) >= 5 {
				return
			}
		}
	}()
	r := runCmd(ctx, "export", args...)
	close(stop)
	if r.code != 1 || !strings.Contains(r.stderr, "interrupted") {
		t.Fatalf("first run: %v", r)
	}
	var st exportState
	b, err := os.ReadFile(out + ".state.json")
	if err != nil || json.Unmarshal(b, &st) != nil || len(st.Pieces) < 5 || len(st.Pieces) >= 36 {
		t.Fatalf("state after interruption: %v %s", err, b)
	}
	done := make(map[string]bool)
	for _, p := range st.Pieces {
		done[p.Start] = true
	}
	// The interrupted piece's request may still be ending at the sim (its
	// export log is written when the handler ends): a probe sent now is
	// numbered after every request the sim began, and once every number
	// up to the probe's is in the request log, they all ended.
	resp, err := http.Post(up+"/2/httpapi", "application/json", strings.NewReader("{"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	reqs := s.Requests()
	probe := reqs[len(reqs)-1].Seq
	polltest.Until(t, "every request the sim began before the probe to end", func() bool {
		n := int64(0)
		for _, r := range s.Requests() {
			if r.Seq <= probe {
				n++
			}
		}
		return n == probe
	})
	before, _ := ctl.ExportLog(context.Background())

	s.SetLatency(0)
	r = runCmd(context.Background(), "export", args...)
	if r.code != 0 || !strings.Contains(r.stderr, "resuming") {
		t.Fatalf("second run: %v", r)
	}
	after, _ := ctl.ExportLog(context.Background())
	second := after[len(before):]
	for _, l := range second {
		if done[l.Start] {
			t.Errorf("piece %s was fetched again", l.Start)
		}
	}
	if len(second)+len(st.Pieces) != 36 {
		t.Errorf("second run fetched %d pieces, first finished %d: want 36 in all; second %+v; done %+v", len(second), len(st.Pieces), second, st.Pieces)
	}
	got, _ := os.ReadFile(out)
	full := filepath.Join(dir, "full.jsonl")
	if r := runCmd(context.Background(), "export", exportArgs(up, creds, full, "--jsonl", "--piece-hours", "2")...); r.code != 0 {
		t.Fatal(r)
	}
	want, _ := os.ReadFile(full)
	if string(got) != string(want) || eventTypes(t, string(got)) != "a,b,c" {
		t.Fatalf("resumed output differs:\n%s\nwant:\n%s", got, want)
	}
	// A state file of other arguments is refused.
	os.WriteFile(out+".state.json", []byte(`{"version":1,"project":"web","start":"20200101T00","end":"20200101T01"}`), 0o644)
	if r := runCmd(context.Background(), "export", args...); r.code != 1 || !strings.Contains(r.stderr, "another run") {
		t.Fatal(r)
	}
	_ = io.Discard
}

// TestExportRefetchesACutPiece: an archive whose answer is cut mid-body is
// fetched again, not recorded as done.
func TestExportRefetchesACutPiece(t *testing.T) {
	s, up, _ := startSim(t)
	syn := int64(1 << 20)
	if err := (&simtest.Control{Base: up}).SetExport(context.Background(), simtest.ExportConfig{SyntheticBytesPerHour: &syn}); err != nil {
		t.Fatal(err)
	}
	s.Inject(simtest.Fault{Drop: simtest.DropMidResponse, PathPrefix: "/api/2/export"})
	out := filepath.Join(t.TempDir(), "out.zip")
	args := append([]string{"--credentials", credsFile(t), "--project", "web", "--analytics-url", up,
		"--start", "20260101T00", "--end", "20260101T00", "--out", out}, fastRetry...)
	r := runCmd(context.Background(), "export", args...)
	if r.code != 0 || !strings.Contains(r.stderr, "was cut after") || !strings.Contains(r.stderr, "fetching it again") {
		t.Fatal(r)
	}
	zr, err := zip.OpenReader(out)
	if err != nil || len(zr.File) != 1 || zr.File[0].UncompressedSize64 < uint64(syn) {
		t.Fatalf("archive: %v", err)
	}
	zr.Close()
}

// TestExportTodo: the ranges left are the plan minus the finished pieces,
// whatever their sizes (pieces of a split piece included).
func TestExportTodo(t *testing.T) {
	x := &exporter{pieceHours: 6}
	x.whole, _ = exportRange("20260101T00", "20260101T23")
	for _, tc := range []struct {
		done [][2]string
		want string
	}{
		{nil, "00-05 06-11 12-17 18-23"},
		{[][2]string{{"20260101T06", "20260101T11"}}, "00-05 12-17 18-23"},
		{[][2]string{{"20260101T06", "20260101T08"}, {"20260101T13", "20260101T13"}}, "00-05 09-11 12-12 14-17 18-23"},
		{[][2]string{{"20260101T00", "20260101T23"}}, ""},
		{[][2]string{{"20260101T18", "20260101T20"}, {"20260101T22", "20260101T23"}}, "00-05 06-11 12-17 21-21"},
	} {
		x.state.Pieces = nil
		for _, d := range tc.done {
			x.state.Pieces = append(x.state.Pieces, donePiece{Start: d[0], End: d[1]})
		}
		var got []string
		for _, r := range x.todo() {
			got = append(got, r.Start.Format("15")+"-"+r.End.Format("15"))
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("done %v: todo %v, want %s", tc.done, got, tc.want)
		}
	}
}

func exportRange(s, e string) (forward.ExportRange, error) { return forward.ParseExportRange(s, e) }

// TestCommandsUseProjectOverride: a project's feedback_url in the
// credentials file is used without --feedback-url.
func TestCommandsUseProjectOverride(t *testing.T) {
	_, up, _ := startSim(t)
	creds := filepath.Join(t.TempDir(), "creds.yaml")
	os.WriteFile(creds, []byte("projects:\n  - name: eu\n    api_key: \"proj\"\n    secret_key: \"s\"\n    feedback_url: \""+up+"\"\n"), 0o600)
	items := filepath.Join(t.TempDir(), "items.jsonl")
	os.WriteFile(items, []byte(`{"unique_id":"a","body":"b"}`+"\n"), 0o644)
	r := runCmd(context.Background(), "feedback", "--credentials", creds, "--project", "eu", "--source", "s", "--file", items)
	if r.code != 0 || !strings.Contains(r.stderr, "1 items ingested") {
		t.Fatal(r)
	}
	r = runCmd(context.Background(), "export", "--credentials", creds, "--project", "eu", "--start", "20260101T00", "--end", "20260101T00", "--out", filepath.Join(t.TempDir(), "x"))
	if r.code != 2 || !strings.Contains(r.stderr, "--analytics-url") {
		t.Fatal(r)
	}
}
