package usermap_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/forms"
	"github.com/svcrelay/relay/internal/forms/formstest"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/upstream"
	"github.com/svcrelay/relay/internal/usermap"
)

// component is a UserMap with GET /api/2/usermap (ReadAPI) forwarded beside
// its own routes, as cmd/relay serves them.
type component struct {
	*usermap.UserMap
	read []adminroute.Route
}

func (c component) Routes() []adminroute.Route { return append(c.UserMap.Routes(), c.read...) }

// env is formstest's relay slice around a UserMap.
type env = formstest.Env[component]

func newEnv(t *testing.T, simCfg sim.Config, cfg usermap.Config, creds *credentials.Store) *env {
	t.Helper()
	return formstest.New(t, simCfg, storage.KindUserMap,
		func(simURL string, sp *spool.Spool, client *upstream.Client, reg *prometheus.Registry) (component, error) {
			if cfg.AliasURL == nil {
				cfg.AliasURL = baseurl.NewRef(simURL)
			}
			if cfg.AnalyticsURL == nil {
				cfg.AnalyticsURL = baseurl.NewRef(simURL)
			}
			if cfg.RetryInitial == 0 {
				cfg.RetryInitial = 5 * time.Millisecond
				cfg.RetryMax = 50 * time.Millisecond
			}
			cfg.Store = spool.NewBackend(sp)
			um, err := usermap.New(cfg, client, credentials.NewRef(creds), nil, reg)
			if err != nil {
				return component{}, err
			}
			fwd, err := forward.New(forward.Config{}, credentials.NewRef(creds), nil, reg)
			if err != nil {
				return component{}, err
			}
			read, err := fwd.Routes(usermap.ReadAPI(forward.APIConfig{URL: cfg.AnalyticsURL}))
			return component{um, read}, err
		})
}

type answer = formstest.Answer

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	formstest.WaitFor(t, 15*time.Second, what, cond)
}

