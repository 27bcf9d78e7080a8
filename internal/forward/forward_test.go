package forward

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/polltest"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// seen is what the test upstream saw of one request.
type seen struct {
	Method, URI, Host, Auth string
	Header                  http.Header
	Body                    string
}

// testUpstream is a real HTTP server on 127.0.0.1 that records requests and
// answers with h.
type testUpstream struct {
	URL  string
	mu   sync.Mutex
	reqs []seen
}

func (u *testUpstream) last(t *testing.T) seen {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.reqs) == 0 {
		t.Fatal("upstream saw no request")
	}
	return u.reqs[len(u.reqs)-1]
}

func startUpstream(t *testing.T, h http.HandlerFunc) *testUpstream {
	t.Helper()
	u := &testUpstream{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.reqs = append(u.reqs, seen{Method: r.Method, URI: r.RequestURI, Host: r.Host,
			Auth: r.Header.Get("Authorization"), Header: r.Header.Clone(), Body: string(b)})
		u.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	u.URL = "http://" + ln.Addr().String()
	return u
}

// startRelay serves h (the forwarding handler) on 127.0.0.1 with a plain
// net/http server (no path check in front: the forwarder's own applies) and
// returns its address.
func startRelay(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

const credsYAML = `
projects:
  - name: web-prod
    api_key: "pk-web"
    secret_key: "ps-web"
  - name: eu-app
    api_key: "pk-eu"
    secret_key: "ps-eu"
    analytics_url: "%s"
  - name: lonely
    api_key: "pk-lonely"
    secret_key: "ps-lonely"
organizations:
  - name: acme
    api_key: "ok-acme"
    secret_key: "os-acme"
    management_api_key: "mgmt-acme"
    scim_token: "scim-acme"
    projects: [web-prod, eu-app]
`

func testCreds(t *testing.T, euURL string) *credentials.Store {
	t.Helper()
	s, err := credentials.Parse(fmt.Appendf(nil, credsYAML, euURL))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newForwarder(t *testing.T, cfg Config) *Forwarder {
	t.Helper()
	f, err := New(cfg, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// relayHandler resolves for u and forwards.
func relayHandler(f *Forwarder, creds *credentials.Store, u Upstream) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, p := Resolve(r, creds, u)
		if p != nil {
			JSONErrors(w, p)
			return
		}
		f.Forward(w, r, res)
	})
}

// rawDo sends a raw HTTP/1.1 request and returns the answer.
func rawDo(t *testing.T, addr, raw string) *http.Response {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(polltest.Max))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func readAll(t *testing.T, r *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestPassThroughUntouched(t *testing.T) {
	up := startUpstream(t, nil)
	f := newForwarder(t, Config{})
	addr := startRelay(t, relayHandler(f, nil, Upstream{API: "x", Kind: credentials.KindAnalytics, Fallback: baseurl.NewRef(up.URL + "/"), Scheme: SchemeProjectBasic}))
	body := "category_name=a%20b&x=%2F"
	resp := rawDo(t, addr, "PUT /api/2/taxonomy/category/a%40b%20c?x=1&y=%20&x=2 HTTP/1.1\r\n"+
		"Host: evil.example\r\nAuthorization: Basic dXNlcjpwYXNz\r\nProxy-Authorization: Bearer admintok\r\n"+
		"Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nUpgrade: h2c\r\n"+
		"X-Custom: v1\r\nContent-Type: application/x-www-form-urlencoded\r\nAccept-Encoding: gzip\r\n"+
		fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body))
	if resp.StatusCode != 200 || readAll(t, resp) != `{"ok":true}` {
		t.Fatalf("status %d", resp.StatusCode)
	}
	s := up.last(t)
	if s.Method != "PUT" || s.URI != "/api/2/taxonomy/category/a%40b%20c?x=1&y=%20&x=2" || s.Body != body {
		t.Errorf("upstream saw %s %s %q", s.Method, s.URI, s.Body)
	}
	if s.Auth != "Basic dXNlcjpwYXNz" {
		t.Errorf("Authorization not passed through: %q", s.Auth)
	}
	if want := strings.TrimPrefix(up.URL, "http://"); s.Host != want {
		t.Errorf("Host %q, want the configured upstream %q", s.Host, want)
	}
	for _, h := range []string{"Proxy-Authorization", "X-Hop", "Keep-Alive", "Te", "Upgrade", "X-Relay-Project", "X-Forwarded-For"} {
		if v := s.Header.Get(h); v != "" && !(h == "Te" && v == "trailers") { // ReverseProxy says it takes trailers
			t.Errorf("hop-by-hop header %s forwarded: %q", h, v)
		}
	}
	for h, v := range map[string]string{"X-Custom": "v1", "Content-Type": "application/x-www-form-urlencoded", "Accept-Encoding": "gzip"} {
		if got := s.Header.Get(h); got != v {
			t.Errorf("%s = %q, want %q", h, got, v)
		}
	}
}

func TestInjectedCredentials(t *testing.T) {
	up := startUpstream(t, nil)
	eu := startUpstream(t, nil)
	creds := testCreds(t, eu.URL)
	f := newForwarder(t, Config{})
	basic := func(u, p string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(u+":"+p)) }
	cases := []struct {
		name    string
		scheme  Scheme
		kind    string
		project string
		want    string
		wantURL *testUpstream
	}{
		{"project basic", SchemeProjectBasic, credentials.KindAnalytics, "web-prod", basic("pk-web", "ps-web"), up},
		{"project basic eu region", SchemeProjectBasic, credentials.KindAnalytics, "eu-app", basic("pk-eu", "ps-eu"), eu},
		{"org basic", SchemeOrgBasic, credentials.KindAnalytics, "web-prod", basic("ok-acme", "os-acme"), up},
		{"management bearer", SchemeManagementBearer, credentials.KindExperiment, "web-prod", "Bearer mgmt-acme", up},
		{"scim bearer", SchemeSCIMBearer, credentials.KindSCIM, "eu-app", "Bearer scim-acme", up},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addr := startRelay(t, relayHandler(f, creds, Upstream{API: "x", Kind: c.kind, Fallback: baseurl.NewRef(up.URL), Scheme: c.scheme}))
			resp := rawDo(t, addr, "GET /p HTTP/1.1\r\nHost: x\r\nX-Relay-Project: "+c.project+"\r\n\r\n")
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, readAll(t, resp))
			}
			s := c.wantURL.last(t)
			if s.Auth != c.want {
				t.Errorf("Authorization %q, want %q", s.Auth, c.want)
			}
			if s.Header.Get("X-Relay-Project") != "" {
				t.Error("X-Relay-Project forwarded")
			}
		})
	}
}

