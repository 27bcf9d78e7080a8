package sim

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// mgmtSim starts a sim on 127.0.0.1 and returns a request helper.
func mgmtSim(t *testing.T, cfg Config) (*Sim, func(method, path, auth, ctype, body string) (int, http.Header, string)) {
	t.Helper()
	s := New(cfg, nil)
	base, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, func(method, path, auth, ctype, body string) (int, http.Header, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
}

func basicAuth(k, s string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(k+":"+s))
}

type step struct {
	method, path, auth, body string
	status                   int
	contains                 string
}

func runSteps(t *testing.T, do func(method, path, auth, ctype, body string) (int, http.Header, string), ctype string, steps []step) {
	t.Helper()
	for i, st := range steps {
		status, _, body := do(st.method, st.path, st.auth, ctype, st.body)
		if status != st.status || !strings.Contains(body, st.contains) {
			t.Errorf("step %d %s %s: %d %q, want %d containing %q", i, st.method, st.path, status, body, st.status, st.contains)
		}
	}
}

func TestSimSCIM(t *testing.T) {
	s, do := mgmtSim(t, Config{})
	s.Knobs(func(k *Knobs) { k.SCIMTokens["tok-a"] = "acme" })
	a := "Bearer tok-a"
	user := func(email string) string {
		return `{"schemas":["` + SCIMUserSchema + `"],"id":"` + email + `","userName":"` + email + `","name":{"givenName":"A","familyName":"B"},"emails":[{"value":"` + email + `","primary":true}]}`
	}
	patch := func(op, email string) string {
		return `{"schemas":["` + SCIMPatchOpSchema + `"],"Operations":[{"op":"` + op + `","path":"members","value":[{"value":"` + email + `"}]}]}`
	}
	runSteps(t, do, "application/json", []step{
		{"GET", "/scim/1/Users", "", "", 401, "Bearer"},
		{"GET", "/scim/1/Users", "Bearer nope", "", 403, "invalid"},
		{"GET", "/scim/1/Users", "Basic eDp5", "", 401, ""},
		{"POST", "/scim/1/Users", a, user("Ann@x.io"), 201, `"userName":"Ann@x.io"`},
		{"POST", "/scim/1/Users", a, user("ann@x.io"), 409, "uniqueness"},
		{"POST", "/scim/1/Users", a, user("not-an-email"), 400, "valid email"},
		{"POST", "/scim/1/Users", a, user("bob@x.io"), 201, ""},
		{"GET", "/scim/1/Users/ANN@X.IO", a, "", 200, `"active":true`},
		{"GET", "/scim/1/Users?itemsPerPage=101", a, "", 400, "itemsPerPage"},
		{"GET", "/scim/1/Users?startIndex=2&itemsPerPage=1", a, "", 200, `"totalResults":2`},
		{"GET", "/scim/1/Users?startIndex=2&itemsPerPage=1", a, "", 200, `"userName":"bob@x.io"`},
		{"GET", "/scim/1/Users?startIndex=9223372036854775807", a, "", 200, `"Resources":[]`},
		{"GET", "/scim/1/Users?filter=userName%20eq%20%22BOB@x.io%22", a, "", 200, `"totalResults":1`},
		{"GET", "/scim/1/Users?filter=name%20co%20%22b%22", a, "", 400, "invalidFilter"},
		{"PUT", "/scim/1/Users/bob@x.io", a, `{"userName":"other@x.io"}`, 400, "cannot be changed"},
		{"PUT", "/scim/1/Users/nobody@x.io", a, `[]`, 404, ""},
		{"PUT", "/scim/1/Users/bob@x.io", a, `[]`, 400, "invalidSyntax"},
		{"POST", "/scim/1/Users", a, `"x"`, 400, "not a JSON object"},
		{"POST", "/scim/1/Groups", a, `[]`, 400, "not a JSON object"},
		{"POST", "/scim/1/Groups", a, `{"schemas":["` + SCIMGroupSchema + `"],"displayName":"g","members":[{"value":"new@x.io"}]}`, 200, `"id":1001`},
		{"GET", "/scim/1/Users/new@x.io", a, "", 200, `"display":"g"`},
		{"GET", "/scim/1/Groups/1001", a, "", 200, `"id":"1001"`},
		{"GET", "/scim/1/Groups/abc", a, "", 400, "integer"},
		{"GET", "/scim/1/Groups/9", a, "", 404, ""},
		{"PATCH", "/scim/1/Groups/1001", a, patch("add", "bob@x.io"), 200, `"value":"bob@x.io"`},
		{"PATCH", "/scim/1/Groups/1001", a, `[]`, 400, "not a PatchOp"},
		{"PATCH", "/scim/1/Groups/1001", a, `{"schemas":["x"],"Operations":[{"op":"add","path":"members","value":[]}]}`, 400, "PatchOp"},
		{"PATCH", "/scim/1/Groups/1001", a, `{"schemas":["` + SCIMPatchOpSchema + `"],"Operations":[{"op":"replace","path":"members","value":[]}]}`, 400, "add or remove"},
		{"PATCH", "/scim/1/Groups/1001", a, patch("remove", "bob@x.io"), 200, `"id":"1001"`},
		{"PATCH", "/scim/1/Users/bob@x.io", a, `{"active":false}`, 200, ""},
		{"GET", "/scim/1/Users/bob@x.io", a, "", 404, ""},
		{"DELETE", "/scim/1/Users/ann@x.io", a, "", 204, ""},
		{"DELETE", "/scim/1/Users/ann@x.io", a, "", 404, ""},
		{"GET", "/scim/1/Groups", a, "", 200, `"totalResults":1`},
		{"DELETE", "/scim/1/Groups/1001", a, "", 204, ""},
	})
	if _, _, got := do("GET", "/scim/1/Users", a, "", ""); !strings.Contains(got, `"totalResults":1`) || !strings.Contains(got, `"id":"new@x.io"`) {
		t.Errorf("users %s", got)
	}
}

