package forward_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
	ft "github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/ratelimit"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

// scimStart serves the API with its limit changed by lim, on a simulator.
func scimStart(t *testing.T, lim ratelimit.Config) (*ft.Env, string) {
	t.Helper()
	env := ft.Start(t, forward.Config{})
	return env, ft.Serve(t, env.Routes(t, forward.SCIM(forward.APIConfig{URL: baseurl.NewRef(env.SimURL), Limit: lim})))
}

func scimUserBody(email string) string {
	return `{"schemas":["urn:ietf:params:scim:schemas:core:2.0:User"],"id":"` + email + `","userName":"` + email +
		`","name":{"givenName":"A","familyName":"B"},"emails":[{"value":"` + email + `","primary":true}]}`
}

func scimPatchBody(op, email string) string {
	return `{"schemas":["` + forward.SCIMPatchOpSchema + `"],"Operations":[{"op":"` + op + `","path":"members","value":[{"value":"` + email + `"}]}]}`
}

// TestSCIMEveryEndpoint walks every endpoint of the document's table through
// the relay to the simulator and back, with injected credentials.
func TestSCIMEveryEndpoint(t *testing.T) {
	env, relay := scimStart(t, ratelimit.Config{})
	steps := []struct {
		method, path, body string
		status             int
	}{
		{"POST", "/scim/1/Users", scimUserBody("ann@x.io"), 201},
		{"GET", "/scim/1/Users?startIndex=1&itemsPerPage=100&filter=userName%20eq%20%22ann@x.io%22", "", 200},
		{"GET", "/scim/1/Users/ANN@x.io", "", 200},
		{"PUT", "/scim/1/Users/ann@x.io", scimUserBody("ann@x.io"), 200},
		{"PATCH", "/scim/1/Users/ann@x.io", `{"active":true}`, 200},
		{"POST", "/scim/1/Groups", `{"schemas":["urn:ietf:params:scim:schemas:core:2.0:Group"],"displayName":"g","members":[]}`, 200},
		{"GET", "/scim/1/Groups", "", 200},
		{"GET", "/scim/1/Groups/1001", "", 200},
		{"PATCH", "/scim/1/Groups/1001", scimPatchBody("add", "ann@x.io"), 200},
		{"PATCH", "/scim/1/Groups/1001", scimPatchBody("remove", "ann@x.io"), 200},
		{"DELETE", "/scim/1/Groups/1001", "", 204},
		{"DELETE", "/scim/1/Users/ann@x.io", "", 204},
		{"GET", "/scim/1/Users/ann@x.io", "", 404},
	}
	for i, s := range steps {
		r := ft.Do(t, s.method, relay+s.path, s.body, ft.Injected("Content-Type", "application/scim+json")...)
		c := env.LastCall(t, i+1)
		wantPath, wantQuery, _ := strings.Cut(s.path, "?")
		if r.Status != s.status || c.Status != s.status || c.Method != s.method || c.Path != wantPath ||
			c.Query != wantQuery || c.Auth != "bearer" || c.Principal != sim.KeyLabel(ft.SCIMToken) || c.Account != ft.Org {
			t.Errorf("%s %s: relay %v, sim saw %+v", s.method, s.path, r, c)
		}
		if s.method != "GET" && s.method != "DELETE" && c.Body != s.body {
			t.Errorf("%s %s: body changed on the way: %q", s.method, s.path, c.Body)
		}
	}
}

