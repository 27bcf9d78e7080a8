package forwardtest

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

// ServeAdmin is Serve (kept for the tests written against it).
func ServeAdmin(t testing.TB, routes []adminroute.Route) string {
	t.Helper()
	return Serve(t, routes)
}

// Forwarder returns a Forwarder (cfg) whose credentials are creds, failing
// the test on error.
func Forwarder(t testing.TB, cfg forward.Config, creds *credentials.Store) *forward.Forwarder {
	t.Helper()
	f, err := forward.New(cfg, credentials.NewRef(creds), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// ParseCreds parses a credentials file, failing the test on error.
func ParseCreds(t testing.TB, yaml string) *credentials.Store {
	t.Helper()
	s, err := credentials.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// StartSim starts a simulator (cfg) on 127.0.0.1, closed at cleanup, and
// returns it with its base URL. Unlike Start it sets no credentials.
func StartSim(t testing.TB, cfg sim.Config) (*simtest.Sim, string) {
	t.Helper()
	s := simtest.New(cfg, nil)
	u, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, u
}

// Answer is an answer of Call, read in full.
type Answer struct {
	Status int
	Body   []byte
	Header http.Header
}

// String for %v in messages.
func (a Answer) String() string { return fmt.Sprintf("%d %s", a.Status, a.Body) }

// Call sends a request with net/http, headers given as "Name: value"
// strings, and reads the answer. It never follows redirects: what the
// server answers is what the test sees.
func Call(t testing.TB, method, url string, body io.Reader, hdr ...string) Answer {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Add(k, v)
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return Answer{resp.StatusCode, b, resp.Header}
}

// WebCredsYAML is a credentials file of one project, "web" (api_key "proj",
// secret_key "proj-secret"), in no organization: the ServeAdmin tests'
// usual credentials.
const WebCredsYAML = `
projects:
  - name: web
    api_key: "proj"
    secret_key: "proj-secret"
`

// WebOrgCredsYAML is WebCredsYAML plus an organization, "acme" (api_key
// "org", secret_key "org-secret"), that holds web: for the APIs that use
// an organization's key.
const WebOrgCredsYAML = WebCredsYAML + `organizations:
  - name: acme
    api_key: "org"
    secret_key: "org-secret"
    projects: [web]
`

// WebCreds parses WebCredsYAML.
func WebCreds(t testing.TB) *credentials.Store {
	t.Helper()
	return ParseCreds(t, WebCredsYAML)
}

// Built is the admin routes of forwarded APIs, built by Build.
type Built []adminroute.Route

// Routes returns the routes.
func (b Built) Routes() []adminroute.Route { return b }

// Build builds the routes of apis on a new Forwarder (cfg) whose
// credentials are creds, failing the test on error.
func Build(t testing.TB, cfg forward.Config, creds *credentials.Store, apis ...forward.API) Built {
	t.Helper()
	rs, err := Forwarder(t, cfg, creds).Routes(apis...)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}
