package operator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/sim"
)

func idsFile(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ids.txt")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func delArgs(up, creds, ids string, extra ...string) []string {
	a := []string{"--credentials", creds, "--project", "web", "--analytics-url", up, "--ids-file", ids, "--requester", "ops@example.com"}
	return append(append(a, fastRetry...), extra...)
}

func TestDeleteUsersInvalidIDs(t *testing.T) {
	s, up, _ := startSim(t)
	ingest(t, up, `{"event_type":"e","user_id":"alice"}`, `{"event_type":"e","user_id":"bobby"}`)
	creds := credsFile(t)
	ids := idsFile(t, "# users to delete", "alice", "ghost-user", fmt.Sprintf("svc_id:%d", sim.SvcID("proj", "bobby")), "svc_id:abc", "alice")

	// Without --ignore-invalid-id: the request is refused as a whole, the
	// invalid id reported, nothing scheduled, exit 1.
	r := runCmd(context.Background(), "delete-users", delArgs(up, creds, ids)...)
	if r.code != 1 || !strings.Contains(r.stdout, "invalid\tghost-user") || !strings.Contains(r.stderr, `svc_id "abc" is not a positive integer`) ||
		!strings.Contains(r.stdout, "no deletion job scheduled") || !strings.Contains(r.stderr, "--ignore-invalid-id") {
		t.Fatal(r)
	}
	// With it: the two found users are scheduled and the job is listed.
	r = runCmd(context.Background(), "delete-users", delArgs(up, creds, ids, "--ignore-invalid-id")...)
	day := time.Now().UTC().Add(sim.DeletionLead).Format(time.DateOnly)
	if r.code != 0 || !strings.Contains(r.stdout, "invalid\tghost-user") || !strings.Contains(r.stdout, "job\t"+day+"\tstaging\t2 users") {
		t.Fatal(r)
	}
	var posts int
	for _, rec := range s.Requests() {
		if rec.Method == "POST" && rec.Path == "/api/2/deletions/users" {
			posts++
		}
	}
	if posts != 2 {
		t.Errorf("%d POSTs, want 2", posts)
	}
}

// TestDeleteUsersChunksAndPaces: 150 ids go in 100 + 50, one second apart;
// --dry-run sends nothing.
func TestDeleteUsersChunksAndPaces(t *testing.T) {
	s, up, _ := startSim(t)
	var events, lines []string
	for i := range 150 {
		events = append(events, fmt.Sprintf(`{"event_type":"e","user_id":"user-%03d"}`, i))
		lines = append(lines, fmt.Sprintf("user-%03d", i))
	}
	ingest(t, up, events...)
	creds, ids := credsFile(t), idsFile(t, lines...)

	r := runCmd(context.Background(), "delete-users", delArgs(up, creds, ids, "--dry-run")...)
	if r.code != 0 || !strings.Contains(r.stdout, "request 1 of 2: 0 svc_ids, 100 user_ids") || !strings.Contains(r.stdout, "request 2 of 2: 0 svc_ids, 50 user_ids") {
		t.Fatal(r)
	}
	if n := len(s.Requests()); n != 1 { // the ingest only
		t.Fatalf("dry run sent %d requests", n-1)
	}
	r = runCmd(context.Background(), "delete-users", delArgs(up, creds, ids)...)
	if r.code != 0 || !strings.Contains(r.stdout, "\tstaging\t150 users") {
		t.Fatal(r)
	}
	var times []time.Time
	for _, rec := range s.Requests() {
		if rec.Method == "POST" && rec.Path == "/api/2/deletions/users" {
			times = append(times, rec.Time)
		}
	}
	if len(times) != 2 || times[1].Sub(times[0]) < time.Second {
		t.Fatalf("POST times %v: want 2, at least 1s apart", times)
	}
}
