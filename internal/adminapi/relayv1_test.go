package adminapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// fakeControl is a delivery.LaneControl with function fields.
type fakeControl struct {
	status func() []delivery.LaneStatus
	stop   func(id uint64) error
	resume func(id uint64) error
}

func (f fakeControl) LaneStatus() []delivery.LaneStatus { return f.status() }
func (f fakeControl) StopLane(id uint64) error          { return f.stop(id) }
func (f fakeControl) ResumeLane(id uint64) error        { return f.resume(id) }

// relayFixture is a Relay over a real spool in a temp dir, served on a real
// port with an admin token.
type relayFixture struct {
	t    *testing.T
	sp   *spool.Spool
	base string
}

// wrap, when given, wraps the store the routes use.
func newRelayFixture(t *testing.T, scfg spool.Config, lanes map[storage.Kind]delivery.LaneControl, wrap ...func(Store) Store) *relayFixture {
	t.Helper()
	scfg.Dir = t.TempDir()
	scfg.MinFreeBytes = -1
	sp, err := spool.Open(scfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sp.Close(); err != nil {
			t.Errorf("close spool: %v", err)
		}
	})
	var store Store = spool.NewBackend(sp)
	for _, w := range wrap {
		store = w(store)
	}
	api, err := NewRelay(RelayConfig{Lanes: lanes, Store: store}, sp, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Token: mustToken(t, "tok")}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Register(api.Routes()...)
	return &relayFixture{t: t, sp: sp, base: start(t, s)}
}

// do calls a route with the token and decodes the JSON answer into v (when
// not nil).
func (f *relayFixture) do(method, path, body string, v any) int {
	f.t.Helper()
	code, _, got := getBody(f.t, method, f.base+path, body, "Authorization", "Bearer tok")
	if v != nil {
		if err := json.Unmarshal([]byte(got), v); err != nil {
			f.t.Fatalf("%s %s: %d %q: %v", method, path, code, got, err)
		}
	}
	return code
}

// dead puts one dead letter per record into the lane of key.
func (f *relayFixture) dead(key storage.LaneKey, reason string, data ...string) []uint64 {
	f.t.Helper()
	if _, err := f.sp.Lane(context.Background(), key); err != nil {
		f.t.Fatal(err)
	}
	var dls []storage.DeadLetter
	for i, d := range data {
		dls = append(dls, storage.DeadLetter{Lane: key, Reason: reason, Answer: []byte("HTTP 400: no"),
			Accepted: time.Now().Add(-time.Minute), Died: time.Now(),
			Record: storage.Record{OrderKey: fmt.Appendf(nil, "ok-%d", i), UserID: fmt.Appendf(nil, "u-%d", i), Data: []byte(d)}})
	}
	if err := f.sp.PutDead(context.Background(), dls); err != nil {
		f.t.Fatal(err)
	}
	ids := make([]uint64, len(dls))
	for i, d := range dls {
		ids[i] = d.ID
	}
	return ids
}

func (f *relayFixture) lane(key storage.LaneKey) *spool.Lane {
	f.t.Helper()
	l, err := f.sp.Lane(context.Background(), key)
	if err != nil {
		f.t.Fatal(err)
	}
	return l
}

// records reads every record queued in the lane of key.
func (f *relayFixture) records(key storage.LaneKey) []storage.Record {
	f.t.Helper()
	l := f.lane(key)
	var out []storage.Record
	for l.Stats().Records > int64(len(out)) {
		ctx, cancel := context.WithTimeout(context.Background(), polltest.Max) // the lane holds records: it answers at once
		chunks, _, err := l.NextPart(ctx, 1<<20, nil)
		cancel()
		if err != nil {
			f.t.Fatal(err)
		}
		for _, c := range chunks {
			out = append(out, c.Records...)
		}
	}
	return out
}

type replayAnswer struct {
	Replayed int         `json:"replayed"`
	Lanes    []laneCount `json:"lanes"`
	NotFound []uint64    `json:"not_found"`
	More     bool        `json:"more"`
	Error    string      `json:"error"`
}

