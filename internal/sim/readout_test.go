package sim

import (
	"net/http"
	"testing"

	"github.com/svcrelay/relay/internal/sim/wiretest"
)

// TestProductRoutesOnlyRead: without Config.Faults (the product: sandbox
// mode, `relay sim`) nothing under /sim/ changes the Sim: the knob and fault
// routes of simtest are absent (404, or 405 beside a read-out).
func TestProductRoutesOnlyRead(t *testing.T) {
	s, url := start(t, Config{})
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a"))); a.Status != 200 {
		t.Fatal(a.Status)
	}
	for _, p := range []string{"/sim/reset", "/sim/fault", "/sim/faults/clear", "/sim/latency?d=1s",
		"/sim/down?mode=503", "/sim/up", "/sim/silence?device_id=device1", "/sim/unsilence?device_id=device1",
		"/sim/quota?n=1", "/sim/dsar/config", "/sim/export/config", "/sim/usermap?limit=1",
		"/sim/usermap?reject_user_id=u", "/sim/events", "/sim/stats"} {
		body := []byte(`{"status":503,"polls_to_done":1,"max_bytes":1}`)
		if a := wiretest.Post(t, url+p, body); a.Status != http.StatusNotFound && a.Status != http.StatusMethodNotAllowed {
			t.Errorf("POST %s: %d %s", p, a.Status, a.Body)
		}
	}
	if s.Count() != 1 || len(locked(&s.mu, func() []string { return sortedKeys(s.knobs.Silenced) })) != 0 {
		t.Fatalf("state changed: count %d, silenced %v", s.Count(), locked(&s.mu, func() []string { return sortedKeys(s.knobs.Silenced) }))
	}
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "b"))); a.Status != 200 {
		t.Fatalf("after the POSTs: %d %s", a.Status, a.Body)
	}
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "c"))); a.Status != 200 {
		t.Fatalf("quota: %d %s", a.Status, a.Body)
	}
}