// TestSCIMLocalValidation: each refused locally with 400 and the sim sees nothing.
func TestSCIMLocalValidation(t *testing.T) {
	env, relay := scimStart(t, ratelimit.Config{})
	for _, c := range []struct{ name, method, path, body string }{
		{"itemsPerPage above 100", "GET", "/scim/1/Users?itemsPerPage=101", ""},
		{"itemsPerPage not a number", "GET", "/scim/1/Users?itemsPerPage=ten", ""},
		{"startIndex 0", "GET", "/scim/1/Users?startIndex=0", ""},
		{"groups itemsPerPage above 100", "GET", "/scim/1/Groups?itemsPerPage=500", ""},
		{"create with invalid email", "POST", "/scim/1/Users", scimUserBody("not-an-email")},
		{"create without id", "POST", "/scim/1/Users", `{"userName":"a@x.io"}`},
		{"create not JSON", "POST", "/scim/1/Users", `{`},
		{"put non-email id", "PUT", "/scim/1/Users/bob", scimUserBody("bob@x.io")},
		{"patch non-email id", "PATCH", "/scim/1/Users/bob%40", `{}`},
		{"delete non-email id", "DELETE", "/scim/1/Users/bob", ""},
		{"group id not integer", "GET", "/scim/1/Groups/abc", ""},
		{"delete group id not integer", "DELETE", "/scim/1/Groups/1x", ""},
		{"group without displayName", "POST", "/scim/1/Groups", `{"members":[]}`},
		{"group member not email", "POST", "/scim/1/Groups", `{"displayName":"g","members":[{"value":"x"}]}`},
		{"patch wrong schema", "PATCH", "/scim/1/Groups/1", strings.Replace(scimPatchBody("add", "a@x.io"), "PatchOp", "Patch", 1)},
		{"patch no operations", "PATCH", "/scim/1/Groups/1", `{"schemas":["` + forward.SCIMPatchOpSchema + `"],"Operations":[]}`},
		{"patch op replace", "PATCH", "/scim/1/Groups/1", scimPatchBody("replace", "a@x.io")},
		{"patch path not members", "PATCH", "/scim/1/Groups/1", strings.Replace(scimPatchBody("add", "a@x.io"), `"members"`, `"displayName"`, 1)},
		{"patch member not email", "PATCH", "/scim/1/Groups/1", scimPatchBody("add", "nope")},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := ft.Do(t, c.method, relay+c.path, c.body, ft.Injected()...)
			var e struct {
				Schemas                []string
				Status, Detail, Source string
			}
			if r.Status != 400 || json.Unmarshal([]byte(r.Body), &e) != nil || e.Status != "400" || e.Source != "relay" ||
				len(e.Schemas) != 1 || e.Schemas[0] != forward.SCIMErrorSchema {
				t.Errorf("got %v", r)
			}
		})
	}
	for _, p := range []string{"/scim/1/Users/a@x.io/extra", "/scim/1/Groups/1/members", "/scim/1/Users/"} {
		if r := ft.Do(t, "GET", relay+p, "", ft.Injected()...); r.Status != 404 {
			t.Errorf("GET %s: %v, want a local 404", p, r)
		}
	}
	// An encoded separator or dot segment is refused before routing.
	if r := ft.Do(t, "GET", relay+"/scim/1/Users/a%2F..%2Fb/x", "", ft.Injected()...); r.Status != 400 || !strings.Contains(r.Body, `"source":"relay"`) {
		t.Errorf("encoded traversal: %v, want a local 400", r)
	}
	if n := env.Calls(); n != 0 {
		t.Fatalf("the simulator saw %d calls", n)
	}
}

func TestSCIMPassThroughAndInjected(t *testing.T) {
	env, relay := scimStart(t, ratelimit.Config{})
	// Pass-through: the caller's own token reaches the sim untouched, the
	// admin token does not.
	r := ft.Do(t, "GET", relay+"/scim/1/Users", "", ft.PassThrough("Bearer "+ft.SCIMToken)...)
	c := env.LastCall(t, 1)
	if r.Status != 200 || c.Principal != sim.KeyLabel(ft.SCIMToken) || c.Account != ft.Org {
		t.Fatalf("relay %v, sim %+v", r, c)
	}
	for _, h := range c.Headers {
		if h == "Proxy-Authorization" || h == "X-Relay-Project" {
			t.Errorf("sim saw %s", h)
		}
	}
	// A wrong token of the caller's: the upstream's 403 comes back.
	if r := ft.Do(t, "GET", relay+"/scim/1/Users", "", ft.PassThrough("Bearer wrong")...); r.Status != 403 {
		t.Errorf("wrong caller token: %v", r)
	}
	// Injected.
	ft.Do(t, "GET", relay+"/scim/1/Users", "", ft.Injected()...)
	if c := env.LastCall(t, 3); c.Principal != sim.KeyLabel(ft.SCIMToken) || c.Auth != "bearer" {
		t.Errorf("injected: sim %+v", c)
	}
	// No admin token, wrong admin token, unknown project, project without an organization.
	for _, h := range [][]string{
		{"Authorization", "Bearer " + ft.SCIMToken},
		{"Authorization", "Bearer nope", "X-Relay-Project", ft.Project},
		{"Authorization", "Bearer " + ft.AdminToken, "X-Relay-Project", "nope"},
		{"Authorization", "Bearer " + ft.AdminToken, "X-Relay-Project", ft.NoOrgProject},
	} {
		r := ft.Do(t, "GET", relay+"/scim/1/Users", "", h...)
		if r.Status != 401 && r.Status != 403 && r.Status != 400 {
			t.Errorf("%v: %v", h, r)
		}
		if strings.Contains(r.Body, ft.SCIMToken) || strings.Contains(r.Body, ft.AdminToken) {
			t.Errorf("answer echoes a secret: %v", r)
		}
	}
	if n := env.Calls(); n != 3 {
		t.Errorf("sim saw %d calls, want 3", n)
	}
}

