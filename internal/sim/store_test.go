package sim

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/sim/wiretest"
)

func TestDedup(t *testing.T) {
	clk := newFakeClock()
	s, url := start(t, Config{Now: clk.Now, DedupWindow: time.Hour})
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a"), wiretest.Event("device1", "a"), wiretest.Event("device2", "a")))
	if s.Count() != 2 || s.Duplicates() != 1 {
		t.Fatalf("same request: count %d dups %d", s.Count(), s.Duplicates())
	}
	// Same insert_id, other api_key: not a duplicate ("in the same app").
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k2", wiretest.Event("device1", "a")))
	// No device_id: deduped per user (the upstream's hashed user_id device).
	u := `{"event_type":"e","user_id":"user1","insert_id":"b"}`
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", u, u))
	if s.Count() != 4 || s.Duplicates() != 2 {
		t.Fatalf("count %d dups %d", s.Count(), s.Duplicates())
	}
	// Events without insert_id are never duplicates.
	noID := `{"event_type":"e","device_id":"device1"}`
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", noID, noID))
	if s.Count() != 6 {
		t.Fatalf("count %d", s.Count())
	}
	clk.Advance(59 * time.Minute)
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a")))
	if s.Duplicates() != 3 {
		t.Fatalf("inside window: dups %d", s.Duplicates())
	}
	clk.Advance(2 * time.Minute)
	a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a")))
	if a.JSON["events_ingested"] != 1.0 || s.Count() != 7 || s.Duplicates() != 3 {
		t.Fatalf("after window: count %d dups %d", s.Count(), s.Duplicates())
	}
	r := s.Requests()
	if r[0].Ingested != 2 || r[0].Duplicates != 1 {
		t.Fatalf("record %+v", r[0])
	}
}

func TestDedupMaxKeys(t *testing.T) {
	s, url := start(t, Config{DedupMaxKeys: 2})
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a"), wiretest.Event("device1", "b"), wiretest.Event("device1", "c")))
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a"), wiretest.Event("device1", "c")))
	st := s.Stats()
	if st.DedupEvicted == 0 || st.Duplicates != 1 || st.Ingested != 4 {
		t.Fatalf("stats %+v", st)
	}
}

func TestKeepBoundsMemory(t *testing.T) {
	s, url := start(t, Config{Keep: 3, KeepRequests: 2})
	for i := 0; i < 5; i++ {
		wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", fmt.Sprint(i))))
	}
	evs := s.Events("k")
	if len(evs) != 3 || evs[0].InsertID != "2" || evs[2].InsertID != "4" || s.Count() != 5 {
		t.Fatalf("kept %+v count %d", evs, s.Count())
	}
	if r := s.Requests(); len(r) != 2 || r[1].Seq != 5 {
		t.Fatalf("requests %+v", r)
	}
	if st := s.Stats(); st.EventsDropped != 2 || st.Requests != 5 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRateLimit(t *testing.T) {
	clk := newFakeClock()
	s, url := start(t, Config{Now: clk.Now, LenientRate: true}) // 30 eps over 10s, penalty 30s
	batch := func(dev string, n int, tag string) []byte {
		evs := make([]string, n)
		for i := range evs {
			evs[i] = wiretest.Event(dev, fmt.Sprintf("%s-%d", tag, i))
		}
		return wiretest.Envelope("k", evs...)
	}
	// 300 events in the window: exactly 30/s, not above.
	if a := wiretest.Post(t, url+"/2/httpapi", batch("hot-device", 300, "a")); a.Status != 200 {
		t.Fatalf("%d %s", a.Status, a.Body)
	}
	clk.Advance(time.Second)
	if a := wiretest.Post(t, url+"/2/httpapi", batch("hot-device", 1, "b")); a.Status != 200 {
		t.Fatalf("at the threshold: %d %s", a.Status, a.Body)
	}
	clk.Advance(time.Second)
	// 301 events in the window: 30.1/s > 30. A mixed request: the cold
	// device's events are named nowhere, but nothing is ingested.
	u := `{"event_type":"e","user_id":"user-hot","device_id":"hot-device","insert_id":"c"}`
	body := wiretest.Envelope("k", wiretest.Event("cold-device", "c1"), u, wiretest.Event("cold-device", "c2"))
	before := s.Count()
	a := wiretest.Post(t, url+"/2/httpapi", body)
	if a.Status != 429 {
		t.Fatalf("want 429, got %d %s", a.Status, a.Body)
	}
	mustJSON(t, a, map[string]any{"code": 429, "error": "Too many requests for some devices and users",
		"eps_threshold": 30, "throttled_devices": map[string]int{"hot-device": 31},
		"throttled_users": map[string]int{}, "throttled_events": []int{1}})
	if s.Count() != before {
		t.Fatal("a 429 ingested events")
	}
	// Penalty: even after the window empties, 30s from the first 429.
	clk.Advance(15 * time.Second)
	a = wiretest.Post(t, url+"/2/httpapi", batch("hot-device", 1, "d"))
	if a.Status != 429 {
		t.Fatalf("inside penalty: %d %s", a.Status, a.Body)
	}
	mustJSON(t, a, map[string]any{"throttled_devices": map[string]int{"hot-device": 0}})
	// Others flow meanwhile.
	if a := wiretest.Post(t, url+"/2/httpapi", batch("cold-device", 5, "e")); a.Status != 200 {
		t.Fatalf("cold device: %d", a.Status)
	}
	clk.Advance(15 * time.Second) // 30s after the first 429: penalty over, not extended
	if a := wiretest.Post(t, url+"/2/httpapi", batch("hot-device", 1, "f")); a.Status != 200 {
		t.Fatalf("after penalty: %d %s", a.Status, a.Body)
	}
	if st := s.Stats(); st.Throttled != 2 {
		t.Fatalf("throttled %d", st.Throttled)
	}
}

func TestRateLimitUsers(t *testing.T) {
	clk := newFakeClock()
	s, url := start(t, Config{Now: clk.Now, EPSThreshold: 1, RateWindow: 2 * time.Second, ThrottlePenalty: -1, LenientRate: true})
	ue := func(i int) string {
		return fmt.Sprintf(`{"event_type":"e","user_id":"user-one","insert_id":"%d"}`, i)
	}
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", ue(1), ue(2), ue(3)))
	a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device9", "z"), ue(4)))
	if a.Status != 429 {
		t.Fatalf("%d %s", a.Status, a.Body)
	}
	mustJSON(t, a, map[string]any{"throttled_users": map[string]int{"user-one": 2}, "throttled_devices": map[string]int{}, "throttled_events": []int{1}})
	// Per api_key: another project's user of the same name is not throttled.
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k2", ue(4))); a.Status != 200 {
		t.Fatalf("other key: %d", a.Status)
	}
	clk.Advance(2 * time.Second) // window passed, no penalty configured
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", ue(4))); a.Status != 200 {
		t.Fatalf("after window: %d %s", a.Status, a.Body)
	}
	if s.Count() != 5 {
		t.Fatalf("count %d", s.Count())
	}
}

