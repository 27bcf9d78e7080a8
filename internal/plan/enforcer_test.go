package plan

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/ratelimit"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

const testCreds = "projects:\n  - name: web\n    api_key: key-web\n    secret_key: sec-web\n    tracking_plan: block\n"

// handlerDoer sends requests to h in process (no sockets: usable in a
// synctest bubble) and counts them.
type handlerDoer struct {
	h        http.Handler
	mu       sync.Mutex
	n        map[string]int // by method
	in, peak int
}

func (d *handlerDoer) Do(r *http.Request) (*http.Response, error) {
	d.mu.Lock()
	if d.n == nil {
		d.n = map[string]int{}
	}
	d.n[r.Method]++
	d.in++
	d.peak = max(d.peak, d.in)
	d.mu.Unlock()
	if r.Body == nil { // as a server gives it
		r.Body = http.NoBody
	}
	w := httptest.NewRecorder()
	d.h.ServeHTTP(w, r)
	d.mu.Lock()
	d.in--
	d.mu.Unlock()
	return w.Result(), nil
}

func (d *handlerDoer) count(m string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[m]
}

// taxonomy makes a call of the taxonomy API on h as project web.
func taxonomy(t *testing.T, h http.Handler, method, path string, form url.Values) {
	t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.SetBasicAuth("key-web", "sec-web")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code/100 != 2 {
		t.Fatalf("%s %s: %d %s", method, path, w.Code, w.Body)
	}
}

func seed(t *testing.T, h http.Handler, events int) {
	taxonomy(t, h, "POST", "/api/2/taxonomy/event-property", url.Values{"event_property": {"price"}, "type": {"number"}})
	taxonomy(t, h, "POST", "/api/2/taxonomy/user-property", url.Values{"user_property": {"plan"}, "type": {"enum"}, "enum_values": {"free,pro"}})
	for i := range events {
		et := fmt.Sprintf("Event %d", i)
		taxonomy(t, h, "POST", "/api/2/taxonomy/event", url.Values{"event_type": {et}})
		taxonomy(t, h, "POST", "/api/2/taxonomy/event-property", url.Values{"event_type": {et}, "event_property": {"price"}, "type": {"number"}, "is_required": {"true"}})
	}
}

func newEnforcer(t *testing.T, cfg Config, h http.Handler) (*Enforcer, *handlerDoer, *ratelimit.Limiter) {
	t.Helper()
	store, err := credentials.Parse([]byte(testCreds))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := ratelimit.New(ratelimit.Config{Name: "taxonomy", Limit: 7200, Window: time.Hour, MaxInFlight: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := &handlerDoer{h: h}
	if cfg.AnalyticsURL == nil {
		cfg.AnalyticsURL = baseurl.NewRef("http://upstream.test")
	}
	e, err := New(cfg, credentials.NewRef(store), lim, d, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return e, d, lim
}

func TestRefreshAndCheck(t *testing.T) {
	s := sim.New(sim.Config{}, nil)
	h := s.Handler()
	seed(t, h, 3)
	dir := t.TempDir()
	e, d, _ := newEnforcer(t, Config{Dir: dir}, h)
	info, err := e.Refresh(context.Background(), "web")
	if err != nil {
		t.Fatal(err)
	}
	if info.Counts != (Counts{EventTypes: 3, SharedProperties: 1, EventProperties: 3, UserProperties: 1}) || !info.Enforcing {
		t.Fatalf("info %+v", info)
	}
	if got := d.count("GET"); got != 3+3 {
		t.Errorf("%d GETs for a plan of 3 event types, want 6", got)
	}
	check := e.Check("key-web")
	good := []byte(`{"event_type":"Event 1","event_properties":{"price":3}}`)
	if rec, reason, _ := check(good, 0); reason != "" || string(rec) != string(good) {
		t.Errorf("planned event: %s %q", rec, reason)
	}
	bad := []byte(`{"event_type":"Event 1","event_properties":{"price":"3","x":1}}`)
	rec, reason, ans := check(bad, 0)
	if reason != ReasonPlan || string(rec) != string(bad) {
		t.Fatalf("violating event: reason %q", reason)
	}
	var q Quarantine
	if err := json.Unmarshal(ans, &q); err != nil {
		t.Fatal(err)
	}
	if q.Project != "web" || q.EventType != "Event 1" || len(q.Violations) != 2 {
		t.Errorf("quarantine answer %s", ans)
	}
	if rec, reason, _ := e.Check("other-key")(bad, 0); reason != "" || string(rec) != string(bad) {
		t.Errorf("a key of no project was checked")
	}

	// A restart with the upstream unreachable enforces the kept plan.
	down := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	e2, _, _ := newEnforcer(t, Config{Dir: dir}, down)
	if _, err := e2.Refresh(context.Background(), "web"); err == nil {
		t.Fatal("refresh from an unreachable upstream: no error")
	}
	if _, reason, _ := e2.Check("key-web")(bad, 0); reason != ReasonPlan {
		t.Error("after a restart without the upstream, the kept plan is not enforced")
	}
	if in, _ := e2.Info("web"); !in.Enforcing || in.LastError == "" {
		t.Errorf("info after restart %+v", in)
	}
	// Without a kept plan: observing, and /readyz says so.
	e3, _, _ := newEnforcer(t, Config{}, down)
	if _, reason, _ := e3.Check("key-web")(bad, 0); reason != "" {
		t.Error("a project never read quarantined")
	}
	if !strings.Contains(e3.ReadyInfo(), "web (block)") {
		t.Errorf("ReadyInfo %q", e3.ReadyInfo())
	}
}

// TestCostOverAnHour runs an hour of refreshes of a 200-event-type plan and
// counts the taxonomy calls: within the document's limits (4 in flight,
// 7200 per hour), the plan's reads never above 1 in flight nor their share
// of the hour, and the upstream never answered 429.
func TestCostOverAnHour(t *testing.T) {
	for _, refresh := range []time.Duration{5 * time.Minute, 10 * time.Second} {
		t.Run(refresh.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := sim.New(sim.Config{}, nil)
				seed(t, s.Handler(), 200)
				e, d, _ := newEnforcer(t, Config{Refresh: refresh}, s.Handler())
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error)
				go func() { done <- e.Run(ctx) }()
				time.Sleep(time.Hour - time.Second)
				cancel()
				<-done
				gets := d.count("GET")
				perRead := 200 + 3
				reads := gets / perRead
				t.Logf("refresh %v: %d GETs (cost %d) in an hour, %d whole reads, peak in flight %d", refresh, gets, gets, reads, d.peak)
				if gets > 7200/2 {
					t.Errorf("plan reads cost %d in an hour, above half the 7200 budget", gets)
				}
				if d.peak > 1 {
					t.Errorf("plan reads had %d in flight", d.peak)
				}
				if refresh == 5*time.Minute && reads != 12 {
					t.Errorf("%d reads in an hour every 5m, want 12", reads)
				}
				if refresh == 10*time.Second && reads < 17 {
					t.Errorf("%d reads in an hour every 10s: the budget stopped more than it must", reads)
				}
				if simtest.TaxonomyPeakInFlight(s, "key-web") > 4 {
					t.Errorf("upstream saw %d in flight", simtest.TaxonomyPeakInFlight(s, "key-web"))
				}
			})
		})
	}
}