func mappings(prefix string, n int, global string) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf(`{"user_id":"%s%d","global_user_id":%q}`, prefix, i, global)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// TestValidation: one case per rule of the API reference's Mapping object
// ("user_id | Required", "global_user_id | Required unless unmap is true",
// "unmap | boolean") and Limits ("Mapping batch | at most 2000
// requests/events per batch and 1 MB"; "Read mappings | user_ids | 1 to 100
// per request").
func TestValidation(t *testing.T) {
	e := newEnv(t, sim.Config{}, usermap.Config{}, nil)
	many := func(n int) string { return mappings("u", n, "g") }
	tests := []struct {
		name    string
		method  string
		path    string
		form    url.Values
		status  int
		errPart string
	}{
		{"missing api_key", "POST", "/usermap", url.Values{"mapping": {many(1)}}, 400, "api_key"},
		{"missing mapping", "POST", "/usermap", url.Values{"api_key": {"k"}}, 400, "mapping"},
		{"bad json", "POST", "/usermap", url.Values{"api_key": {"k"}, "mapping": {`[{"user_id":`}}, 400, "invalid JSON"},
		{"not object", "POST", "/usermap", url.Values{"api_key": {"k"}, "mapping": {`[{"user_id":"a","global_user_id":"g"},"x"]`}}, 400, "mapping[1]: must be an object"},
		{"missing user_id", "POST", "/usermap", url.Values{"api_key": {"k"}, "mapping": {`[{"global_user_id":"g"}]`}}, 400, "mapping[0].user_id"},
		{"user_id number", "POST", "/usermap", url.Values{"api_key": {"k"}, "mapping": {`[{"user_id":5,"global_user_id":"g"}]`}}, 400, "mapping[0].user_id: must be a string"},
		{"missing global_user_id", "POST", "/usermap", url.Values{"api_key": {"k"}, "mapping": {`[{"user_id":"a","global_user_id":"g"},{"user_id":"b"}]`}}, 400, "mapping[1].global_user_id"},
		{"unmap false needs global", "POST", "/usermap", url.Values{"api_key": {"k"}, "mapping": {`{"user_id":"b","unmap":false}`}}, 400, "mapping[0].global_user_id"},
		{"unmap not boolean", "POST", "/usermap", url.Values{"api_key": {"k"}, "mapping": {`{"user_id":"b","unmap":"true"}`}}, 400, "mapping[0].unmap: must be a boolean"},
		{"unknown field", "POST", "/usermap", url.Values{"api_key": {"k"}, "mapping": {`{"user_id":"b","unmapp":true}`}}, 400, "mapping[0].unmapp"},
		{"2001 mappings", "POST", "/usermap", url.Values{"api_key": {"k"}, "mapping": {many(2001)}}, 400, "2001 mappings; at most 2000"},
		{"1 MB", "POST", "/usermap", url.Values{"api_key": {"k"}, "mapping": {`{"user_id":"` + strings.Repeat("x", 1_000_000) + `","unmap":true}`}}, 413, "Payload too large"},
		{"ok 2000", "POST", "/usermap", url.Values{"api_key": {"k"}, "mapping": {many(2000)}}, 200, ""},
		{"ok unmap without global", "POST", "/usermap", url.Values{"api_key": {"k"}, "mapping": {`{"user_id":"b","unmap":true}`}}, 200, ""},
		{"ok in the query", "POST", "/usermap?" + url.Values{"api_key": {"k"}, "mapping": {`{"user_id":"c","global_user_id":"g"}`}}.Encode(), nil, 200, ""},
		{"read: no user_ids", "GET", "/api/2/usermap", nil, 400, "user_ids"},
		{"read: 101 user_ids", "GET", "/api/2/usermap?user_ids=" + strings.Repeat("a,", 100) + "a", nil, 400, "101 ids; at most 100"},
		{"read: empty id", "GET", "/api/2/usermap?user_ids=a,,b", nil, 400, "user_ids[1]"},
		{"read: bad JSON", "GET", "/api/2/usermap?user_ids=" + url.QueryEscape(`["a",`), nil, 400, "user_ids"},
		{"read: unknown project", "GET", "/api/2/usermap?user_ids=a", nil, 400, "X-Relay-Project"},
	}
	want := int64(0)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if strings.Contains(tc.name, "unknown project") {
				hdr = []string{"X-Relay-Project", "nope"}
			}
			a := formstest.Do(t, tc.method, e.Base+tc.path, tc.form, hdr...)
			if a.Status != tc.status {
				t.Fatalf("status %d, want %d: %s", a.Status, tc.status, a.Body)
			}
			if tc.status != 200 {
				if msg, _ := a.JSON["error"].(string); !strings.Contains(msg, tc.errPart) || a.JSON["code"] != float64(tc.status) {
					t.Fatalf("answer %s does not name %q", a.Body, tc.errPart)
				}
			} else {
				n, _ := a.JSON["mappings_accepted"].(float64)
				want += int64(n)
			}
			if got := e.LaneRecords("k"); got != want {
				t.Fatalf("spooled %d, want %d", got, want)
			}
		})
	}
	if len(simtest.MappingReads(e.Sim)) != 0 {
		t.Fatal("a locally refused read reached the upstream")
	}
}

// TestOrderPerUser: mappings of one user_id reach the upstream in
// acceptance order, across many requests, retries and splits.
func TestOrderPerUser(t *testing.T) {
	e := newEnv(t, sim.Config{}, usermap.Config{}, nil)
	e.Sim.FailNext(2, 503)
	e.Run()
	const users, rounds = 20, 15
	for r := range rounds {
		parts := make([]string, users)
		for u := range users {
			parts[u] = fmt.Sprintf(`{"user_id":"u%d","global_user_id":"g%d"}`, u, r)
		}
		if a := formstest.Do(t, "POST", e.Base+"/usermap", url.Values{"api_key": {"k"}, "mapping": {"[" + strings.Join(parts, ",") + "]"}}); a.Status != 200 {
			t.Fatal(a.Body)
		}
		if r == 7 {
			e.Sim.FailNext(1, 500)
		}
	}
	waitFor(t, "delivery", func() bool { return len(simtest.MappingCalls(e.Sim)) == users*rounds })
	waitFor(t, "acks", func() bool { return e.LaneRecords("k") == 0 })
	next := map[string]int{}
	for _, c := range simtest.MappingCalls(e.Sim) {
		var r int
		fmt.Sscanf(c.GlobalUserID, "g%d", &r)
		if r != next[c.UserID] {
			t.Fatalf("user %s: round %d arrived when %d was due", c.UserID, r, next[c.UserID])
		}
		next[c.UserID]++
	}
	for u := range users {
		if g, _ := simtest.MappedTo(e.Sim, "k", fmt.Sprint("u", u)); g != fmt.Sprint("g", rounds-1) {
			t.Fatalf("u%d mapped to %q", u, g)
		}
	}
}

