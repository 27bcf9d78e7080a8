package forward_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/forward"
	ft "github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/ratelimit"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

// taxonomyStart serves the API with its limit changed by lim, on a simulator.
func taxonomyStart(t *testing.T, lim ratelimit.Config) (*ft.Env, string) {
	t.Helper()
	env := ft.Start(t, forward.Config{})
	return env, ft.Serve(t, env.Routes(t, forward.Taxonomy(forward.APIConfig{URL: baseurl.NewRef(env.SimURL), Limit: lim})))
}

const taxonomyForm = "application/x-www-form-urlencoded"

// TestTaxonomyEveryEndpoint walks every endpoint of the document's table (and the
// lifecycle table) through the relay to the simulator and back.
func TestTaxonomyEveryEndpoint(t *testing.T) {
	env, relay := taxonomyStart(t, ratelimit.Config{})
	env.Sim.SeedTaxonomy(ft.ProjectKey, "event", "Live Event", "live")
	env.Sim.SeedTaxonomy(ft.ProjectKey, "event", "tr", "transformed")
	const p = "/api/2/taxonomy"
	steps := []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"POST", p + "/category", "category_name=Web%20%26%20App", 200, `"success":true`},
		{"GET", p + "/category", "", 200, `"name":"Web \u0026 App"`},
		{"GET", p + "/category/Web%20%26%20App", "", 200, `"id":1`},
		{"PUT", p + "/category/1", "category_name=App", 200, ""},
		{"DELETE", p + "/category/1", "", 200, ""},
		{"POST", p + "/event", "event_type=Sign%20Up&category=App&tags=a,b&is_active=true", 200, ""},
		{"GET", p + "/event", "", 200, `"event_type":"Sign Up"`},
		{"GET", p + "/event?showDeleted=true", "", 200, `"Live Event"`},
		{"GET", p + "/event/Sign%20Up", "", 200, `"tags":["a","b"]`},
		{"PUT", p + "/event/Sign%20Up", "description=d&new_event_type=Signed%20Up", 200, ""},
		{"DELETE", p + "/event/Live%20Event", "", 200, ""},
		{"POST", p + "/event/Live%20Event/restore", "", 200, ""},
		{"DELETE", p + "/event/tr", "", 400, `"success":false`},
		{"POST", p + "/event-property", "event_property=plan&type=string", 200, ""},
		{"POST", p + "/event-property", "event_property=plan", 409, ""},
		{"GET", p + "/event-property", "", 200, `"event_property":"plan"`},
		{"GET", p + "/event-property?event_property=plan", "", 200, `"type":"string"`},
		{"PUT", p + "/event-property/plan", "event_type=Signed%20Up&overrideScope=override&description=o", 200, ""},
		{"DELETE", p + "/event-property/plan", "event_type=Signed%20Up", 200, ""},
		{"POST", p + "/event-property/plan/restore", "event_type=Signed%20Up", 201, ""},
		{"POST", p + "/user-property", "user_property=plan&description=u", 200, ""},
		{"GET", p + "/user-property", "", 200, `"user_property":"gp:plan"`},
		{"GET", p + "/user-property/gp:plan", "", 200, `"description":"u"`},
		{"PUT", p + "/user-property/plan", "new_user_property_value=plan2&description=v", 200, ""},
		{"DELETE", p + "/user-property/plan2", "", 200, ""}, // planned: removed
		{"POST", p + "/user-property/plan2/restore", "", 409, ""},
		{"GET", p + "/user-property/plan2", "", 404, ""},
		{"POST", p + "/group-property", "group_type=org&group_property=size", 200, ""},
		{"GET", p + "/group-property?group_type=org", "", 200, `"group_property":"size"`},
		{"GET", p + "/category/None", "", 400, ""},
	}
	for i, s := range steps {
		r := ft.Do(t, s.method, relay+s.path, s.body, ft.Injected("Content-Type", taxonomyForm)...)
		c := env.LastCall(t, i+1)
		wantPath, wantQuery, _ := strings.Cut(s.path, "?")
		if r.Status != s.status || !strings.Contains(r.Body, s.want) || c.Status != s.status || c.Method != s.method ||
			c.Path != wantPath || c.Query != wantQuery || c.Auth != "basic" || c.Principal != sim.KeyLabel(ft.ProjectKey) || c.Body != s.body {
			t.Errorf("%s %s: relay %v, sim saw %+v", s.method, s.path, r, c)
		}
	}
}