func TestSimSCIMRate(t *testing.T) {
	s, do := mgmtSim(t, Config{})
	s.Knobs(func(k *Knobs) { k.SCIMLimit, k.SCIMWindow = 5, time.Hour })
	for i := range 7 {
		status, h, _ := do("GET", "/scim/1/Users", "Bearer org1", "", "")
		switch {
		case i < 5 && status != 200:
			t.Fatalf("call %d: %d", i, status)
		case i >= 5 && (status != 429 || h.Get("Retry-After") == ""):
			t.Fatalf("call %d: %d retry-after %q", i, status, h.Get("Retry-After"))
		}
	}
	if status, _, _ := do("GET", "/scim/1/Users", "Bearer org2", "", ""); status != 200 {
		t.Fatalf("another organization limited: %d", status)
	}
	by := map[string]int{}
	for _, c := range readOut[MgmtCalls](t, s, "/sim/mgmt/calls").Calls {
		if c.API == "scim" {
			by[c.Account]++
		}
	}
	if len(by) != 2 || by[readOut[MgmtCalls](t, s, "/sim/mgmt/calls").Calls[0].Account] != 7 {
		t.Errorf("logged scim calls by account %v, want 7 of the first (the refused ones too) and 1 of another", by)
	}
}

func TestSimClassifiers(t *testing.T) {
	s, do := mgmtSim(t, Config{})
	s.Knobs(func(k *Knobs) { k.ProjectSecrets["k1"] = "s1" })
	a := basicAuth("k1", "s1")
	def := `{"csvDefinition":{"csvText":"channel,utm_source\nSearch,google","separator":null}}`
	big := `{"csvDefinition":{"csvText":"` + strings.Repeat("a", ClassifierMaxCSVBytes+1) + `"}}`
	runSteps(t, do, "application/json", []step{
		{"GET", "/api/2/channel-classifiers", "", "", 401, ""},
		{"GET", "/api/2/channel-classifiers", basicAuth("k1", "wrong"), "", 403, ""},
		{"GET", "/api/2/channel-classifiers/none", a, "", 404, ""},
		{"POST", "/api/2/channel-classifiers/bad.name", a, def, 400, "letters"},
		{"POST", "/api/2/channel-classifiers/ch_1", a, `{}`, 400, "csvDefinition"},
		{"POST", "/api/2/channel-classifiers/ch_1", a, `{"csvDefinition":{}}`, 400, "csvText"},
		{"POST", "/api/2/channel-classifiers/ch_1", a, big, 413, ""},
		{"POST", "/api/2/channel-classifiers/ch_1", a, `{"displayName":"` + strings.Repeat("é", 1001) + `","csvDefinition":{"csvText":"x"}}`, 400, "1000"},
		{"POST", "/api/2/channel-classifiers/ch_1", a, `{"displayName":"` + strings.Repeat("é", 1000) + `","csvDefinition":{"csvText":"x"}}`, 200, `"created"`},
		{"POST", "/api/2/channel-classifiers/ch_1", a, def, 409, ""},
		{"PATCH", "/api/2/channel-classifiers/none", a, def, 404, ""},
		{"PATCH", "/api/2/channel-classifiers/ch_1", a, def, 200, `"updated"`},
		{"GET", "/api/2/channel-classifiers/ch_1", a, "", 200, `"separator":null`},
		{"POST", "/api/2/channel-classifiers/ch_2", a, `{"description":"d1","csvDefinition":{"csvText":"x"}}`, 200, `"created"`},
		{"GET", "/api/2/channel-classifiers/ch_2", a, "", 200, `"description":"d1"`},
		{"PATCH", "/api/2/channel-classifiers/ch_2", a, `{"description":"d2","csvDefinition":{"csvText":"y"}}`, 200, `"updated"`},
		{"GET", "/api/2/channel-classifiers/ch_2", a, "", 200, `"description":"d2"`},
		{"GET", "/api/2/channel-classifiers", basicAuth("k2", "x"), "", 200, `"channelClassifiers":[]`},
	})
}