func TestResolveErrors(t *testing.T) {
	creds := testCreds(t, "http://127.0.0.1:1")
	noSCIM, err := credentials.Parse([]byte("projects:\n  - name: p\n    api_key: a\n    secret_key: b\norganizations:\n  - name: o\n    api_key: c\n    secret_key: d\n    projects: [p]\n"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		creds   *credentials.Store
		project string
		u       Upstream
		status  int
		text    string
	}{
		{"unknown project", creds, "nope", Upstream{Fallback: baseurl.NewRef("http://x"), Scheme: SchemeProjectBasic}, 400, "names no project"},
		{"no credentials file", nil, "web-prod", Upstream{Fallback: baseurl.NewRef("http://x"), Scheme: SchemeProjectBasic}, 400, "no --credentials"},
		{"project without org", creds, "lonely", Upstream{API: "scim", Fallback: baseurl.NewRef("http://x"), Scheme: SchemeSCIMBearer}, 400, "in no organization"},
		{"org without scim token", noSCIM, "p", Upstream{Fallback: baseurl.NewRef("http://x"), Scheme: SchemeSCIMBearer}, 400, "no scim_token"},
		{"org without management key", noSCIM, "p", Upstream{Fallback: baseurl.NewRef("http://x"), Scheme: SchemeManagementBearer}, 400, "no management_api_key"},
		{"no base", creds, "web-prod", Upstream{API: "scim", Kind: credentials.KindSCIM, Scheme: SchemeSCIMBearer}, 502, "--scim-url"},
		{"no base pass-through", creds, "", Upstream{API: "scim", Kind: credentials.KindSCIM, Scheme: SchemeSCIMBearer}, 502, "--scim-url"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/x", nil)
			if c.project != "" {
				r.Header.Set("X-Relay-Project", c.project)
			}
			_, e := Resolve(r, c.creds, c.u)
			if e == nil || e.Status != c.status || !strings.Contains(e.Msg, c.text) {
				t.Fatalf("got %+v, want %d %q", e, c.status, c.text)
			}
			for _, secret := range []string{"ps-", "ok-", "os-", "mgmt", "scim-acme"} {
				if strings.Contains(e.Msg, secret) {
					t.Errorf("error holds a secret: %q", e.Msg)
				}
			}
		})
	}
}