const credsYAML = `
projects:
  - name: web
    api_key: "key-web"
    secret_key: "secret-web"
  - name: app
    api_key: "key-app"
    secret_key: "secret-app"
organizations:
  - name: acme
    api_key: "org-key"
    secret_key: "org-secret"
    projects: [web, app]
`

// TestPace: two projects of one organization share the mapping rate; at
// the simulator, no window ever holds more than the limit, nothing is
// throttled, and everything arrives once. The window and limit are shrunk
// (100 per 400 ms) for speed; the logic is the same as 1500 per 30 s.
func TestPace(t *testing.T) {
	creds, err := credentials.Parse([]byte(credsYAML))
	if err != nil {
		t.Fatal(err)
	}
	const limit, window = 100, 400 * time.Millisecond
	e := newEnv(t, sim.Config{}, usermap.Config{RateLimit: limit, RateWindow: window}, creds)
	simtest.SetUserMapRate(e.Sim, limit, window)
	simtest.SetUserMapOrg(e.Sim, "key-web", "acme")
	simtest.SetUserMapOrg(e.Sim, "key-app", "acme")
	e.Sim.SetLatency(2 * time.Millisecond)
	e.Run()
	start := time.Now()
	var wg sync.WaitGroup
	for i, key := range []string{"key-web", "key-app", "key-web", "key-app", "other"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 3 {
				if a := formstest.Do(t, "POST", e.Base+"/usermap", url.Values{"api_key": {key}, "mapping": {mappings(fmt.Sprintf("c%d-%d-", i, j), 30, "g")}}); a.Status != 200 {
					t.Error(a.Body)
				}
			}
		}()
	}
	wg.Wait()
	const total = 5 * 3 * 30 // 360 for acme, 90 for "other"
	waitFor(t, "delivery", func() bool { return len(simtest.MappingCalls(e.Sim)) == total })
	elapsed := time.Since(start)
	batches := simtest.MappingBatches(e.Sim)
	if got := simtest.MaxWindowCount(batches, window); got > limit {
		t.Fatalf("%d mapping calls within one %v window, limit %d", got, window, limit)
	}
	if simtest.MappingThrottled(e.Sim) != 0 {
		t.Fatalf("%d requests throttled", simtest.MappingThrottled(e.Sim))
	}
	// acme's 360 calls need at least 3 full windows after the first 100.
	if elapsed < 3*window {
		t.Fatalf("360 calls at 100 per %v took only %v", window, elapsed)
	}
	for _, b := range batches {
		if b.N > limit {
			t.Fatalf("batch of %d > limit", b.N)
		}
	}
}