func TestTaxonomyLocalValidation(t *testing.T) {
	env, relay := taxonomyStart(t, ratelimit.Config{})
	const p = "/api/2/taxonomy"
	for _, c := range []struct{ method, path, body, field string }{
		{"POST", p + "/category", "", "category_name"},
		{"POST", p + "/category", "category_name=", "category_name"},
		{"PUT", p + "/category/1", "name=x", "category_name"},
		{"POST", p + "/event", "category=x", "event_type"},
		{"POST", p + "/event-property", "event_type=x", "event_property"},
		{"POST", p + "/user-property", "description=x", "user_property"},
		{"POST", p + "/group-property", "group_property=x", "group_type"},
		{"POST", p + "/group-property", "group_type=x", "group_property"},
		{"POST", p + "/event", "event_type=%zz", "form encoded"},
	} {
		r := ft.Do(t, c.method, relay+c.path, c.body, ft.Injected("Content-Type", taxonomyForm)...)
		if r.Status != 400 || !strings.Contains(r.Body, c.field) || !strings.Contains(r.Body, `"success":false`) {
			t.Errorf("%s %s %q: %v", c.method, c.path, c.body, r)
		}
	}
	for _, path := range []string{p + "/events", p + "/event/a/b", p, p + "/category/1/restore"} {
		if r := ft.Do(t, "GET", relay+path, "", ft.Injected()...); r.Status != 404 && r.Status != 405 {
			t.Errorf("GET %s: %v", path, r)
		}
	}
	if n := env.Calls(); n != 0 {
		t.Fatalf("the simulator saw %d calls", n)
	}
	// The required field in the query string is accepted.
	if r := ft.Do(t, "POST", relay+p+"/category?category_name=Q", "", ft.Injected()...); r.Status != 200 {
		t.Errorf("field in the query: %v", r)
	}
}

// TestTaxonomyInFlightCost: many concurrent calls never put more than 4 cost in
// flight at the sim, and all are served (none refused by the sim).
func TestTaxonomyInFlightCost(t *testing.T) {
	env, relay := taxonomyStart(t, ratelimit.Config{MaxWait: 10 * time.Second})
	simtest.SetTaxonomyDelay(env.Sim, 50*time.Millisecond)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			var r ft.Response
			if i%2 == 0 {
				r = ft.Do(t, "GET", relay+"/api/2/taxonomy/category", "", ft.Injected()...)
			} else {
				r = ft.Do(t, "POST", relay+"/api/2/taxonomy/category", "category_name=c"+string(rune('a'+i)), ft.Injected("Content-Type", taxonomyForm)...)
			}
			if r.Status != 200 {
				t.Errorf("call %d: %v", i, r)
			}
		})
	}
	wg.Wait()
	peak := simtest.TaxonomyPeakInFlight(env.Sim, ft.ProjectKey)
	t.Logf("peak cost in flight at the sim: %d", peak)
	if peak > 4 || peak < 2 {
		t.Fatalf("peak cost in flight %d", peak)
	}
}

// TestTaxonomyPeriodBudget: above the period budget the relay answers 429 with
// Retry-After itself; the sim never refuses.
func TestTaxonomyPeriodBudget(t *testing.T) {
	env, relay := taxonomyStart(t, ratelimit.Config{Limit: 5, Window: time.Hour, MaxWait: -1})
	var got []int
	for _, m := range []string{"POST", "GET", "GET", "GET", "POST", "GET"} { // costs 2, 1, 1, 1, 2, 1
		r := ft.Do(t, m, relay+"/api/2/taxonomy/category", "category_name=x", ft.Injected("Content-Type", taxonomyForm)...)
		got = append(got, r.Status)
		if r.Status == 429 && (r.Header.Get("Retry-After") == "" || !strings.Contains(r.Body, `"source":"relay"`)) {
			t.Errorf("local 429 without Retry-After: %v", r)
		}
	}
	// 2+1+1+1 = 5 spent; the POST (2) and the GET (1) are refused.
	want := []int{200, 200, 200, 200, 429, 429}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("statuses %v, want %v", got, want)
		}
	}
	if n := env.Calls(); n != 4 {
		t.Fatalf("sim saw %d calls", n)
	}
}

