package forwardtest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/valyala/fasthttp"
)

// ServeAdmin serves routes as the admin listener (internal/adminapi) does:
// behind the admin token AdminToken (check and strip by each route's Mode),
// 32 MiB bodies, no default Content-Type. The first route in order whose
// method matches and whose path is equal to the request's (or, for a
// "/"-ended route, a prefix of it) serves; no match is 404. It returns the
// base URL ("http://127.0.0.1:P") and shuts the server down at cleanup.
//
// Unlike Serve it keeps route order and does not reject duplicates.
func ServeAdmin(t testing.TB, routes []adminroute.Route) string {
	t.Helper()
	tok, err := admintoken.New(AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	h := func(ctx *fasthttp.RequestCtx) {
		path := string(ctx.Path())
		for _, r := range routes {
			if r.Method == string(ctx.Method()) && (r.Path == path || strings.HasSuffix(r.Path, "/") && strings.HasPrefix(path, r.Path)) {
				tok.Require(r.Mode, r.Handler)(ctx)
				return
			}
		}
		ctx.Error("no route", fasthttp.StatusNotFound)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: h, MaxRequestBodySize: 32 << 20, NoDefaultContentType: true}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	return "http://" + ln.Addr().String()
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
func StartSim(t testing.TB, cfg sim.Config) (*sim.Sim, string) {
	t.Helper()
	s := sim.New(cfg, nil)
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

// WebCreds parses WebCredsYAML.
func WebCreds(t testing.TB) *credentials.Store {
	t.Helper()
	return ParseCreds(t, WebCredsYAML)
}
