package operator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

func TestFeedbackCommand(t *testing.T) {
	s, up, _ := startSim(t)
	var lines []string
	for i := range 230 {
		lines = append(lines, fmt.Sprintf(`{"unique_id":"item-%03d","body":"feedback %d","author":"a%d"}`, i, i, i))
	}
	// One item the upstream refuses (body too long), one breaking the documented part rules, one not JSON, a blank line.
	lines[17] = `{"unique_id":"too-long","body":"` + strings.Repeat("x", sim.FeedbackMaxBody+1) + `"}`
	lines[120] = `{"unique_id":"nested","conversation_parts":[{"body":"hi","conversation_parts":[{"body":"no"}]}]}`
	lines = append(lines, "", `{"unique_id":`)
	file := filepath.Join(t.TempDir(), "items.jsonl")
	os.WriteFile(file, []byte(strings.Join(lines, "\n")), 0o644)
	args := append([]string{"--credentials", credsFile(t), "--project", "web", "--feedback-url", up, "--source", "src-1", "--file", file}, fastRetry...)

	r := runCmd(context.Background(), "feedback", args...)
	if r.code != 1 {
		t.Fatal(r)
	}
	for _, want := range []string{"error\t18\ttoo-long\tbody is too long", "error\t121\tnested\t", "error\t232\t\t"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, r.stdout)
		}
	}
	if !strings.Contains(r.stderr, "228 items ingested, 3 failed, in 3 requests") {
		t.Errorf("summary:\n%s", r.stderr)
	}
	items, err := (&simtest.Control{Base: up}).FeedbackItems(context.Background(), "proj", "src-1")
	if err != nil || len(items) != 228 {
		t.Fatalf("upstream holds %d items (%v)", len(items), err)
	}
	var posts int
	for _, rec := range s.Requests() {
		if rec.Path == "/api/1/ai-feedback/ingest" {
			posts++
		}
	}
	if posts != 3 {
		t.Errorf("%d requests, want 3 (100 + 100 + 29 items)", posts)
	}
	// Sending again upserts: still 228 items, each updated twice.
	runCmd(context.Background(), "feedback", args...)
	items, _ = (&simtest.Control{Base: up}).FeedbackItems(context.Background(), "proj", "src-1")
	if len(items) != 228 || items[0].Updates != 2 {
		t.Fatalf("after resend: %d items, updates %d", len(items), items[0].Updates)
	}
}

// TestFeedbackCommandChunksBySize: 3 items of 2 MB go in requests under 5 MB.
func TestFeedbackCommandChunksBySize(t *testing.T) {
	s, up, _ := startSim(t)
	var lines []string
	for i := range 3 {
		lines = append(lines, fmt.Sprintf(`{"unique_id":"big-%d","body":"%s"}`, i, strings.Repeat("y", 2_000_000)))
	}
	file := filepath.Join(t.TempDir(), "items.jsonl")
	os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	r := runCmd(context.Background(), "feedback", append([]string{"--credentials", credsFile(t), "--project", "web",
		"--feedback-url", up, "--source", "s", "--file", file}, fastRetry...)...)
	// The sim refuses bodies over 10,000 characters item by item; what
	// matters here is that no request went over 5 MB (413).
	if r.code != 1 || !strings.Contains(r.stderr, "0 items ingested, 3 failed, in 2 requests") {
		t.Fatal(r)
	}
	for _, rec := range s.Requests() {
		if rec.Status == 413 {
			t.Fatalf("a request over 5 MB was sent")
		}
	}
}
