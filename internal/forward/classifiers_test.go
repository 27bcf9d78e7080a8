package forward_test

import (
	"compress/gzip"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/forward"
	ft "github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/sim"
)

func classifierStart(t *testing.T) (*ft.Env, string) {
	t.Helper()
	env := ft.Start(t, forward.Config{})
	return env, ft.Serve(t, env.Routes(t, forward.Classifiers(forward.APIConfig{URL: baseurl.NewRef(env.SimURL)})))
}

func classifierBasic(k, s string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(k+":"+s))
}

const classifierDef = `{"displayName":"Paid","description":"d","csvDefinition":{"csvText":"channel,utm_source\nPaid,google|bing","operatorsMap":{},"columnMetadata":{"utm_source":"event_property"},"anyKeyword":"ANY","separator":"|","propertyMetadata":{},"useWaterfallLogic":true}}`

func TestClassifierEveryEndpoint(t *testing.T) {
	env, relay := classifierStart(t)
	steps := []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"POST", "/api/2/channel-classifiers/paid_1", classifierDef, 200, `"created"`},
		{"GET", "/api/2/channel-classifiers", "", 200, `"channelClassifiers":[`},
		{"GET", "/api/2/channel-classifiers/paid_1", "", 200, `"separator":"|"`},
		{"PATCH", "/api/2/channel-classifiers/paid_1", classifierDef, 200, `"updated"`},
		// The Errors table, answered by the upstream and passed back.
		{"GET", "/api/2/channel-classifiers/none", "", 404, ""},
		{"PATCH", "/api/2/channel-classifiers/none", classifierDef, 404, ""},
		{"POST", "/api/2/channel-classifiers/paid_1", classifierDef, 409, ""},
	}
	for i, s := range steps {
		r := ft.Do(t, s.method, relay+s.path, s.body, ft.Injected("Content-Type", "application/json")...)
		c := env.LastCall(t, i+1)
		if r.Status != s.status || !strings.Contains(r.Body, s.want) || c.Status != s.status || c.Method != s.method ||
			c.Path != s.path || c.Auth != "basic" || c.Principal != sim.KeyLabel(ft.ProjectKey) {
			t.Errorf("%s %s: relay %v, sim saw %+v", s.method, s.path, r, c)
		}
		if s.body != "" && c.Body != s.body {
			t.Errorf("%s %s: body changed", s.method, s.path)
		}
	}
	// Pass-through: 401 without Authorization, 403 with a wrong secret, 200 right.
	for auth, want := range map[string]int{"": 401, classifierBasic(ft.ProjectKey, "wrong"): 403, classifierBasic(ft.ProjectKey, ft.ProjectSecret): 200} {
		h := []string{"Proxy-Authorization", "Bearer " + ft.AdminToken}
		if auth != "" {
			h = append(h, "Authorization", auth)
		}
		if r := ft.Do(t, "GET", relay+"/api/2/channel-classifiers", "", h...); r.Status != want {
			t.Errorf("pass-through %q: %v, want %d", auth, r, want)
		}
	}
}

func TestClassifierLocalValidation(t *testing.T) {
	env, relay := classifierStart(t)
	const p = "/api/2/channel-classifiers/"
	big := `{"csvDefinition":{"csvText":"` + strings.Repeat("a", forward.ClassifierMaxCSVBytes+1) + `"}}`
	long := strings.Repeat("é", forward.ClassifierMaxTextChars+1)
	for _, c := range []struct {
		name, method, path, body string
		status                   int
	}{
		{"name with a dot", "POST", p + "bad.name", classifierDef, 400},
		{"name with a space", "POST", p + "bad%20name", classifierDef, 400},
		{"name with a slash", "POST", p + "bad%2Fname", classifierDef, 400},
		{"no csvDefinition", "POST", p + "ok", `{"displayName":"x"}`, 400},
		{"csvDefinition null", "PATCH", p + "ok", `{"csvDefinition":null}`, 400},
		{"no csvText", "POST", p + "ok", `{"csvDefinition":{"separator":null}}`, 400},
		{"csvText not a string", "PATCH", p + "ok", `{"csvDefinition":{"csvText":1}}`, 400},
		{"not JSON", "POST", p + "ok", `csvText=x`, 400},
		{"csvText over 1 MB", "POST", p + "ok", big, 413},
		{"csvText over 1 MB on PATCH", "PATCH", p + "ok", big, 413},
		{"displayName over 1000", "POST", p + "ok", `{"displayName":"` + long + `","csvDefinition":{"csvText":"x"}}`, 400},
		{"description over 1000", "PATCH", p + "ok", `{"description":"` + long + `","csvDefinition":{"csvText":"x"}}`, 400},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := ft.Do(t, c.method, relay+c.path, c.body, ft.Injected()...)
			if r.Status != c.status || !strings.Contains(r.Body, `"source":"relay"`) {
				t.Errorf("got %v", r)
			}
		})
	}
	if r := ft.Do(t, "GET", relay+p+"x/y", "", ft.Injected()...); r.Status != 404 {
		t.Errorf("sub-path: %v", r)
	}
	if n := env.Calls(); n != 0 {
		t.Fatalf("the simulator saw %d calls", n)
	}
	// At the limits exactly: forwarded and accepted.
	edge := `{"displayName":"` + strings.Repeat("é", forward.ClassifierMaxTextChars) + `","csvDefinition":{"csvText":"` + strings.Repeat("a", forward.ClassifierMaxCSVBytes) + `"}}`
	if r := ft.Do(t, "POST", relay+p+"edge-1_A", edge, ft.Injected()...); r.Status != 200 {
		t.Errorf("at the limits: %v", r)
	}
}

// TestClassifierGzipBody: validation looks at the decoded body; the body forwarded is
// the caller's, still compressed.
func TestClassifierGzipBody(t *testing.T) {
	env, relay := classifierStart(t)
	gz := func(s string) string {
		var b strings.Builder
		zw := gzip.NewWriter(&b)
		zw.Write([]byte(s))
		zw.Close()
		return b.String()
	}
	big := `{"csvDefinition":{"csvText":"` + strings.Repeat("a", forward.ClassifierMaxCSVBytes+1) + `"}}`
	if r := ft.Do(t, "POST", relay+"/api/2/channel-classifiers/big", gz(big), ft.Injected("Content-Encoding", "gzip")...); r.Status != 413 {
		t.Errorf("gzip over 1 MB: %v", r)
	}
	if r := ft.Do(t, "POST", relay+"/api/2/channel-classifiers/z", "not gzip", ft.Injected("Content-Encoding", "gzip")...); r.Status != 400 {
		t.Errorf("broken gzip: %v", r)
	}
	if env.Calls() != 0 {
		t.Fatalf("sim saw %d calls", env.Calls())
	}
	body := gz(classifierDef)
	if r := ft.Do(t, "POST", relay+"/api/2/channel-classifiers/z", body, ft.Injected("Content-Encoding", "gzip")...); r.Status != 200 {
		t.Errorf("gzip body: %v", r)
	}
	// The sim decoded what it got: the caller's gzip bytes, with their header.
	if c := env.LastCall(t, 1); c.Body != classifierDef || !strings.Contains(strings.Join(c.Headers, ","), "Content-Encoding") {
		t.Errorf("forwarded body or Content-Encoding changed: %+v", c)
	}
}