func TestResolvePassThroughKnownKeyFindsRegion(t *testing.T) {
	eu := startUpstream(t, nil)
	creds := testCreds(t, eu.URL)
	req := httptest.NewRequest("GET", "/x", nil)
	req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("pk-eu:whatever")))
	r, e := Resolve(req, creds, Upstream{Kind: credentials.KindAnalytics, Fallback: baseurl.NewRef("http://default"), Scheme: SchemeProjectBasic})
	if e != nil || r.Base != eu.URL || r.Key != "project:eu-app" || r.Authorization != "" {
		t.Fatalf("%+v %v", r, e)
	}
	req.Header.Set("Authorization", "Bearer tok")
	r, _ = Resolve(req, creds, Upstream{Kind: credentials.KindSCIM, Fallback: baseurl.NewRef("http://default"), Scheme: SchemeSCIMBearer})
	if r.Base != "http://default" || !strings.HasPrefix(r.Key, "auth:") || strings.Contains(r.Key, "tok") {
		t.Fatalf("%+v", r)
	}
}

func TestNoOpenProxy(t *testing.T) {
	up := startUpstream(t, nil)
	evil := startUpstream(t, nil)
	f := newForwarder(t, Config{})
	addr := startRelay(t, relayHandler(f, nil, Upstream{API: "x", Fallback: baseurl.NewRef(up.URL), Scheme: SchemeProjectBasic}))
	evilHost := strings.TrimPrefix(evil.URL, "http://")
	for _, raw := range []string{
		"GET " + evil.URL + "/api/x?q=1 HTTP/1.1\r\nHost: " + evilHost + "\r\n\r\n",
		"GET /api/x?q=1 HTTP/1.1\r\nHost: " + evilHost + "\r\nX-Forwarded-Host: " + evilHost + "\r\n\r\n",
		"GET //" + evilHost + "/api/x HTTP/1.1\r\nHost: " + evilHost + "\r\n\r\n",
		"GET /api/x@" + evilHost + "/ HTTP/1.1\r\nHost: " + evilHost + "\r\n\r\n",
	} {
		resp := rawDo(t, addr, raw)
		readAll(t, resp)
	}
	evil.mu.Lock()
	n := len(evil.reqs)
	evil.mu.Unlock()
	if n != 0 {
		t.Fatalf("the request reached a host it named: %d requests", n)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	for _, s := range up.reqs {
		if s.Host != strings.TrimPrefix(up.URL, "http://") {
			t.Errorf("upstream saw Host %q", s.Host)
		}
	}
	if len(up.reqs) == 0 || up.reqs[0].URI != "/api/x?q=1" {
		t.Errorf("absolute-form request not forwarded by its path: %+v", up.reqs)
	}
}

func TestAnswerPassedBack(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Retry-After", "17")
		h.Set("Location", "https://storage.example/file")
		h.Set("Content-Disposition", `attachment; filename="a.gz"`)
		h.Set("Content-Encoding", "gzip")
		h.Set("ETag", `"v1"`)
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Connection", "X-Private")
		h.Set("X-Private", "hop")
		w.WriteHeader(429)
		w.Write([]byte{0x1f, 0x8b, 1, 2, 3})
	})
	f := newForwarder(t, Config{})
	addr := startRelay(t, relayHandler(f, nil, Upstream{Fallback: baseurl.NewRef(up.URL), Scheme: SchemeProjectBasic}))
	resp := rawDo(t, addr, "GET /x HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
	body := readAll(t, resp)
	if resp.StatusCode != 429 || body != "\x1f\x8b\x01\x02\x03" {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	for h, v := range map[string]string{"Retry-After": "17", "Location": "https://storage.example/file",
		"Content-Disposition": `attachment; filename="a.gz"`, "Content-Encoding": "gzip", "Etag": `"v1"`,
		"Content-Type": "application/octet-stream"} {
		if got := resp.Header.Get(h); got != v {
			t.Errorf("%s = %q, want %q", h, got, v)
		}
	}
	if resp.Header.Get("X-Private") != "" {
		t.Error("header listed in Connection passed back")
	}
}

func TestLocalErrors(t *testing.T) {
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	slow := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-time.After(10 * time.Minute):
		}
	})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	refused := "http://" + ln.Addr().String()
	ln.Close()
	f := newForwarder(t, Config{MaxRequestBodyBytes: 10, IdleTimeout: 200 * time.Millisecond})
	cases := []struct {
		name, base, raw string
		status          int
		text            string
	}{
		{"body too large", slow.URL, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n01234567890", 413, "forwarding limit"},
		{"refused", refused, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n", 502, "unreachable"},
		{"idle time-out", slow.URL, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n", 502, "time-out"},
		{"bad base", "ftp://x", "GET /x HTTP/1.1\r\nHost: x\r\n\r\n", 502, "absolute http"},
		{"base with user info", "http://u:p@" + strings.TrimPrefix(slow.URL, "http://"), "GET /x HTTP/1.1\r\nHost: x\r\n\r\n", 502, "absolute http"},
		{"dot segment", slow.URL, "GET /a/%2e%2E/x HTTP/1.1\r\nHost: x\r\n\r\n", 400, "segment"},
		{"encoded slash", slow.URL, "GET /a/b%2Fc HTTP/1.1\r\nHost: x\r\n\r\n", 400, "escaped"},
		{"chunked body too large", slow.URL, "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nb\r\n01234567890\r\n0\r\n\r\n", 413, "forwarding limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addr := startRelay(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				f.Forward(w, r, Target{API: "x", Base: c.base, Authorization: "Basic c2VjcmV0OnNlY3JldA=="})
			}))
			start := time.Now()
			resp := rawDo(t, addr, c.raw)
			body := readAll(t, resp)
			if resp.StatusCode != c.status || !strings.Contains(body, c.text) || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("got %d %q", resp.StatusCode, body)
			}
			var e struct{ Error, Source string }
			if json.Unmarshal([]byte(body), &e) != nil || e.Source != "relay" {
				t.Errorf("body not the relay's JSON error: %q", body)
			}
			if strings.Contains(body, "c2VjcmV0") || strings.Contains(body, "secret") {
				t.Errorf("error echoes the Authorization: %q", body)
			}
			// 200 ms for the idle time-out on a quiet machine; a forwarder
			// without one waits for the slow upstream's 10 minutes.
			if time.Since(start) > polltest.Max {
				t.Errorf("took %v", time.Since(start))
			}
		})
	}
}