func TestSimTaxonomyLifecycle(t *testing.T) {
	s, do := mgmtSim(t, Config{})
	a := basicAuth("k1", "s1")
	s.SeedTaxonomy("k1", "event", "live_ev", "live")
	s.SeedTaxonomy("k1", "event", "unexp_ev", "unexpected")
	s.SeedTaxonomy("k1", "event", "tr_ev", "transformed")
	s.SeedTaxonomy("k1", "user-property", "plan", "live")
	const p = "/api/2/taxonomy"
	runSteps(t, do, "application/x-www-form-urlencoded", []step{
		{"POST", p + "/category", a, "", 400, "category_name"},
		{"POST", p + "/category", a, "category_name=Web", 200, `"success":true`},
		{"POST", p + "/category", a, "category_name=Web", 409, `"success":false`},
		{"GET", p + "/category/Web", a, "", 200, `"id":1`},
		{"GET", p + "/category/None", a, "", 400, ""},
		{"PUT", p + "/category/1", a, "category_name=App", 200, ""},
		{"PUT", p + "/category/9", a, "category_name=App", 409, ""},
		{"DELETE", p + "/category/1", a, "", 200, ""},
		{"POST", p + "/event", a, "event_type=Sign%20up&tags=a,b", 200, ""},
		{"GET", p + "/event/Sign%20up", a, "", 200, `"tags":["a","b"]`},
		{"DELETE", p + "/event/Sign%20up", a, "", 200, ""}, // planned: removed
		{"GET", p + "/event/Sign%20up", a, "", 400, ""},
		{"DELETE", p + "/event/live_ev", a, "", 200, ""},
		{"GET", p + "/event/live_ev?showDeleted=true", a, "", 400, "event type not found"},
		{"DELETE", p + "/event/live_ev", a, "", 400, "deleted"},
		{"GET", p + "/event", a, "", 200, "unexp_ev"},
		{"GET", p + "/event?showDeleted=true", a, "", 200, "live_ev"},
		{"POST", p + "/event/live_ev/restore", a, "", 200, ""},
		{"POST", p + "/event/live_ev/restore", a, "", 400, "not deleted"},
		{"DELETE", p + "/event/unexp_ev", a, "", 200, ""},
		{"DELETE", p + "/event/tr_ev", a, "", 400, "transformed"},
		{"DELETE", p + "/event/nope", a, "", 409, ""},
		{"POST", p + "/event/nope/restore", a, "", 409, ""},
		{"POST", p + "/event", a, "event_type=live_ev", 409, "event type exists"},
		{"PUT", p + "/event/live_ev", a, "new_event_type=unexp_ev", 409, "event type exists"}, // deleted, still there
		{"PUT", p + "/event/nope", a, "description=d", 409, "event type not found"},
		{"PUT", p + "/event/live_ev", a, "new_event_type=renamed&description=d", 200, ""},
		{"GET", p + "/event/renamed", a, "", 200, `"description":"d"`},
		{"GET", p + "/event/live_ev", a, "", 400, "not found"},
		{"POST", p + "/event-property", a, "event_property=plan", 200, ""},
		{"POST", p + "/event-property", a, "event_property=plan", 409, ""},
		{"POST", p + "/event-property", a, "event_property=plan&event_type=live_ev", 200, ""}, // override
		{"POST", p + "/event-property", a, "event_property=plan&event_type=live_ev", 409, ""},
		{"GET", p + "/event-property?event_type=live_ev", a, "", 200, `"event_property":"plan"`},
		{"PUT", p + "/event-property/plan", a, "event_type=live_ev&overrideScope=override&classifications=PII", 400, "classifications"},
		{"PUT", p + "/event-property/plan", a, "classifications=PII", 200, ""},
		{"DELETE", p + "/event-property/plan?event_type=live_ev", a, "", 200, ""},
		{"GET", p + "/event-property?event_type=live_ev&showDeleted=true", a, "", 200, `"data":[]`},
		{"DELETE", p + "/event-property/plan", a, "event_type=live_ev", 409, ""},
		{"POST", p + "/event-property/plan/restore", a, "event_type=live_ev", 201, ""},
		{"POST", p + "/user-property", a, "", 400, "user_property"},
		{"GET", p + "/user-property/gp:plan", a, "", 200, `"user_property":"gp:plan"`},
		{"GET", p + "/user-property/none", a, "", 404, ""},
		{"DELETE", p + "/user-property/plan", a, "", 200, ""},
		{"POST", p + "/user-property/plan/restore", a, "", 200, ""},
		{"POST", p + "/user-property", a, "user_property=gp:plan", 409, "user property exists"},
		{"PUT", p + "/user-property/gp:plan", a, "new_user_property_value=gp:tier&description=v", 200, ""},
		{"GET", p + "/user-property/tier", a, "", 200, `"description":"v"`},
		{"PUT", p + "/user-property/plan", a, "description=w", 409, "user property not found"},
		{"DELETE", p + "/user-property/tier", a, "", 200, ""},
		{"GET", p + "/user-property/tier?showDeleted=true", a, "", 200, `"deleted":true`},
		{"GET", p + "/user-property", a, "", 200, `"data":[]`},
		{"GET", p + "/user-property?showDeleted=true", a, "", 200, `"deleted":true`},
		{"POST", p + "/group-property", a, "group_type=org", 400, "group_property"},
		{"POST", p + "/group-property", a, "group_type=org&group_property=size", 200, ""},
		{"POST", p + "/group-property", a, "group_type=org&group_property=size", 409, "group property exists"},
		{"GET", p + "/group-property?group_type=org", a, "", 200, `"group_property":"size"`},
	})
}

