package plan

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/svcrelay/relay/internal/sim"
)

// TestVerdicts: the ingest's verdict spares delivery its check only for
// the plan and mode in force; any other verdict is checked in full, a plan
// change applies to records marked under the old one, and a restart with
// the same plan keeps the verdicts good.
func TestVerdicts(t *testing.T) {
	h := sim.New(sim.Config{}, nil).Handler()
	seed(t, h, 2)
	dir := t.TempDir()
	e, _, _ := newEnforcer(t, Config{Dir: dir}, h)
	key := []byte("key-web")
	if v, clean := e.Vet(key); v != 0 || clean != nil {
		t.Fatalf("a plan never read vets: %#x", v)
	}
	if _, err := e.Refresh(context.Background(), "web"); err != nil {
		t.Fatal(err)
	}
	v, clean := e.Vet(key)
	good := []byte(`{"device_id":"dev-12345","event_type":"Event 1","event_properties":{"price":3}}`)
	bad := []byte(`{"device_id":"dev-12345","event_type":"Event 1","event_properties":{"price":"3"}}`)
	if v == 0 || clean == nil || !vetted(t, clean, good) || vetted(t, clean, bad) {
		t.Fatalf("Vet: %#x, clean(good) %v, clean(bad) %v", v, clean != nil && vetted(t, clean, good), clean != nil && vetted(t, clean, bad))
	}
	if v, clean := e.Vet([]byte("other-key")); v != 0 || clean != nil {
		t.Error("a key of no project vets")
	}
	check := e.Check("key-web")
	// A record carrying the verdict in force is not checked again (so bad
	// passes: that is how the skip shows).
	if _, reason, _ := check(bad, v); reason != "" {
		t.Errorf("a record with the verdict in force was checked: %q", reason)
	}
	// Any other verdict is checked in full: no verdict, another plan's,
	// another mode's, made up ones.
	for _, f := range []uint64{0, v ^ 1<<40, v&^3 | uint64(Observe), v&^3 | uint64(Filter), 1, ^uint64(0)} {
		if _, reason, _ := check(bad, f); reason != ReasonPlan {
			t.Errorf("verdict %#x (in force %#x): not checked", f, v)
		}
	}

	// Another relay reading the same plan (fleet, or no kept plan) gives
	// the same verdict; a restart from the kept plan, with the upstream
	// down, too.
	other, _, _ := newEnforcer(t, Config{}, h)
	if _, err := other.Refresh(context.Background(), "web"); err != nil {
		t.Fatal(err)
	}
	if ov, _ := other.Vet(key); ov != v {
		t.Errorf("the same plan read by another relay: verdict %#x, want %#x", ov, v)
	}
	down := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	restarted, _, _ := newEnforcer(t, Config{Dir: dir}, down)
	if rv, _ := restarted.Vet(key); rv != v {
		t.Errorf("after a restart with the same plan: verdict %#x, want %#x", rv, v)
	}
	if _, reason, _ := restarted.Check("key-web")(bad, v); reason != "" {
		t.Errorf("after a restart with the same plan, a marked record was checked again: %q", reason)
	}

	// The plan changes (Event 1 is no longer planned): a record marked
	// clean under the old plan, waiting in the backlog, is checked again
	// and quarantined.
	taxonomy(t, h, "DELETE", "/api/2/taxonomy/event/"+url.PathEscape("Event 1"), nil)
	if _, err := e.Refresh(context.Background(), "web"); err != nil {
		t.Fatal(err)
	}
	if nv, _ := e.Vet(key); nv == v || nv == 0 {
		t.Fatalf("a new plan keeps the verdict %#x (now %#x)", v, nv)
	}
	if _, reason, _ := check(good, v); reason != ReasonPlan {
		t.Errorf("a record marked under the old plan was not checked against the new one: %q", reason)
	}
}
