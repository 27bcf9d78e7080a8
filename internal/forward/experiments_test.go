package forward_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/forward"
	ft "github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/sim"
)

func experimentStart(t *testing.T) (*ft.Env, string) {
	t.Helper()
	env := ft.Start(t, forward.Config{})
	return env, ft.Serve(t, env.Routes(t, forward.Experiments(forward.APIConfig{URL: baseurl.NewRef(env.SimURL)})))
}

// TestExperimentEveryEndpoint walks every endpoint of the document's table through
// the relay to the simulator and back.
func TestExperimentEveryEndpoint(t *testing.T) {
	env, relay := experimentStart(t)
	r := ft.Do(t, "POST", relay+"/api/1/experiments", `{"projectId":"1","name":"e","key":"e","variants":[{"key":"on"}]}`,
		ft.Injected("Content-Type", "application/json")...)
	var created struct{ ID string }
	if r.Status != 200 || json.Unmarshal([]byte(r.Body), &created) != nil || created.ID == "" {
		t.Fatalf("create: %v", r)
	}
	if c := env.LastCall(t, 1); c.Auth != "bearer" || c.Principal != sim.KeyLabel(ft.MgmtKey) {
		t.Fatalf("create: sim saw %+v", c)
	}
	e := "/api/1/experiments/" + created.ID
	v := e + "/variants/c"
	steps := []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"GET", "/api/1/experiments?limit=10", "", 200, `"id":"` + created.ID + `"`},
		{"GET", e, "", 200, `"deliveryMethod":"feature"`},
		{"PATCH", e, `{"name":"renamed","enabled":true}`, 200, "renamed"},
		{"GET", e + "/versions", "", 200, `"versionId"`},
		{"GET", e + "/versions/1", "", 200, `"versionId":"1"`},
		{"POST", e + "/variants", `{"key":"c","name":"C","payload":{"a":1},"rolloutWeight":1}`, 200, "OK"},
		{"GET", e + "/variants", "", 200, `"key":"c"`},
		{"GET", v, "", 200, `"name":"C"`},
		{"PATCH", v, `{"description":"d"}`, 200, "OK"},
		{"POST", v + "/users", `{"inclusions":["u1","u2","u3"]}`, 200, "OK"},
		{"GET", v + "/users", "", 200, `["u1","u2","u3"]`},
		{"DELETE", v + "/users/0", "", 200, "OK"},
		{"DELETE", v + "/bulk-delete-users", `{"users":["u2"]}`, 200, "OK"},
		{"DELETE", v + "/users", "", 200, "OK"},
		{"POST", v + "/cohorts", `{"inclusions":["c1","c2"]}`, 200, "OK"},
		{"GET", v + "/cohorts", "", 200, `["c1","c2"]`},
		{"DELETE", v + "/bulk-delete-cohorts", `{"users":["c1"]}`, 200, "OK"},
		{"POST", e + "/deployments", `{"deployments":["d1"]}`, 200, "OK"},
		{"GET", e + "/deployments", "", 200, `"id":"d1"`},
		{"DELETE", e + "/deployments/d1", "", 200, "OK"},
		{"DELETE", v, "", 200, "OK"},
		{"GET", v, "", 404, ""},
	}
	for i, s := range steps {
		r := ft.Do(t, s.method, relay+s.path, s.body, ft.Injected("Content-Type", "application/json")...)
		c := env.LastCall(t, i+2)
		wantPath, wantQuery, _ := strings.Cut(s.path, "?")
		if r.Status != s.status || !strings.Contains(r.Body, s.want) || c.Status != s.status || c.Method != s.method ||
			c.Path != wantPath || c.Query != wantQuery || c.Auth != "bearer" || c.Principal != sim.KeyLabel(ft.MgmtKey) {
			t.Errorf("%s %s: relay %v, sim saw %+v", s.method, s.path, r, c)
		}
		if !strings.Contains(strings.Join(c.Headers, ","), "Accept") {
			t.Errorf("%s %s: no Accept header at the sim", s.method, s.path)
		}
	}
	// A web experiment: PATCH answered 405 by the upstream, passed back.
	web := env.Sim.AddWebExperiment("w")
	if r := ft.Do(t, "PATCH", relay+"/api/1/experiments/"+web, `{"name":"x"}`, ft.Injected()...); r.Status != 405 {
		t.Errorf("web PATCH: %v", r)
	}
	// Pass-through: the caller's own key.
	if r := ft.Do(t, "GET", relay+e, "", ft.PassThrough("Bearer "+ft.MgmtKey)...); r.Status != 200 {
		t.Errorf("pass-through: %v", r)
	}
	if r := ft.Do(t, "GET", relay+e, "", ft.PassThrough("Bearer wrong")...); r.Status != 403 {
		t.Errorf("pass-through with a wrong key: %v", r)
	}
}

