package ingest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// Lanes are bounded at ingest. Options that mean the same share
// a lane; an api_key above 128 bytes is refused like a bad key; a new lane
// beyond the spool's MaxLanes gets 503 with Retry-After while the lanes
// that exist keep taking events.
func TestLaneAdmission(t *testing.T) {
	r := startRelay(t, Config{}, spool.Config{NoSync: true, MaxLanes: 3, RetireIdle: -1})
	ev := `{"user_id":"user-00001","event_type":"a","insert_id":"x","time":1}`
	for _, opts := range []string{`{"junk":"1"}`, `{"junk":"1" }`, `{ "junk" : "\u0031"}`, `{"junk":"1","min_id_length":5}`} {
		if a := r.post("/2/httpapi", envelope("k1", opts, ev)); a.status != 200 {
			t.Fatalf("options %s: %d %s", opts, a.status, a.body)
		}
	}
	if n := len(r.sp.Lanes()); n != 1 {
		t.Fatalf("%d lanes for one meaning of options, want 1", n)
	}
	if got := len(r.drain("k1", `{"junk":"1"}`)); got != 4 {
		t.Fatalf("canonical lane holds %d records, want 4", got)
	}
	if a := r.post("/2/httpapi", envelope(strings.Repeat("a", 129), "", ev)); a.status != 400 || !strings.Contains(string(a.body), "Invalid API key") {
		t.Fatalf("long api_key: %d %s", a.status, a.body)
	}
	for _, k := range []string{"k2", "k3"} {
		if a := r.post("/2/httpapi", envelope(k, "", ev)); a.status != 200 {
			t.Fatalf("%s: %d %s", k, a.status, a.body)
		}
	}
	a := r.post("/2/httpapi", envelope("k4", "", ev))
	if a.status != 503 || a.header.Get("Retry-After") == "" || !strings.Contains(string(a.body), "Too many lanes") {
		t.Fatalf("a 4th lane with max-lanes 3: %d %q %s", a.status, a.header.Get("Retry-After"), a.body)
	}
	if a := r.post("/2/httpapi", envelope("k2", "", ev)); a.status != 200 {
		t.Fatalf("an existing lane at the bound: %d %s", a.status, a.body)
	}
	if got := r.counter("relay_ingest_rejected_requests_total", "reason", "too_many_lanes"); got != 1 {
		t.Fatalf("too_many_lanes rejections: %v", got)
	}
}

// One api_key makes at most MaxLanesPerKey lanes: options variants beyond
// it get 503 with Retry-After and their own reason, while its lanes that
// exist, and other api_keys, keep taking events.
func TestLaneAdmissionPerKey(t *testing.T) {
	r := startRelay(t, Config{}, spool.Config{NoSync: true, MaxLanesPerKey: 3, RetireIdle: -1})
	ev := `{"user_id":"user-00001","event_type":"a","insert_id":"x","time":1}`
	for i := range 3 {
		if a := r.post("/2/httpapi", envelope("k1", fmt.Sprintf(`{"junk":%d}`, i), ev)); a.status != 200 {
			t.Fatalf("variant %d: %d %s", i, a.status, a.body)
		}
	}
	for i := 3; i < 6; i++ {
		a := r.post("/2/httpapi", envelope("k1", fmt.Sprintf(`{"junk":%d}`, i), ev))
		if a.status != 503 || a.header.Get("Retry-After") == "" || !strings.Contains(string(a.body), "Too many lanes for this api_key") {
			t.Fatalf("variant %d beyond 3 lanes of the key: %d %q %s", i, a.status, a.header.Get("Retry-After"), a.body)
		}
	}
	for _, k := range []struct{ key, opts string }{{"k1", `{"junk":0}`}, {"k1", `{"junk":2}`}, {"k2", ""}, {"k2", `{"junk":9}`}} {
		if a := r.post("/2/httpapi", envelope(k.key, k.opts, ev)); a.status != 200 {
			t.Fatalf("%s %s: %d %s", k.key, k.opts, a.status, a.body)
		}
	}
	if n := len(r.sp.Lanes()); n != 5 {
		t.Fatalf("%d lanes, want 5", n)
	}
	if got := r.counter("relay_ingest_rejected_requests_total", "reason", "too_many_key_lanes"); got != 3 {
		t.Fatalf("too_many_key_lanes rejections: %v", got)
	}
}

// A lane retired between two requests of its key: the next
// request goes to a new lane, never to the retired one (the spool's index
// holds live lanes only, and it reroutes an Append through a retired
// handle: either keeps this test passing, neither fails it).
func TestRetiredLaneLeavesCache(t *testing.T) {
	r := startRelay(t, Config{}, spool.Config{NoSync: true, RetireIdle: 20 * time.Millisecond})
	ev := `{"user_id":"user-00001","event_type":"a","insert_id":"x","time":1}`
	for round := range 3 {
		if a := r.post("/2/httpapi", envelope("k", "", ev)); a.status != 200 {
			t.Fatalf("round %d: %d %s", round, a.status, a.body)
		}
		l, err := r.sp.Lane(context.Background(), storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
		cs, _, err := l.NextPart(ctx, 1<<20, nil)
		cancel()
		if err != nil || len(cs) != 1 || len(cs[0].Records) != 1 {
			t.Fatalf("round %d: %v %d chunks", round, err, len(cs))
		}
		l.Ack(cs[0].Seq)
		ctx, cancel = context.WithTimeout(context.Background(), polltest.Max)
		_, _, err = l.NextPart(ctx, 1<<20, nil) // returns once the empty lane is retired
		cancel()
		if !errors.Is(err, storage.ErrRetired) {
			t.Fatalf("round %d: lane not retired: %v", round, err)
		}
	}
}
