package export

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
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/valyala/fasthttp"
)

const testToken = "admin-token-123"

// serveRoutes serves routes as the admin listener does (token check and
// strip by Mode, exact paths) on 127.0.0.1 and returns the base URL.
func serveRoutes(t testing.TB, routes []adminroute.Route) string {
	t.Helper()
	tok, err := admintoken.New(testToken)
	if err != nil {
		t.Fatal(err)
	}
	h := routeHandler(tok, routes)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: h, MaxRequestBodySize: 32 << 20, NoDefaultContentType: true}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

func routeHandler(tok *admintoken.Token, routes []adminroute.Route) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		path := string(ctx.Path())
		for _, r := range routes {
			if r.Method == string(ctx.Method()) && (r.Path == path || strings.HasSuffix(r.Path, "/") && strings.HasPrefix(path, r.Path)) {
				tok.Require(r.Mode, r.Handler)(ctx)
				return
			}
		}
		ctx.Error("no route", fasthttp.StatusNotFound)
	}
}

const credsYAML = `
projects:
  - name: web
    api_key: "proj"
    secret_key: "proj-secret"
`

func testCreds(t testing.TB) *credentials.Store {
	t.Helper()
	s, err := credentials.Parse([]byte(credsYAML))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func startSim(t testing.TB, cfg sim.Config) (*sim.Sim, string) {
	t.Helper()
	s := sim.New(cfg, nil)
	u, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, u
}

func newAPI(t testing.TB, upstream string) *API {
	t.Helper()
	fwd, err := forward.New(forward.Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{URL: upstream}, testCreds(t), fwd, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// noRedirect never follows redirects: what the relay answers is what the test sees.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

type answer struct {
	status int
	body   []byte
	hdr    http.Header
}

// call sends a request with headers given as "Name: value" strings.
func call(t testing.TB, method, url string, body io.Reader, hdr ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Add(k, v)
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, b, resp.Header}
}

func (a answer) String() string { return fmt.Sprintf("%d %s", a.status, a.body) }
