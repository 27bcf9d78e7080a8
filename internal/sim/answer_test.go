package sim

import (
	"go/build"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/sim/wiretest"
)

// Every route returns its answer and the Exchange writes it: the request
// log and the management call log must hold the status the client got,
// also for answers a handler writes itself (a redirect, an archive, a
// text "OK", a 204).
func TestLoggedStatusIsTheAnswered(t *testing.T) {
	clock := newFakeClock()
	s, url := start(t, Config{Now: clock.Now})
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path, auth, body string) int {
		t.Helper()
		req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	basic := "Basic cHJvajpzZWNyZXQ=" // proj:secret
	ev := string(wiretest.Envelope("proj", `{"event_type":"a","user_id":"alice"}`))
	hour := clock.Now().UTC().Format(ExportHourFormat)
	day := clock.Now().UTC().Format(time.DateOnly)
	for _, c := range []struct {
		method, path, auth, body string
		want                     int
	}{
		{"POST", "/2/httpapi", "", ev, 200},
		{"POST", "/2/httpapi", "", "", 400},
		{"GET", "/nowhere", "", "", 400},
		{"POST", "/usermap", "", "api_key=proj&mapping=" + `[{"user_id":"u","global_user_id":"g"}]`, 200},
		{"GET", "/scim/1/Users", "", "", 401},
		{"POST", "/scim/1/Users", "Bearer org", `{"id":"a@x.io","userName":"a@x.io"}`, 201},
		{"DELETE", "/scim/1/Users/a@x.io", "Bearer org", "", 204},
		{"POST", "/api/1/experiments", "Bearer m", `{"name":"e","key":"e"}`, 200},
		{"POST", "/api/1/experiments/1/variants", "Bearer m", `{"key":"v"}`, 200},
		{"GET", "/api/1/experiments/9", "Bearer m", "", 404},
		{"GET", "/api/2/export?start=" + hour + "&end=" + hour, basic, "", 200},
		{"POST", "/api/2/dsar/requests", basic, `{"userId":"alice","startDate":"` + day + `","endDate":"` + day + `"}`, 202},
		{"GET", "/api/2/dsar/requests/1000", basic, "", 200},
		{"GET", "/api/2/dsar/requests/1000", basic, "", 200},
		{"GET", "/api/2/dsar/requests/1000", basic, "", 200},
		{"GET", "/api/2/dsar/requests/1000/outputs/0", basic, "", 302},
	} {
		if got := do(c.method, c.path, c.auth, c.body); got != c.want {
			t.Fatalf("%s %s: answered %d, want %d", c.method, c.path, got, c.want)
		}
		log := s.Requests()
		if rec := log[len(log)-1]; rec.Status != c.want || rec.Path != strings.Split(c.path, "?")[0] {
			t.Errorf("%s %s: logged %s %d, answered %d", c.method, c.path, rec.Path, rec.Status, c.want)
		}
	}
	calls := readOut[MgmtCalls](t, s, "/sim/mgmt/calls").Calls
	var got []int
	for _, c := range calls {
		got = append(got, c.Status)
	}
	if want := []int{401, 201, 204, 200, 200, 404}; !slices.Equal(got, want) {
		t.Errorf("management calls logged %v, want %v", got, want)
	}
}

// The simulator stands for the upstream: it must not depend on any of the
// relay's own packages (the relay's sandbox mode runs it).
func TestImportsNoRelayPackage(t *testing.T) {
	pkg, err := build.Default.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pkg.Imports {
		if strings.HasPrefix(p, "github.com/svcrelay/relay/") {
			t.Errorf("sim imports %s", p)
		}
	}
}