func TestExperimentLocalValidation(t *testing.T) {
	env, relay := experimentStart(t)
	many := `{"users":[` + strings.Repeat(`"u",`, 100) + `"u"]}`
	v := "/api/1/experiments/1/variants/on"
	for _, c := range []struct{ name, method, path, body string }{
		{"bulk-delete-users over 100", "DELETE", v + "/bulk-delete-users", many},
		{"bulk-delete-cohorts over 100", "DELETE", v + "/bulk-delete-cohorts", many},
		{"bulk-delete-users no users", "DELETE", v + "/bulk-delete-users", `{}`},
		{"bulk-delete-users not strings", "DELETE", v + "/bulk-delete-users", `{"users":[1]}`},
		{"variant without key", "POST", "/api/1/experiments/1/variants", `{"name":"x"}`},
		{"create with keyless variant", "POST", "/api/1/experiments", `{"name":"x","variants":[{"name":"y"}]}`},
		{"inclusions missing", "POST", v + "/users", `{"users":["a"]}`},
		{"cohort inclusions not array", "POST", v + "/cohorts", `{"inclusions":"c"}`},
		{"deployments missing", "POST", "/api/1/experiments/1/deployments", `{}`},
		{"patch not JSON", "PATCH", "/api/1/experiments/1", `name=x`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := ft.Do(t, c.method, relay+c.path, c.body, ft.Injected()...)
			if r.Status != 400 || !strings.Contains(r.Body, `"source":"relay"`) {
				t.Errorf("got %v", r)
			}
		})
	}
	// Exactly 100 passes (to the sim, whose experiment 1 does not exist: 404).
	ok := `{"users":[` + strings.Repeat(`"u",`, 99) + `"u"]}`
	if r := ft.Do(t, "DELETE", relay+v+"/bulk-delete-users", ok, ft.Injected()...); r.Status != 404 || env.Calls() != 1 {
		t.Errorf("100 entries: %v", r)
	}
	for _, p := range []string{"/api/1/experiments/1/other", "/api/1/experiments/1/variants/on/users/0/x", "/api/1/experimentsX"} {
		if r := ft.Do(t, "GET", relay+p, "", ft.Injected()...); r.Status != 404 && r.Status != 405 {
			t.Errorf("GET %s: %v", p, r)
		}
	}
	if r := ft.Do(t, "PUT", relay+"/api/1/experiments/1", "{}", ft.Injected()...); r.Status != 404 && r.Status != 405 {
		t.Errorf("PUT: %v", r)
	}
	if n := env.Calls(); n != 1 {
		t.Fatalf("the simulator saw %d calls", n)
	}
}

func TestExperimentMissingManagementKey(t *testing.T) {
	env, relay := experimentStart(t)
	r := ft.Do(t, "GET", relay+"/api/1/experiments", "", "Authorization", "Bearer "+ft.AdminToken, "X-Relay-Project", ft.NoOrgProject)
	if r.Status != 400 || !strings.Contains(r.Body, "management_api_key") || env.Calls() != 0 {
		t.Fatalf("%v", r)
	}
}