// TestSCIMBurstStaysUnderRate fires 300 SCIM calls at once; the sim must never
// see more than 100 in any window (shrunk to 1 s, same ratio), and every
// caller gets the upstream's answer or a local 429 with Retry-After.
func TestSCIMBurstStaysUnderRate(t *testing.T) {
	const window = time.Second
	env, relay := scimStart(t, ratelimit.Config{Limit: 100, Window: window, MaxWait: 1500 * time.Millisecond})
	simtest.SetSCIMRate(env.Sim, 100, window)
	var wg sync.WaitGroup
	var mu sync.Mutex
	upstream, local := 0, 0
	start := time.Now()
	for i := range 300 {
		wg.Go(func() {
			r := ft.Do(t, "GET", relay+"/scim/1/Users?itemsPerPage=1&startIndex="+strconv.Itoa(1+i%5), "", ft.Injected()...)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case r.Status == 200:
				upstream++
			case r.Status == 429 && strings.Contains(r.Body, `"source":"relay"`):
				ra, err := strconv.Atoi(r.Header.Get("Retry-After"))
				if err != nil || ra < 1 {
					t.Errorf("local 429 without Retry-After: %v %v", r, r.Header)
				}
				local++
			default:
				t.Errorf("unexpected answer %v", r)
			}
		})
	}
	wg.Wait()
	calls := simtest.MgmtCalls(env.Sim)
	most := simtest.MaxCallsInWindow(calls, "scim", window)
	t.Logf("%d answered by the upstream, %d refused locally, in %v; at most %d calls in any %v at the sim",
		upstream, local, time.Since(start).Round(time.Millisecond), most, window)
	if most > 100 {
		t.Fatalf("the simulator saw %d calls within %v", most, window)
	}
	for _, c := range calls {
		if c.Status == 429 {
			t.Fatalf("the simulator had to refuse a call: %+v", c)
		}
	}
	// More than 100 got through: callers within MaxWait waited for their turn.
	if upstream != len(calls) || upstream+local != 300 || upstream <= 100 || local == 0 {
		t.Fatalf("upstream %d (sim saw %d), local %d", upstream, len(calls), local)
	}
}

func TestSCIMLimitRefusesAtOnceAndUpstream429PassesBack(t *testing.T) {
	// MaxWait 10 minutes: a call that waited for its turn would take that
	// long, a refused one milliseconds; polltest.Max tells them apart on any
	// machine.
	env, relay := scimStart(t, ratelimit.Config{Limit: 3, Window: time.Hour, MaxWait: 10 * time.Minute})
	simtest.SetSCIMRate(env.Sim, 2, time.Hour)
	var got []int
	for range 4 {
		t0 := time.Now()
		r := ft.Do(t, "GET", relay+"/scim/1/Groups", "", ft.Injected()...)
		if time.Since(t0) > polltest.Max {
			t.Errorf("call waited %v", time.Since(t0))
		}
		got = append(got, r.Status)
		if r.Status == 429 && r.Header.Get("Retry-After") == "" {
			t.Errorf("429 without Retry-After: %v", r)
		}
		if len(got) == 3 && strings.Contains(r.Body, `"source":"relay"`) {
			t.Errorf("third call should be the upstream's own 429: %v", r)
		}
		if len(got) == 4 && !strings.Contains(r.Body, `"source":"relay"`) {
			t.Errorf("fourth call should be refused locally: %v", r)
		}
	}
	if fmt.Sprint(got) != "[200 200 429 429]" || env.Calls() != 3 {
		t.Fatalf("statuses %v, sim saw %d", got, env.Calls())
	}
}

// TestSCIMRegionBase: an organization's scim_url override beats --scim-url.
func TestSCIMRegionBase(t *testing.T) {
	env := ft.Start(t, forward.Config{})
	eu, euURL := ft.StartSim(t, sim.Config{})
	creds, err := credentials.Parse([]byte(strings.Replace(ft.CredentialsYAML, `    projects: [web-prod]`,
		"    projects: [web-prod]\n    scim_url: \""+euURL+"\"", 1)))
	if err != nil {
		t.Fatal(err)
	}
	fwd := ft.Forwarder(t, forward.Config{}, creds)
	rs, err := fwd.Routes(forward.SCIM(forward.APIConfig{URL: baseurl.NewRef(env.SimURL)}))
	if err != nil {
		t.Fatal(err)
	}
	relay := ft.Serve(t, rs)
	if r := ft.Do(t, "GET", relay+"/scim/1/Users", "", ft.Injected()...); r.Status != 200 {
		t.Fatal(r)
	}
	if env.Calls() != 0 || len(simtest.MgmtCalls(eu)) != 1 {
		t.Fatalf("default sim %d calls, EU sim %d", env.Calls(), len(simtest.MgmtCalls(eu)))
	}
}

func TestSCIMConfig(t *testing.T) {
	bad := forward.APIConfig{Limit: ratelimit.Config{Window: -1}}
	if _, err := ft.Forwarder(t, forward.Config{}, nil).Routes(forward.SCIM(bad)); err == nil {
		t.Error("Routes accepted a bad Config")
	}
	for e, ok := range map[string]bool{"a@b.co": true, "A.B+c@x.y.z": true, "a@b": false, "@b.co": false,
		"a b@c.de": false, "a@@b.co": false, "a@b..co": false, "": false, "<a@b.co>": false} {
		if forward.ValidEmail(e) != ok {
			t.Errorf("ValidEmail(%q) != %v", e, ok)
		}
	}
}