func TestSimTaxonomyLimits(t *testing.T) {
	s, do := mgmtSim(t, Config{})
	s.Knobs(func(k *Knobs) { k.TaxonomyPeriodCost, k.TaxonomyPeriod = 5, time.Hour })
	a := basicAuth("k1", "s1")
	runSteps(t, do, "application/x-www-form-urlencoded", []step{
		{"POST", "/api/2/taxonomy/category", a, "category_name=a", 200, ""}, // 2
		{"POST", "/api/2/taxonomy/category", a, "category_name=b", 200, ""}, // 4
		{"GET", "/api/2/taxonomy/category", a, "", 200, ""},                 // 5
		{"GET", "/api/2/taxonomy/category", a, "", 429, "Too many"},
	})
	if n := readOut[MgmtCalls](t, s, "/sim/mgmt/calls").TaxonomyPeak[KeyLabel("k1")]; n != 2 {
		t.Errorf("peak %d", n)
	}
}

func TestSimExperiments(t *testing.T) {
	s, do := mgmtSim(t, Config{})
	s.Knobs(func(k *Knobs) { k.ManagementKeys["mk"] = true })
	web := s.AddWebExperiment("w")
	a := "Bearer mk"
	status, _, body := do("POST", "/api/1/experiments", a, "application/json",
		`{"projectId":"1","name":"e","key":"e","variants":[{"key":"on"},{"key":"off"}]}`)
	var created struct{ ID, URL string }
	if status != 200 || json.Unmarshal([]byte(body), &created) != nil || created.ID == "" {
		t.Fatalf("%d %s", status, body)
	}
	e := "/api/1/experiments/" + created.ID
	many := `{"users":[` + strings.Repeat(`"u",`, 100) + `"u"]}`
	runSteps(t, do, "application/json", []step{
		{"GET", "/api/1/experiments", "", "", 401, ""},
		{"GET", "/api/1/experiments", "Bearer x", "", 403, ""},
		{"GET", "/api/1/experiments?limit=1", a, "", 200, `"id":"` + created.ID + `"`},
		{"GET", e, a, "", 200, `"deliveryMethod":"feature"`},
		{"PATCH", "/api/1/experiments/" + web, a, `{"name":"x"}`, 405, ""},
		{"PATCH", e, a, `{"name":"x","enabled":true}`, 200, `"name":"x"`},
		{"PATCH", e, a, `{"projectId":"2"}`, 400, ""},
		{"GET", e + "/versions", a, "", 200, `"versionId":"2"`},
		{"GET", e + "/versions/1", a, "", 200, `"created"`},
		{"GET", e + "/versions/9", a, "", 404, ""},
		{"POST", e + "/variants", a, `{"name":"no key"}`, 400, "key"},
		{"POST", e + "/variants", a, `{"key":"c","payload":{"x":1}}`, 200, "OK"},
		{"GET", e + "/variants", a, "", 200, `"key":"c"`},
		{"PATCH", e + "/variants/c", a, `{"name":"C"}`, 200, "OK"},
		{"GET", e + "/variants/c", a, "", 200, `"name":"C"`},
		{"POST", e + "/variants/c/users", a, `{"inclusions":["u1","u2","u3"]}`, 200, "OK"},
		{"DELETE", e + "/variants/c/users/1", a, "", 200, "OK"},
		{"DELETE", e + "/variants/c/users/7", a, "", 404, ""},
		{"GET", e + "/variants/c/users", a, "", 200, `["u1","u3"]`},
		{"DELETE", e + "/variants/c/bulk-delete-users", a, many, 400, "100"},
		{"DELETE", e + "/variants/c/bulk-delete-users", a, `{"users":["u1"]}`, 200, "OK"},
		{"DELETE", e + "/variants/c/users", a, "", 200, "OK"},
		{"POST", e + "/variants/c/cohorts", a, `{"inclusions":["c1","c2"]}`, 200, "OK"},
		{"DELETE", e + "/variants/c/bulk-delete-cohorts", a, `{"users":["c1"]}`, 200, "OK"},
		{"GET", e + "/variants/c/cohorts", a, "", 200, `["c2"]`},
		{"POST", e + "/deployments", a, `{"deployments":["d1"]}`, 200, "OK"},
		{"GET", e + "/versions/5", a, "", 200, `"deployments added"`}, // inclusions make no version
		{"GET", e + "/versions/6", a, "", 404, ""},
		{"GET", e + "/deployments", a, "", 200, `"id":"d1"`},
		{"DELETE", e + "/deployments/d1", a, "", 200, "OK"},
		{"DELETE", e + "/deployments/d1", a, "", 404, ""},
		{"DELETE", e + "/variants/c", a, "", 200, "OK"},
		{"GET", e + "/variants/c", a, "", 404, ""},
		{"GET", "/api/1/experiments/999", a, "", 404, ""},
	})
}