func TestTaxonomyUpstream429PassedBack(t *testing.T) {
	env, relay := taxonomyStart(t, ratelimit.Config{})
	simtest.SetTaxonomyLimits(env.Sim, 0, 2, time.Hour)
	ft.Do(t, "GET", relay+"/api/2/taxonomy/event", "", ft.Injected()...)
	ft.Do(t, "GET", relay+"/api/2/taxonomy/event", "", ft.Injected()...)
	r := ft.Do(t, "GET", relay+"/api/2/taxonomy/event", "", ft.Injected()...)
	if r.Status != 429 || r.Header.Get("Retry-After") == "" || strings.Contains(r.Body, `"source":"relay"`) {
		t.Fatalf("%v %v", r, r.Header)
	}
	// The upstream's Retry-After now holds the project back locally.
	r = ft.Do(t, "GET", relay+"/api/2/taxonomy/event", "", ft.Injected()...)
	if r.Status != 429 || r.Header.Get("Retry-After") == "" || !strings.Contains(r.Body, `"source":"relay"`) || env.Calls() != 3 {
		t.Fatalf("after the upstream's 429: %v, sim saw %d", r, env.Calls())
	}
}

func TestTaxonomyConfig(t *testing.T) {
	// Negative, or a bound below the cost of 2 of PUT, POST and DELETE.
	for _, c := range []ratelimit.Config{{MaxInFlight: -1}, {MaxInFlight: 1}, {Limit: 1}, {Window: -1}} {
		if _, err := ft.Forwarder(t, forward.Config{}, nil).Routes(forward.Taxonomy(forward.APIConfig{Limit: c})); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if _, err := ft.Forwarder(t, forward.Config{}, nil).Routes(forward.Taxonomy(forward.APIConfig{Limit: ratelimit.Config{MaxInFlight: 2, Limit: 2}})); err != nil {
		t.Error(err)
	}
	if forward.TaxonomyCost("GET") != 1 || forward.TaxonomyCost("PUT") != 2 || forward.TaxonomyCost("POST") != 2 || forward.TaxonomyCost("DELETE") != 2 {
		t.Error("costs")
	}
}

// TestTaxonomySharedLimiter: with APIConfig.Limiter, forwarded calls count
// on the limiter given (the tracking plan's reads use it too): what another
// user of it spent for the project is no longer the operators'.
func TestTaxonomySharedLimiter(t *testing.T) {
	env := ft.Start(t, forward.Config{})
	cfg := forward.APIConfig{URL: baseurl.NewRef(env.SimURL), Limit: ratelimit.Config{Limit: 5, Window: time.Hour, MaxWait: -1}}
	lim, err := ratelimit.New(forward.TaxonomyLimit(cfg), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Limiter = lim
	relay := ft.Serve(t, env.Routes(t, forward.Taxonomy(cfg)))
	for range 4 { // another user of the limiter spends 4 of the project's 5
		release, err := lim.Acquire(context.Background(), "project:"+ft.Project, 1)
		if err != nil {
			t.Fatal(err)
		}
		release()
	}
	if r := ft.Do(t, "GET", relay+"/api/2/taxonomy/event", "", ft.Injected()...); r.Status != 200 {
		t.Fatalf("the fifth: %v", r)
	}
	if r := ft.Do(t, "GET", relay+"/api/2/taxonomy/event", "", ft.Injected()...); r.Status != 429 || !strings.Contains(r.Body, `"source":"relay"`) {
		t.Fatalf("the sixth: %v", r)
	}
	if n := env.Calls(); n != 1 {
		t.Fatalf("sim saw %d calls, want 1", n)
	}
}