// TestReplayKinds: records of every lane kind go back to a lane of their
// kind and options, under the corrected api_key when one is given, with
// their order key, user id and data unchanged, and only then leave the
// dead-letter store.
func TestReplayKinds(t *testing.T) {
	f := newRelayFixture(t, spool.Config{}, nil)
	ev := storage.LaneKey{Kind: storage.KindEvents, APIKey: "old", Options: `{"min_id_length":3}`}
	gi := storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: "old"}
	um := storage.LaneKey{Kind: storage.KindUserMap, APIKey: "other"}
	f.dead(ev, "silenced", `{"event_type":"a","device_id":"d1"}`, `{"event_type":"b","device_id":"d1"}`)
	f.dead(gi, "bad_request", `{"group_type":"org","group_value":"x"}`)
	f.dead(um, "expired", `{"user_id":"u","global_user_id":"g"}`)

	var ans replayAnswer
	if code := f.do("POST", "/relay/v1/deadletters/replay", `{"filter":{},"api_key":"new"}`, &ans); code != 200 || ans.Replayed != 4 || ans.More {
		t.Fatalf("replay: %d %+v", code, ans)
	}
	kinds := map[string]int{}
	for _, c := range ans.Lanes {
		kinds[c.Kind] = c.Records
	}
	if kinds["events"] != 2 || kinds["groupidentify"] != 1 || kinds["usermap"] != 1 {
		t.Fatalf("lanes %+v", ans.Lanes)
	}
	for key, want := range map[storage.LaneKey][]string{
		{Kind: storage.KindEvents, APIKey: "new", Options: ev.Options}: {`{"event_type":"a","device_id":"d1"}`, `{"event_type":"b","device_id":"d1"}`},
		{Kind: storage.KindGroupIdentify, APIKey: "new"}:               {`{"group_type":"org","group_value":"x"}`},
		{Kind: storage.KindUserMap, APIKey: "new"}:                     {`{"user_id":"u","global_user_id":"g"}`},
	} {
		recs := f.records(key)
		var got []string
		for i, r := range recs {
			got = append(got, string(r.Data))
			if string(r.OrderKey) != fmt.Sprintf("ok-%d", i) || string(r.UserID) != fmt.Sprintf("u-%d", i) {
				t.Errorf("%v record %d: order key %q, user %q", key.Kind, i, r.OrderKey, r.UserID)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%v lane under the new key: %q, want %q", key.Kind, got, want)
		}
	}
	for _, old := range []storage.LaneKey{ev, gi, um} {
		if n := f.lane(old).Stats().Records; n != 0 {
			t.Errorf("%v: %d records went to the old key's lane", old.Kind, n)
		}
	}
	var l deadListJSON
	if f.do("GET", "/relay/v1/deadletters", "", &l); len(l.DeadLetters) != 0 || l.Total != 0 {
		t.Fatalf("dead letters left: %+v", l)
	}
	// An answer never holds an api_key.
	code, _, body := getBody(t, "GET", f.base+"/relay/v1/lanes", "", "Authorization", "Bearer tok")
	if code != 200 || strings.Contains(body, `"new"`) || strings.Contains(body, `"old"`) {
		t.Fatalf("lanes: %d %s", code, body)
	}
}

