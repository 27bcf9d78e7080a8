package simtest

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/sim/wiretest"
)

// TestFaultIngests: a 5xx that ingested all or half of its request, and a
// dropped answer that ingested half (reading #4).
func TestFaultIngests(t *testing.T) {
	s, url := start(t, sim.Config{})
	batch := func(n int, tag string) []byte {
		evs := make([]string, n)
		for i := range evs {
			evs[i] = wiretest.Event("dev-5", fmt.Sprintf("%s-%d", tag, i))
		}
		return wiretest.Envelope("k", evs...)
	}
	s.Inject(Fault{Status: 503, Ingest: IngestAll})
	s.Inject(Fault{Status: 500, Ingest: IngestHalf})
	s.Inject(Fault{Drop: DropNoAnswer, Ingest: IngestHalf})
	if a := wiretest.Post(t, url+"/2/httpapi", batch(4, "a")); a.Status != 503 || s.Count() != 4 {
		t.Fatalf("%d count %d", a.Status, s.Count())
	}
	if a := wiretest.Post(t, url+"/2/httpapi", batch(4, "b")); a.Status != 500 || s.Count() != 6 {
		t.Fatalf("%d count %d", a.Status, s.Count())
	}
	resp, err := http.Post(url+"/2/httpapi", "application/json", bytes.NewReader(batch(4, "c")))
	if err == nil {
		resp.Body.Close()
		t.Fatal("no-answer fault answered")
	}
	if s.Count() != 8 {
		t.Fatalf("no-answer half: count %d", s.Count())
	}
}

// TestGroupIdentifyFault: a faulted /groupidentify stores nothing; the
// same request afterwards is stored.
func TestGroupIdentifyFault(t *testing.T) {
	s, base := start(t, sim.Config{})
	s.Inject(Fault{Status: 503})
	body := []byte(url.Values{"api_key": {"k"}, "identification": {`[{"group_type":"a","group_value":"ok"}]`}}.Encode())
	const formCT = "application/x-www-form-urlencoded"
	if a := wiretest.Post(t, base+"/groupidentify", body, "Content-Type", formCT); a.Status != 503 {
		t.Fatalf("fault: %d", a.Status)
	}
	if a := wiretest.Post(t, base+"/groupidentify", body, "Content-Type", formCT); a.Status != 200 {
		t.Fatalf("after fault: %d", a.Status)
	}
	if n := len(GroupIdentifies(s, "k")); n != 1 {
		t.Fatalf("stored %d, want 1", n)
	}
}