// TestBudgetSlides: the plan's share of the taxonomy API's cost is per
// Window: reads it postponed in one hour go on in the next, within it.
func TestBudgetSlides(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := sim.New(sim.Config{}, nil)
		seed(t, s.Handler(), 200)
		e, d, _ := newEnforcer(t, Config{Refresh: 10 * time.Second}, s.Handler())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- e.Run(ctx) }()
		time.Sleep(time.Hour - time.Second) // windows that miss the hour's edges
		first := d.count("GET")
		time.Sleep(time.Hour - time.Second)
		cancel()
		<-done
		second := d.count("GET") - first
		t.Logf("GETs: %d in the first hour, %d in the second", first, second)
		if first > 3600 || second > 3600 || second < 3600-2*(200+3) {
			t.Errorf("plan reads cost %d then %d an hour: want at most, and near, half the 7200 budget", first, second)
		}
	})
}

// TestSetLiveDefaultMode: a reload's new default mode applies to the check
// a lane already holds (its cached lookup is made again), at once.
func TestSetLiveDefaultMode(t *testing.T) {
	s := sim.New(sim.Config{}, nil)
	h := s.Handler()
	seed(t, h, 1)
	store, err := credentials.Parse([]byte("projects:\n  - name: web\n    api_key: key-web\n    secret_key: sec-web\n"))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := ratelimit.New(ratelimit.Config{Name: "taxonomy", Limit: 7200, Window: time.Hour, MaxInFlight: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{AnalyticsURL: baseurl.NewRef("http://upstream.test")}, credentials.NewRef(store), lim, &handlerDoer{h: h}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Refresh(context.Background(), "web"); err != nil {
		t.Fatal(err)
	}
	check := e.Check("key-web")
	bad := []byte(`{"event_type":"Event 0","event_properties":{"price":"3"}}`)
	for _, c := range []struct {
		mode Mode
		want string
	}{{Off, ""}, {Block, ReasonPlan}, {Off, ""}} {
		e.SetLive(Live{Default: c.mode})
		if _, reason, _ := check(bad, 0); reason != c.want {
			t.Fatalf("default mode %v: reason %q, want %q", c.mode, reason, c.want)
		}
		if in, _ := e.Info("web"); in.Mode != c.mode.String() {
			t.Fatalf("default mode %v: info says %q", c.mode, in.Mode)
		}
	}
}

// TestWatch: a change through the forwarded taxonomy API marks the plan of
// its project (by X-Relay-Project, else the Basic api_key) for a read only
// when it was answered 2xx, a body written without WriteHeader included.
func TestWatch(t *testing.T) {
	for _, tc := range []struct {
		name, method string
		status       int // 0: the handler writes its body without WriteHeader
		header       bool
		want         bool
	}{
		{"created", http.MethodPost, http.StatusCreated, false, true},
		{"implicit 200", http.MethodPut, 0, false, true},
		{"by header", http.MethodDelete, http.StatusOK, true, true},
		{"refused", http.MethodPost, http.StatusConflict, false, false},
		{"read", http.MethodGet, http.StatusOK, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, _, _ := newEnforcer(t, Config{}, http.NotFoundHandler())
			routes := e.Watch([]adminroute.Route{{Method: tc.method, Path: "/api/2/taxonomy/event",
				Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if tc.status != 0 {
						w.WriteHeader(tc.status)
					}
					w.Write([]byte(`{"success":true}`))
				})}})
			r := httptest.NewRequest(tc.method, "/api/2/taxonomy/event", nil)
			if tc.header {
				r.Header.Set(admintoken.HeaderProject, "web")
			} else {
				r.SetBasicAuth("key-web", "sec-web")
			}
			routes[0].Handler.ServeHTTP(httptest.NewRecorder(), r)
			if got := e.state("web").refresh.Load(); got != tc.want {
				t.Fatalf("marked for a read: %v, want %v", got, tc.want)
			}
		})
	}
}