// TestBulkLimit: a filter call handles at most limit dead letters and says
// whether more are left; ids calls report unknown ids.
func TestBulkLimit(t *testing.T) {
	f := newRelayFixture(t, spool.Config{}, nil)
	key := storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"}
	ids := f.dead(key, "silenced", `{"n":1}`, `{"n":2}`, `{"n":3}`, `{"n":4}`, `{"n":5}`)
	tests := []struct {
		path, body string
		n          int
		more       bool
		notFound   []uint64
	}{
		{"purge", `{"filter":{"reason":"silenced"},"limit":2}`, 2, true, nil},
		{"replay", `{"filter":{},"limit":2}`, 2, true, nil},
		{"purge", `{"filter":{"reason":"other"}}`, 0, false, nil},
		{"replay", fmt.Sprintf(`{"ids":[%d,%d,424242]}`, ids[4], ids[0]), 1, false, []uint64{ids[0], 424242}},
		{"purge", `{"filter":{}}`, 0, false, nil},
	}
	for i, tt := range tests {
		var ans struct {
			Replayed, Purged int
			More             bool     `json:"more"`
			NotFound         []uint64 `json:"not_found"`
		}
		code := f.do("POST", "/relay/v1/deadletters/"+tt.path, tt.body, &ans)
		if code != 200 || ans.Replayed+ans.Purged != tt.n || ans.More != tt.more || !slices.Equal(ans.NotFound, tt.notFound) && len(tt.notFound) > 0 {
			t.Fatalf("step %d %s %s: %d %+v", i, tt.path, tt.body, code, ans)
		}
	}
	if got := f.lane(key).Stats().Records; got != 3 {
		t.Fatalf("%d records replayed into the lane, want 3", got)
	}
}

// TestReplaySpoolFull: a replay the spool refuses answers 503 with
// Retry-After and keeps the dead letters.
func TestReplaySpoolFull(t *testing.T) {
	f := newRelayFixture(t, spool.Config{MaxBytes: 64}, nil)
	key := storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"}
	f.dead(key, "silenced", `{"pad":"`+strings.Repeat("x", 200)+`"}`)
	code, hdr, body := getBody(t, "POST", f.base+"/relay/v1/deadletters/replay", `{"filter":{}}`, "Authorization", "Bearer tok")
	if code != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(body, "quota") {
		t.Fatalf("replay into a full spool: %d %q %s", code, hdr.Get("Retry-After"), body)
	}
	var l deadListJSON
	if f.do("GET", "/relay/v1/deadletters", "", &l); len(l.DeadLetters) != 1 {
		t.Fatalf("dead letter lost: %+v", l)
	}
}

// TestLaneRoutes: listing with the deliverer's status, pause and resume by
// label, 409 for kinds without a deliverer control or a lane not running.
func TestLaneRoutes(t *testing.T) {
	var calls []string
	ctl := fakeControl{
		status: func() []delivery.LaneStatus {
			return []delivery.LaneStatus{{ID: 1, Stopped: len(calls)%2 == 1, StopReason: "stopped by operator", PausedKeys: 2, HeldEvents: 7}}
		},
		stop: func(id uint64) error {
			if id != 1 {
				return delivery.ErrUnknownLane
			}
			calls = append(calls, fmt.Sprint("stop ", id))
			return nil
		},
		resume: func(id uint64) error { calls = append(calls, fmt.Sprint("resume ", id)); return nil },
	}
	f := newRelayFixture(t, spool.Config{}, map[storage.Kind]delivery.LaneControl{storage.KindEvents: ctl})
	ev := f.lane(storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"})
	ev2 := f.lane(storage.LaneKey{Kind: storage.KindEvents, APIKey: "k2"})
	gi := f.lane(storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: "k"})
	if ev.ID() != 1 {
		t.Fatalf("first lane id %d", ev.ID())
	}
	var b storage.Batch
	b.Add(storage.Record{OrderKey: []byte("d"), Data: []byte(`{}`)})
	if err := f.sp.Append(context.Background(), ev, &b); err != nil {
		t.Fatal(err)
	}

	var list lanesJSON
	if code := f.do("GET", "/relay/v1/lanes", "", &list); code != 200 || len(list.Lanes) != 3 {
		t.Fatalf("lanes: %d %+v", code, list)
	}
	got := list.Lanes[0]
	if got.Label != ev.Key().Label() || got.Kind != "events" || got.Records != 1 || got.Chunks != 1 || got.Bytes <= 0 ||
		got.Oldest == nil || !got.Controllable || !got.Running || got.PausedKeys != 2 || got.HeldEvents != 7 {
		t.Fatalf("events lane %+v", got)
	}
	if l := list.Lanes[2]; l.Kind != "groupidentify" || l.Controllable || l.Running || l.Oldest != nil {
		t.Fatalf("groupidentify lane %+v", l)
	}

	tests := []struct {
		path string
		code int
	}{
		{"/relay/v1/lanes/" + ev.Key().Label() + "/pause", 200},
		{"/relay/v1/lanes/" + ev.Key().Label() + "/resume", 200},
		{"/relay/v1/lanes/" + gi.Key().Label() + "/pause", 409},
		{"/relay/v1/lanes/" + ev2.Key().Label() + "/pause", 409}, // not running in the deliverer
		{"/relay/v1/lanes/nope/pause", 404},
		{"/relay/v1/lanes/" + ev.Key().Label() + "/stop", 404},
		{"/relay/v1/lanes/" + ev.Key().Label(), 405},
	}
	for _, tt := range tests {
		if code := f.do("POST", tt.path, "", nil); code != tt.code {
			t.Errorf("POST %s: %d, want %d", tt.path, code, tt.code)
		}
	}
	if !slices.Equal(calls, []string{"stop 1", "resume 1"}) {
		t.Fatalf("calls %q", calls)
	}
	var one laneJSON
	if code := f.do("GET", "/relay/v1/lanes/"+ev.Key().Label(), "", &one); code != 200 || one.Label != ev.Key().Label() {
		t.Fatalf("one lane: %d %+v", code, one)
	}
}