// TestMgmtAuthAnswers pins each management group's 401 and 403 answers, the
// content type of its answers and the account its calls are logged under.
func TestMgmtAuthAnswers(t *testing.T) {
	s, do := mgmtSim(t, Config{APIKeys: []string{"key-a", "key-c"}})
	s.Knobs(func(k *Knobs) {
		k.ManagementKeys["mk"] = true
		k.SCIMTokens["tok"] = "acme"
		k.ProjectSecrets["key-a"] = "sec"
	})
	cases := []struct{ path, scheme, good, bad, forbidden, ct, account string }{
		{"/api/1/experiments", "Bearer", "Bearer mk", "Bearer other", "invalid management API key", "application/json", KeyLabel("mk")},
		{"/scim/1/Users", "Bearer", "Bearer tok", "Bearer other", "invalid SCIM token", "application/scim+json", "acme"},
		{"/api/2/channel-classifiers", "Basic", basicAuth("key-a", "sec"), basicAuth("key-a", "other"),
			"invalid API key or secret key", "application/json", KeyLabel("key-a")},
		{"/api/2/taxonomy/category", "Basic", basicAuth("key-a", "sec"), basicAuth("key-b", "sec"),
			"invalid API key or secret key", "application/json", KeyLabel("key-a")},
		{"/api/2/taxonomy/category", "Basic", basicAuth("key-c", "any"), basicAuth("key-c", ""),
			"invalid API key or secret key", "application/json", KeyLabel("key-c")},
	}
	for _, c := range cases {
		status, h, body := do("GET", c.path, "Token x", "", "")
		if want := `{"error":"missing or malformed Authorization: ` + c.scheme + ` header"}`; status != 401 ||
			body != want || h.Get("WWW-Authenticate") != c.scheme+` realm="svc"` {
			t.Errorf("%s without auth: %d %s %q", c.path, status, body, h.Get("WWW-Authenticate"))
		}
		if status, _, body = do("GET", c.path, c.bad, "", ""); status != 403 || body != `{"error":"`+c.forbidden+`"}` {
			t.Errorf("%s with %q: %d %s", c.path, c.bad, status, body)
		}
		if status, h, body = do("GET", c.path, c.good, "", ""); status != 200 || h.Get("Content-Type") != c.ct {
			t.Errorf("%s: %d %q %s", c.path, status, h.Get("Content-Type"), body)
		}
	}
	calls := readOut[MgmtCalls](t, s, "/sim/mgmt/calls").Calls
	if len(calls) != 3*len(cases) {
		t.Fatalf("%d calls logged, want %d", len(calls), 3*len(cases))
	}
	for i, c := range cases {
		if got := calls[3*i : 3*i+3]; got[0].Account != "" || got[1].Account != "" || got[2].Account != c.account {
			t.Errorf("%s: accounts %q %q %q, want \"\" \"\" %q", c.path, got[0].Account, got[1].Account, got[2].Account, c.account)
		}
	}
}