// TestTaxonomyAnswers: the envelope of the taxonomy API's answers: a null
// or absent data is an empty list; success false or data of another shape
// fails the read.
func TestTaxonomyAnswers(t *testing.T) {
	for _, tc := range []struct {
		name, users string // the answer to GET /user-property
		ok          bool
	}{
		{"null data", `{"success":true,"data":null}`, true},
		{"no data", `{"success":true}`, true},
		{"list", `{"success":true,"data":[{"user_property":"gp:plan","type":"string"}]}`, true},
		{"success false", `{"success":false,"data":[]}`, false},
		{"data not a list", `{"success":true,"data":{"user_property":"plan"}}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			answers := map[string]string{
				"/api/2/taxonomy/event":                       `{"success":true,"data":[{"event_type":"A"}]}`,
				"/api/2/taxonomy/event-property":              `{"success":true,"data":null}`,
				"/api/2/taxonomy/event-property?event_type=A": `{"success":true,"data":[{"event_property":"x","type":"number"}]}`,
				"/api/2/taxonomy/user-property":               tc.users,
			}
			e, _, _ := newEnforcer(t, Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Write([]byte(answers[r.URL.RequestURI()]))
			}))
			info, err := e.Refresh(context.Background(), "web")
			if !tc.ok {
				if err == nil {
					t.Fatalf("read: no error, plan %+v", info.Plan)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p := info.Plan; len(p.EventTypes) != 1 || len(p.Overrides["A"]) != 1 || p.Overrides["A"][0].Type != "number" ||
				len(p.UserProperties) != strings.Count(tc.users, "gp:plan") {
				t.Fatalf("plan %+v", p)
			}
		})
	}
}

// TestRead429: a taxonomy call answered 429 waits its Retry-After (seconds
// or a date; 1 s without one, at most the limiter's window) and is tried
// again.
func TestRead429(t *testing.T) {
	for _, tc := range []struct {
		name, retryAfter string
		want             time.Duration
	}{
		{"seconds", "3", 3 * time.Second},
		{"none", "", time.Second},
		{"bad", "soon", time.Second},
		{"date", "+5s", 5 * time.Second},
		{"clamped", "7200", time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				refused := false
				e, d, _ := newEnforcer(t, Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Path == "/api/2/taxonomy/event" && !refused {
						refused = true
						ra := tc.retryAfter
						if ra == "+5s" {
							ra = time.Now().Add(5 * time.Second).UTC().Format(http.TimeFormat)
						}
						if ra != "" {
							w.Header().Set("Retry-After", ra)
						}
						w.WriteHeader(http.StatusTooManyRequests)
						return
					}
					w.Write([]byte(`{"success":true,"data":[]}`))
				}))
				start := time.Now()
				if _, err := e.Refresh(context.Background(), "web"); err != nil {
					t.Fatal(err)
				}
				if got := time.Since(start); got != tc.want {
					t.Fatalf("read took %v, want %v (the 429's wait)", got, tc.want)
				}
				if n := d.count("GET"); n != 4 { // event (twice), event-property, user-property
					t.Fatalf("%d calls", n)
				}
			})
		})
	}
}

// TestNewRefusesConfig: a Config that cannot work is an error of New.
func TestNewRefusesConfig(t *testing.T) {
	lim, err := ratelimit.New(ratelimit.Config{Name: "taxonomy", Limit: 7200, Window: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []Config{{Default: Block + 1}, {Refresh: -time.Second}, {Share: -0.1}, {Share: 1.5}} {
		if _, err := New(cfg, credentials.NewRef(&credentials.Store{}), lim, nil, nil, nil); err == nil {
			t.Errorf("New(%+v): no error", cfg)
		}
	}
	if _, err := New(Config{Share: 1}, credentials.NewRef(&credentials.Store{}), lim, nil, nil, nil); err != nil {
		t.Errorf("New with Share 1: %v", err)
	}
}