// TestRelayClose: after Close, replay and purge do nothing and say so.
func TestRelayClose(t *testing.T) {
	scfg := spool.Config{Dir: t.TempDir(), MinFreeBytes: -1}
	sp, err := spool.Open(scfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	api, err := NewRelay(RelayConfig{Store: spool.NewBackend(sp)}, sp, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Register(api.Routes()...)
	base := start(t, s)
	key := storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"}
	if _, err := sp.Lane(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	if err := sp.PutDead(context.Background(), []storage.DeadLetter{{Lane: key, Reason: "x", Record: storage.Record{Data: []byte(`{}`)}}}); err != nil {
		t.Fatal(err)
	}
	api.Close()
	for _, p := range []string{"replay", "purge"} {
		code, _, body := getBody(t, "POST", base+"/relay/v1/deadletters/"+p, `{"filter":{}}`)
		if code != 500 || !strings.Contains(body, "context canceled") {
			t.Errorf("%s after Close: %d %s", p, code, body)
		}
	}
	if dls, _ := sp.ListDead(context.Background(), storage.DeadFilter{}, 0, 0); len(dls) != 1 {
		t.Fatalf("%d dead letters after Close, want 1 kept", len(dls))
	}
}

func TestNewRelayNeedsSpool(t *testing.T) {
	if _, err := NewRelay(RelayConfig{}, nil, nil, nil); err == nil {
		t.Fatal("nil spool accepted")
	}
	sp, err := spool.Open(spool.Config{Dir: t.TempDir(), MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	if _, err := NewRelay(RelayConfig{}, sp, nil, nil); err == nil {
		t.Fatal("nil store accepted")
	}
}

// getBody sends method url with body (JSON) and hdr pairs.
func getBody(t *testing.T, method, url, body string, hdr ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := (&http.Client{Timeout: polltest.Max}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// lanesJSON is the answer of GET /relay/v1/lanes.
type lanesJSON struct {
	Lanes []laneJSON `json:"lanes"`
}

// TestListDeadArgs: after and limit out of their ranges, and unknown
// parameters, are refused with 400 before anything is listed.
func TestListDeadArgs(t *testing.T) {
	f := newRelayFixture(t, spool.Config{}, nil)
	for q, want := range map[string]int{
		"": 200, "?limit=1000&after=5": 200, "?limit=0": 400, "?limit=1001": 400, "?limit=x": 400,
		"?after=-1": 400, "?after=x&limit=5": 400, "?after=1&limit=x": 400, "?bogus=1": 400,
	} {
		if got := f.do("GET", "/relay/v1/deadletters"+q, "", nil); got != want {
			t.Errorf("GET /relay/v1/deadletters%s: %d, want %d", q, got, want)
		}
	}
}