func TestSilencedAndQuota(t *testing.T) {
	clk := newFakeClock()
	s, url := start(t, Config{Now: clk.Now, DailyQuota: 3})
	s.Knobs(func(k *Knobs) { k.Silenced["quiet-device"] = true })
	a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a"), wiretest.Event("quiet-device", "b"), wiretest.Event("quiet-device", "c")))
	if a.Status != 400 {
		t.Fatalf("%d %s", a.Status, a.Body)
	}
	mustJSON(t, a, map[string]any{"code": 400, "error": ErrTextSilenced, "eps_threshold": 30,
		"silenced_devices": []string{"quiet-device"}, "silenced_events": []int{1, 2},
		"exceeded_daily_quota_devices": map[string]int{}})
	if s.Count() != 0 {
		t.Fatal("silenced request ingested")
	}
	s.Knobs(func(k *Knobs) { delete(k.Silenced, "quiet-device") })
	// Quota: 3 per device per UTC day; a request is refused once the count reached it.
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a"), wiretest.Event("device1", "b"))); a.Status != 200 {
		t.Fatal(a.Status)
	}
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "c"))); a.Status != 200 {
		t.Fatal(a.Status)
	}
	a = wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device2", "x"), wiretest.Event("device1", "d")))
	if a.Status != 400 {
		t.Fatalf("over quota: %d %s", a.Status, a.Body)
	}
	mustJSON(t, a, map[string]any{"exceeded_daily_quota_devices": map[string]int{"device1": 3},
		"silenced_devices": []string{}, "silenced_events": []int{}})
	if s.Count() != 3 {
		t.Fatalf("count %d", s.Count())
	}
	clk.Advance(12 * time.Hour) // next UTC day (clock starts at noon)
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "d"))); a.Status != 200 {
		t.Fatalf("next day: %d %s", a.Status, a.Body)
	}
	if st := s.Stats(); st.Silenced != 2 {
		t.Fatalf("silenced answers %d", st.Silenced)
	}
}

// TestThrottledShares: the log record of a 429 names each throttled device
// and user with its number of the request's events, sorted.
func TestThrottledShares(t *testing.T) {
	s, url := start(t, Config{EPSThreshold: 1, RateWindow: 2 * time.Second})
	ev := func(dev, user string) string {
		return fmt.Sprintf(`{"event_type":"e","device_id":%q,"user_id":%q}`, dev, user)
	}
	a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", ev("dev-a", "user-x"), ev("dev-a", ""), ev("dev-a", ""),
		ev("dev-b", "user-y"), ev("dev-c", "user-y"), ev("dev-d", "user-y"), ev("dev-e", "user-y")))
	if a.Status != 429 {
		t.Fatalf("%d %s", a.Status, a.Body)
	}
	want := []keyShare{{"d:dev-a", 3}, {"u:user-y", 4}}
	if got := s.Requests()[0].Throttled; !slices.Equal(got, want) {
		t.Errorf("throttled %v, want %v", got, want)
	}
}
