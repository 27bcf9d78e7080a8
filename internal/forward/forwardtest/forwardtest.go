// Package forwardtest serves forwarding routes for tests on the real admin
// listener (internal/adminapi) on 127.0.0.1, behind the admin token check
// of each route's Mode. It also starts the simulator as the upstream and
// holds a credentials file whose secrets the simulator accepts.
package forwardtest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/adminapi"
	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

// Test credentials; the simulator of Start accepts exactly these.
const (
	AdminToken    = "admin-token-for-tests"
	Project       = "web-prod"
	ProjectKey    = "pk-web"
	ProjectSecret = "ps-web"
	Org           = "acme"
	OrgKey        = "ok-acme"
	OrgSecret     = "os-acme"
	MgmtKey       = "mgmt-acme"
	SCIMToken     = "scim-acme"
	// NoOrgProject is a project in no organization.
	NoOrgProject = "lonely"
)

// CredentialsYAML is the credentials file of Start.
const CredentialsYAML = `
projects:
  - name: web-prod
    api_key: "pk-web"
    secret_key: "ps-web"
  - name: lonely
    api_key: "pk-lonely"
    secret_key: "ps-lonely"
organizations:
  - name: acme
    api_key: "ok-acme"
    secret_key: "os-acme"
    management_api_key: "mgmt-acme"
    scim_token: "scim-acme"
    projects: [web-prod]
`

// Env is a simulator upstream plus the credentials that reach it.
type Env struct {
	Sim     *simtest.Sim
	SimURL  string
	Creds   *credentials.Store
	Forward *forward.Forwarder
}

// Start starts a simulator on 127.0.0.1 that accepts the test credentials,
// and a Forwarder (cfg).
func Start(t testing.TB, cfg forward.Config) *Env {
	t.Helper()
	s := simtest.New(sim.Config{}, nil)
	u, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	simtest.SetManagementKey(s, MgmtKey)
	simtest.SetSCIMToken(s, SCIMToken, Org)
	simtest.SetProjectSecret(s, ProjectKey, ProjectSecret)
	creds, err := credentials.Parse([]byte(CredentialsYAML))
	if err != nil {
		t.Fatal(err)
	}
	f, err := forward.New(cfg, credentials.NewRef(creds), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &Env{Sim: s, SimURL: u, Creds: creds, Forward: f}
}

// Serve serves routes on the real admin listener (internal/adminapi) on
// 127.0.0.1 behind the admin token AdminToken and returns the base URL
// ("http://127.0.0.1:P"). The listener is shut down at cleanup.
func Serve(t testing.TB, routes []adminroute.Route) string {
	t.Helper()
	tok, err := admintoken.New(AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := adminapi.New(adminapi.Config{Token: tok, MaxRequestBodySize: 64 << 20}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv.Register(routes...)
	return serve(t, srv)
}

// ServeWired registers apis on the real admin listener as cmd/relay does:
// one Forwarder (creds) and one registry reg for both, so that a route or a
// metric registered twice fails the test; behind the admin token
// AdminToken, with /metrics gathering reg. It returns the base URL; the
// listener is shut down at cleanup.
func ServeWired(t testing.TB, reg *prometheus.Registry, creds *credentials.Store, apis ...forward.API) string {
	t.Helper()
	tok, err := admintoken.New(AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := adminapi.New(adminapi.Config{Gatherer: reg, Token: tok}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	fwd, err := forward.New(forward.Config{}, credentials.NewRef(creds), nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	routes, err := fwd.Routes(apis...)
	if err != nil {
		t.Fatal(err)
	}
	srv.Register(routes...)
	return serve(t, srv)
}

// serve serves srv on 127.0.0.1 until the test ends and returns its base URL.
func serve(t testing.TB, srv *adminapi.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String()
}

// Routes returns the admin routes of apis, forwarded by the Env's
// Forwarder (whose credentials are the Env's), failing the test on error.
func (e *Env) Routes(t testing.TB, apis ...forward.API) []adminroute.Route {
	t.Helper()
	rs, err := e.Forward.Routes(apis...)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// Response is an answer read in full.
type Response struct {
	Status int
	Header http.Header
	Body   string
}

// Do sends a request with net/http and reads the answer. headers are
// name, value pairs.
func Do(t testing.TB, method, url, body string, headers ...string) Response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return Response{resp.StatusCode, resp.Header, string(b)}
}

// Injected returns the headers of a call that names the test project (the
// relay injects its credentials) with the admin token in Authorization.
func Injected(extra ...string) []string {
	return append([]string{"Authorization", "Bearer " + AdminToken, admintoken.HeaderProject, Project}, extra...)
}

// PassThrough returns the headers of a call that carries its own upstream
// Authorization, with the admin token in Proxy-Authorization.
func PassThrough(auth string, extra ...string) []string {
	return append([]string{"Authorization", auth, "Proxy-Authorization", "Bearer " + AdminToken}, extra...)
}

// LastCall returns the simulator's last management call, failing when the
// sim saw fewer than n calls in all.
func (e *Env) LastCall(t testing.TB, n int) sim.MgmtCall {
	t.Helper()
	calls := simtest.MgmtCalls(e.Sim)
	if len(calls) != n {
		t.Fatalf("the simulator saw %d management calls, want %d", len(calls), n)
	}
	return calls[n-1]
}

// Calls returns how many management calls the simulator saw.
func (e *Env) Calls() int { return len(simtest.MgmtCalls(e.Sim)) }

// String for %v in messages.
func (r Response) String() string { return fmt.Sprintf("%d %q", r.Status, r.Body) }
