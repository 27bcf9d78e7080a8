package sim

import (
	"encoding/base64"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestResetClearsRouteGroups: Reset forgets the state the route groups keep
// outside the store and keeps their configuration.
func TestResetClearsRouteGroups(t *testing.T) {
	s := New(Config{}, nil)
	defer s.Close()
	s.Knobs(func(k *Knobs) { k.ManagementKeys["mk"], k.RejectedGroupValues["v"], k.UserMapLimit = true, true, 7 })
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("k:secret"))
	do := func(method, path, auth, body string) string {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", auth)
		if strings.HasPrefix(path, "/api/2/taxonomy") {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, req)
		if w.Code >= 300 {
			t.Fatalf("%s %s: %d %s", method, path, w.Code, w.Body)
		}
		return w.Body.String()
	}
	// The state of every group, one entry each.
	do("POST", "/groupidentify?api_key=k&identification="+`[{"group_type":"t","group_value":"x"}]`, "", "")
	do("POST", `/usermap?api_key=k&mapping=[{"user_id":"u","global_user_id":"g"}]`, "", "")
	do("POST", "/api/1/experiments", "Bearer mk", `{"name":"e","key":"e"}`)
	do("POST", "/scim/1/Users", "Bearer org", `{"id":"a@x.io","userName":"a@x.io"}`)
	do("POST", "/api/2/channel-classifiers/c", basic, `{"csvDefinition":{"csvText":"a"}}`)
	do("POST", "/api/2/taxonomy/category", basic, "category_name=c")

	s.Reset()
	if got := readOut[[]GroupIdentify](t, s, "/sim/groupidentify?api_key=k"); len(got) != 0 || len(s.knobs.RejectedGroupValues) != 0 {
		t.Errorf("groupidentify kept %v %v", got, s.knobs.RejectedGroupValues)
	}
	do("POST", "/groupidentify?api_key=k&identification="+`[{"group_type":"t","group_value":"y"}]`, "", "")
	if got := readOut[[]GroupIdentify](t, s, "/sim/groupidentify?api_key=k"); len(got) != 1 || got[0].Seq != 1 {
		t.Errorf("groupidentify after Reset: %+v, want one numbered 1", got)
	}
	if um := readOut[UserMapState](t, s, "/sim/usermap"); len(um.Mapped) != 0 || len(um.Calls) != 0 || s.knobs.UserMapLimit != 7 {
		t.Errorf("usermap after Reset: mapped %v, calls %d, limit %d (want empty, 0, kept 7)", um.Mapped, len(um.Calls), s.knobs.UserMapLimit)
	}
	if calls := readOut[MgmtCalls](t, s, "/sim/mgmt/calls").Calls; len(calls) != 0 {
		t.Errorf("management call log kept %d calls", len(calls))
	}
	for path, entry := range map[string]string{"/api/1/experiments": `"key":"e"`, "/scim/1/Users": "a@x.io",
		"/api/2/channel-classifiers": `"name":"c"`, "/api/2/taxonomy/category": `"name":"c"`} {
		auth := basic
		switch path {
		case "/api/1/experiments":
			auth = "Bearer mk" // accepted after Reset: configuration is kept
		case "/scim/1/Users":
			auth = "Bearer org"
		}
		if got := do("GET", path, auth, ""); strings.Contains(got, entry) {
			t.Errorf("GET %s after Reset: %s still holds %s", path, got, entry)
		}
	}
}