// TestStreamingBoundedMemory sends a 256 MiB answer through the forwarder
// and checks the heap never grows by more than a few MiB while it flows.
func TestStreamingBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 256 MiB")
	}
	const total = 256 << 20
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/gzip")
		if r.URL.Query().Get("len") == "1" {
			w.Header().Set("Content-Length", fmt.Sprint(total))
		}
		for n := 0; n < total; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	f := newForwarder(t, Config{})
	addr := startRelay(t, relayHandler(f, nil, Upstream{Fallback: baseurl.NewRef(up.URL), Scheme: SchemeProjectBasic}))
	for _, q := range []string{"len=1", "len=0"} {
		t.Run(q, func(t *testing.T) {
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			base := ms.HeapInuse
			var peak atomic.Uint64
			done := make(chan struct{})
			go func() {
				var ms runtime.MemStats
				for {
					select {
					case <-done:
						return
					case <-time.After(20 * time.Millisecond):
					}
					runtime.ReadMemStats(&ms)
					if ms.HeapInuse > peak.Load() {
						peak.Store(ms.HeapInuse)
					}
				}
			}()
			resp := rawDo(t, addr, "GET /export?"+q+" HTTP/1.1\r\nHost: x\r\n\r\n")
			n, err := io.Copy(io.Discard, resp.Body)
			close(done)
			if err != nil || n != total || resp.StatusCode != 200 {
				t.Fatalf("read %d of %d: %v (status %d)", n, total, err, resp.StatusCode)
			}
			grow := int64(peak.Load()) - int64(base)
			t.Logf("heap in use grew by at most %d KiB while moving %d MiB", grow>>10, total>>20)
			if grow > 32<<20 {
				t.Fatalf("heap grew by %d MiB: the answer is buffered, not streamed", grow>>20)
			}
		})
	}
}

// TestUpstreamErrorsLogSampled: a caller that keeps calling while the
// upstream is down is answered 502 each time, counted each time, and
// logged a few times, not once per call.
func TestUpstreamErrorsLogSampled(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	f, err := New(Config{}, nil, zap.New(core), nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close() // connections are refused
	addr := startRelay(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.Forward(w, r, Target{API: "x", Base: down})
	}))
	for range 30 {
		resp, err := http.Get("http://" + addr + "/api/2/x")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("status %d, want 502", resp.StatusCode)
		}
	}
	if n := logs.Len(); n == 0 || n > 5 {
		t.Errorf("%d log lines for 30 failed calls, want 1 to 5", n)
	}
}

// Forward is forward through the Forwarder's own proxy.
func (f *Forwarder) Forward(w http.ResponseWriter, r *http.Request, t Target) int {
	return f.forward(w, r, t, f.proxy)
}

// TestNewRefusesNegativeConfig: a negative bound is a configuration error,
// not a default.
func TestNewRefusesNegativeConfig(t *testing.T) {
	for _, c := range []Config{{MaxRequestBodyBytes: -1}, {IdleTimeout: -1}} {
		if _, err := New(c, nil, nil, nil); err == nil {
			t.Errorf("New(%+v) took a negative bound", c)
		}
	}
}