// TestThrottled429: another client of the organization (posting straight to
// the upstream) fills the upstream's window; the relay's requests get 429,
// wait and resend; everything arrives once, in order.
func TestThrottled429(t *testing.T) {
	const window = 300 * time.Millisecond
	e := newEnv(t, sim.Config{}, usermap.Config{RateLimit: 40, RateWindow: window, Spooling: forms.Spooling{FormTiming: delivery.FormTiming{MaxRetryAfter: time.Second}}}, nil)
	simtest.SetUserMapRate(e.Sim, 40, window)
	for j := range 3 {
		if a := formstest.Do(t, "POST", e.Base+"/usermap", url.Values{"api_key": {"k"}, "mapping": {mappings(fmt.Sprintf("r%d-", j), 20, "g")}}); a.Status != 200 {
			t.Fatal(a.Body)
		}
	}
	// The other client takes the whole window just before the relay starts.
	if a := formstest.Do(t, "POST", e.SimURL+"/usermap", url.Values{"api_key": {"k"}, "mapping": {mappings("other", 40, "g")}}); a.Status != 200 {
		t.Fatal(a.Body)
	}
	e.Run()
	waitFor(t, "delivery", func() bool { return len(simtest.MappingCalls(e.Sim)) == 100 })
	waitFor(t, "acks", func() bool { return e.LaneRecords("k") == 0 })
	if simtest.MappingThrottled(e.Sim) == 0 {
		t.Fatal("expected 429s")
	}
	seen := map[string]bool{}
	var order []string
	for _, c := range simtest.MappingCalls(e.Sim)[40:] {
		if seen[c.UserID] {
			t.Fatalf("%s delivered twice", c.UserID)
		}
		seen[c.UserID] = true
		order = append(order, c.UserID)
	}
	for i, u := range order {
		if want := fmt.Sprintf("r%d-%d", i/20, i%20); u != want {
			t.Fatalf("position %d: %s, want %s", i, u, want)
		}
	}
	dead, _ := e.Spool.ListDead(context.Background(), storage.DeadFilter{}, 0, 0)
	if len(dead) != 0 {
		t.Fatalf("%d dead letters", len(dead))
	}
}

// TestDeadLetterAndDurability: a mapping the upstream refuses is isolated
// into a dead letter; accepted mappings survive a close without delivery
// and are delivered exactly once after reopening.
func TestDeadLetterAndDurability(t *testing.T) {
	e := newEnv(t, sim.Config{}, usermap.Config{}, nil)
	simtest.RejectUserID(e.Sim, "m13")
	for j := range 3 {
		if a := formstest.Do(t, "POST", e.Base+"/usermap", url.Values{"api_key": {"k"}, "mapping": {mappings(fmt.Sprintf("m%d", j), 10, "g")}}); a.Status != 200 {
			t.Fatal(a.Body)
		}
	}
	e.Close()
	e.Open()
	e.Run()
	waitFor(t, "acks", func() bool { return e.LaneRecords("k") == 0 })
	calls := simtest.MappingCalls(e.Sim)
	if len(calls) != 29 {
		t.Fatalf("delivered %d, want 29", len(calls))
	}
	dead, _ := e.Spool.ListDead(context.Background(), storage.DeadFilter{Reason: "bad_request"}, 0, 0)
	if len(dead) != 1 || !strings.Contains(string(dead[0].Record.Data), `"m13"`) || string(dead[0].Record.UserID) != "m13" {
		t.Fatalf("dead letters %+v", dead)
	}
	e.Close()
	e.Open()
	e.Run()
	time.Sleep(150 * time.Millisecond) // a redelivery would show by now (a negative check)
	if n := len(simtest.MappingCalls(e.Sim)); n != 29 {
		t.Fatalf("after another restart %d delivered", n)
	}
}

// TestForwardRead: GET /api/2/usermap with the caller's own Basic auth
// (passed through) and with credentials injected from X-Relay-Project; the
// relay's own headers never reach the upstream.
func TestForwardRead(t *testing.T) {
	creds, err := credentials.Parse([]byte(credsYAML))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, sim.Config{}, usermap.Config{}, creds)
	simtest.SetSecretKey(e.Sim, "key-web", "secret-web")
	simtest.SetUserMapOrg(e.Sim, "key-web", "acme")
	e.Run()
	if a := formstest.Do(t, "POST", e.Base+"/usermap", url.Values{"api_key": {"key-web"}, "mapping": {`[{"user_id":"alice","global_user_id":"G"}]`}}); a.Status != 200 {
		t.Fatal(a.Body)
	}
	waitFor(t, "delivery", func() bool { return len(simtest.MappingCalls(e.Sim)) == 1 })

	q := "/api/2/usermap?user_ids=" + url.QueryEscape(`["alice","G","nobody"]`)
	check := func(a answer) {
		t.Helper()
		if a.Status != 200 || !strings.HasPrefix(a.CT, "application/json") {
			t.Fatalf("status %d %s: %s", a.Status, a.CT, a.Body)
		}
		var out map[string]struct {
			MappedFrom []map[string]any `json:"mapped_from"`
			MappedTo   []map[string]any `json:"mapped_to"`
		}
		json.Unmarshal([]byte(a.Body), &out)
		if len(out["alice"].MappedTo) != 1 || out["alice"].MappedTo[0]["user_id"] != "G" || len(out["G"].MappedFrom) != 1 {
			t.Fatalf("answer %s", a.Body)
		}
		if out["nobody"].MappedFrom == nil || len(out["nobody"].MappedTo) != 0 {
			t.Fatalf("unknown user: %s", a.Body)
		}
	}
	basic := func(u, p string) string {
		return "Basic " + encodeBase64(u+":"+p)
	}
	// Pass-through: the caller's Authorization, admin token in Proxy-Authorization.
	check(formstest.Do(t, "GET", e.Base+q, nil, "Authorization", basic("key-web", "secret-web"),
		"Proxy-Authorization", "Bearer admintoken", "Cookie", "c=1"))
	// Wrong caller credentials: the upstream's 401 is passed back.
	if a := formstest.Do(t, "GET", e.Base+q, nil, "Authorization", basic("key-web", "wrong")); a.Status != 401 || !strings.Contains(a.Body, "Invalid credentials") {
		t.Fatalf("wrong secret: %d %s", a.Status, a.Body)
	}
	// Injected: X-Relay-Project names the project; the Bearer (admin token) is replaced.
	check(formstest.Do(t, "GET", e.Base+q, nil, "X-Relay-Project", "web", "Authorization", "Bearer admintoken"))
	reads := simtest.MappingReads(e.Sim)
	if len(reads) != 3 {
		t.Fatalf("%d reads at the upstream", len(reads))
	}
	for _, r := range reads {
		for _, h := range r.Headers {
			switch h {
			case "Proxy-Authorization", "X-Relay-Project", "Cookie":
				t.Fatalf("header %s reached the upstream", h)
			}
		}
		if r.User != sim.KeyLabel("key-web") {
			t.Fatalf("upstream saw user %s", r.User)
		}
		if r.Query != "user_ids="+url.QueryEscape(`["alice","G","nobody"]`) {
			t.Fatalf("query changed: %q", r.Query)
		}
	}
	// The upstream unreachable: 502.
	e.Sim.Close()
	if a := formstest.Do(t, "GET", e.Base+q, nil, "X-Relay-Project", "web"); a.Status != 502 {
		t.Fatalf("upstream down: %d", a.Status)
	}
}

// TestProjectKey: POST /usermap with X-Relay-Project uses that project's api_key.
func TestProjectKey(t *testing.T) {
	creds, err := credentials.Parse([]byte(credsYAML))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, sim.Config{}, usermap.Config{}, creds)
	simtest.SetUserMapOrg(e.Sim, "key-app", "acme")
	e.Run()
	if a := formstest.Do(t, "POST", e.Base+"/usermap", url.Values{"mapping": {`{"user_id":"bob","global_user_id":"B"}`}}, "X-Relay-Project", "app"); a.Status != 200 {
		t.Fatal(a.Body)
	}
	if a := formstest.Do(t, "POST", e.Base+"/usermap", url.Values{"mapping": {`{"user_id":"bob","global_user_id":"B"}`}}, "X-Relay-Project", "nope"); a.Status != 400 {
		t.Fatal(a.Body)
	}
	if a := formstest.Do(t, "POST", e.Base+"/usermap", url.Values{"api_key": {"k"}, "mapping": {`{"user_id":"bob","global_user_id":"B"}`}}, "X-Relay-Project", "app"); a.Status != 400 {
		t.Fatal(a.Body)
	}
	waitFor(t, "delivery", func() bool { g, ok := simtest.MappedTo(e.Sim, "key-app", "bob"); return ok && g == "B" })
	if n := len(simtest.MappingCalls(e.Sim)); n != 1 {
		t.Fatalf("%d calls", n)
	}
}
