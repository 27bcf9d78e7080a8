package adminapi

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/polltest"
)

// start serves s on a real 127.0.0.1 port and returns its base URL.
func start(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), polltest.Max) // the bound of a failing test only
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

func get(t *testing.T, method, url string, hdr ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	c := &http.Client{Timeout: polltest.Max}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

func TestHealthAndReady(t *testing.T) {
	var notReady atomic.Pointer[error]
	s, err := New(Config{Ready: func() error {
		if p := notReady.Load(); p != nil {
			return *p
		}
		return nil
	}, ReadyInfo: func() string { return "upstream: answering" }}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := start(t, s)

	if code, _, body := get(t, "GET", base+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("healthz: %d %q", code, body)
	}
	if code, _, body := get(t, "GET", base+"/readyz"); code != 200 || body != "ready\nupstream: answering" {
		t.Fatalf("readyz ready: %d %q", code, body)
	}
	reason := errors.New("delivery stopped")
	notReady.Store(&reason)
	// The info follows the reason, each line ended.
	code, _, body := get(t, "GET", base+"/readyz")
	if code != 503 || body != "not ready: delivery stopped\nupstream: answering\n" {
		t.Fatalf("readyz not ready: %d %q, want 503 with the reason and the info", code, body)
	}
	// Health does not depend on readiness.
	if code, _, _ := get(t, "GET", base+"/healthz"); code != 200 {
		t.Fatalf("healthz while not ready: %d", code)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "relay_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	s, err := New(Config{Gatherer: reg, Token: mustToken(t, "tok")}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	base := start(t, s)
	get(t, "GET", base+"/debug/pprof/heap?secret=1") // 401: counted by route, never by path or query
	get(t, "GET", base+"/no/such/path")
	code, hdr, body := get(t, "GET", base+"/metrics") // no token needed
	if code != 200 {
		t.Fatalf("metrics: %d %s", code, body)
	}
	if !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") {
		t.Fatalf("content type %q", hdr.Get("Content-Type"))
	}
	if strings.Contains(body, "secret") || strings.Contains(body, "/no/such") {
		t.Fatal("a request's path or query became a label")
	}
	for _, want := range []string{"relay_test_total 3", "go_goroutines",
		`relay_admin_requests_total{code="401",route="GET /debug/pprof/"} 1`,
		`relay_admin_requests_total{code="404",route="unmatched"} 1`} {
		if !strings.Contains(body, want) {
			t.Fatalf("metrics lack %q", want)
		}
	}
}

func TestPprofAndToken(t *testing.T) {
	tests := []struct {
		name  string
		token string
		hdr   []string
		want  int
	}{
		{"no token configured", "", nil, 200},
		{"token missing", "s3cret", nil, 401},
		{"token wrong", "s3cret", []string{"Authorization", "Bearer s3cre"}, 403},
		{"token wrong scheme", "s3cret", []string{"Authorization", "Basic s3cret"}, 401},
		{"token right", "s3cret", []string{"Authorization", "Bearer s3cret"}, 200},
		{"scheme case-insensitive", "s3cret", []string{"Authorization", "bearer s3cret"}, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tok *admintoken.Token
			if tt.token != "" {
				tok = mustToken(t, tt.token)
			}
			s, err := New(Config{Token: tok}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			base := start(t, s)
			code, _, body := get(t, "GET", base+"/debug/pprof/goroutine?debug=1", tt.hdr...)
			if code != tt.want {
				t.Fatalf("pprof: %d, want %d (%.100s)", code, tt.want, body)
			}
			if code == 200 && !strings.Contains(body, "goroutine profile") {
				t.Fatalf("pprof body %.200q", body)
			}
			if tt.token != "" && strings.Contains(body, tt.token) {
				t.Fatal("token echoed")
			}
			// The open routes never need it.
			for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
				if code, _, _ := get(t, "GET", base+p); code != 200 {
					t.Fatalf("%s: %d without token", p, code)
				}
			}
		})
	}
}

func TestRouter(t *testing.T) {
	s, err := New(Config{Token: mustToken(t, "tok")}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	say := func(w string) http.Handler {
		return http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { io.WriteString(rw, w) })
	}
	own := func(method, path string, h http.Handler) adminroute.Route {
		return adminroute.Route{Method: method, Path: path, Mode: admintoken.ModeOwn, Handler: h}
	}
	s.Register(
		own("GET", "/relay/v1/", say("prefix")),
		own("GET", "/relay/v1/dead/", say("longer prefix")),
		own("GET", "/relay/v1/dead", say("exact")),
		own("DELETE", "/relay/v1/dead", say("deleted")),
		own("GET", "/relay/v1/lanes/{label}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "lane "+r.PathValue("label"))
		})),
		adminroute.Route{Method: "GET", Path: "/api/2/thing", Mode: admintoken.ModeForward, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// What a forwarding handler would pass upstream.
			io.WriteString(w, "auth="+r.Header.Get("Authorization")+" proxy="+r.Header.Get("Proxy-Authorization"))
		})},
		own("PUT", "/usermap", say("own route")),
	)
	base := start(t, s)

	tests := []struct {
		method, path string
		hdr          []string
		code         int
		body         string
	}{
		{"GET", "/relay/v1/dead", []string{"Authorization", "Bearer tok"}, 200, "exact"},
		{"GET", "/relay/v1/dead", nil, 401, ""},
		{"GET", "/api/2/thing", nil, 401, ""},
		{"GET", "/api/2/thing", []string{"Authorization", "Bearer tok"}, 401, ""}, // forward mode: Proxy-Authorization
		{"GET", "/api/2/thing", []string{"Proxy-Authorization", "Bearer nope"}, 403, ""},
		{"GET", "/api/2/thing", []string{"Proxy-Authorization", "Bearer tok", "Authorization", "Basic dXA6c2VjcmV0"}, 200, "auth=Basic dXA6c2VjcmV0 proxy="},
		{"GET", "/api/2/thing", []string{"Authorization", "Bearer tok", "X-Relay-Project", "web"}, 200, "auth= proxy="},
		{"GET", "/api/2/thing", []string{"Proxy-Authorization", "Bearer tok", "Authorization", "Token tok"}, 200, "auth= proxy="},
		{"PUT", "/usermap", nil, 401, ""},
		{"PUT", "/usermap", []string{"Authorization", "Bearer tok"}, 200, "own route"},
		{"GET", "/relay/v1/dead/17", []string{"Authorization", "Bearer tok"}, 200, "longer prefix"},
		{"GET", "/relay/v1/other", []string{"Authorization", "Bearer tok"}, 200, "prefix"},
		{"GET", "/relay/v1/lanes/events-1a", []string{"Authorization", "Bearer tok"}, 200, "lane events-1a"},
		{"HEAD", "/healthz", nil, 200, ""},
		{"DELETE", "/relay/v1/dead", nil, 401, ""},
		{"DELETE", "/relay/v1/dead", []string{"Authorization", "Bearer tok"}, 200, "deleted"},
		{"POST", "/relay/v1/dead", nil, 405, ""},
		{"POST", "/healthz", nil, 405, ""},
		{"GET", "/nope", nil, 404, ""},
		{"GET", "/relay/v2", nil, 404, ""},
	}
	for _, tt := range tests {
		code, hdr, body := get(t, tt.method, base+tt.path, tt.hdr...)
		if code != tt.code || (tt.body != "" && body != tt.body) {
			t.Errorf("%s %s: %d %q, want %d %q", tt.method, tt.path, code, body, tt.code, tt.body)
		}
		if code == 405 && hdr.Get("Allow") == "" {
			t.Errorf("%s %s: 405 without Allow", tt.method, tt.path)
		}
	}

	defer func() {
		if recover() == nil {
			t.Fatal("duplicate route did not panic")
		}
	}()
	s.Handle("GET", "/healthz", say("again"))
}

// TestShutdown: after Shutdown, Serve returns nil and the port is closed.
func TestShutdown(t *testing.T) {
	s, err := New(Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	if code, _, _ := get(t, "GET", "http://"+ln.Addr().String()+"/healthz"); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve after shutdown: %v", err)
		}
	case <-time.After(polltest.Max):
		t.Fatal("serve did not return")
	}
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("port still open after shutdown")
	}
}

func TestValidate(t *testing.T) {
	if _, err := New(Config{WriteTimeout: -1}, nil, nil); err == nil {
		t.Fatal("negative timeout accepted")
	}
}

func mustToken(t *testing.T, v string) *admintoken.Token {
	t.Helper()
	tok, err := admintoken.New(v)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestRedactQuoted(t *testing.T) {
	for in, want := range map[string]string{
		`error when serving connection "127.0.0.1:1"<->"[::1]:2": missing colon: "Broken tok\"en": size=1`: `error when serving connection "127.0.0.1:1"<->"[::1]:2": missing colon: "[redacted]": size=1`,
		`unterminated "secret`: `unterminated "[redacted]`,
		`none`:                 `none`,
	} {
		if got := redactQuoted(in); got != want {
			t.Errorf("redactQuoted(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedactQuery(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                                 "plain",
		`GET http://x/usermap?api_key=K - oops`: `GET http://x/usermap?[redacted] - oops`,
		`"/a?k=1" and "/b?k=2"`:                 `"/a?[redacted]" and "/b?[redacted]"`,
		"end?secret":                            "end?[redacted]",
	} {
		if got := redactQuery(in); got != want {
			t.Errorf("redactQuery(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedactArgs(t *testing.T) {
	got := RedactArgs([]string{"relay", "--admin-token", "T1", "--admin-token=T2", "-admin-token", "T3",
		"--admin-token-file", "/etc/tok", "--listen", "x", "--upstream-gzip"})
	want := []string{"relay", "--admin-token", "[redacted]", "--admin-token=[redacted]", "-admin-token", "[redacted]",
		"--admin-token-file", "/etc/tok", "--listen", "x", "--upstream-gzip"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

// TestShutdownWithSilentConnection: a client that connected and sent
// nothing, and one idle after a request, do not hold Shutdown; a request in
// progress is still finished.
func TestShutdownWithSilentConnection(t *testing.T) {
	// net/http alone holds Shutdown until a connection that sent nothing
	// is 5 s old; Shutdown must end before that. A run that a loaded
	// machine made last that long tells nothing and runs again: one held
	// by the silent connection is late every time.
	for try := 1; try <= 3; try++ {
		if shutdownWithSilentConnection(t) {
			return
		}
		t.Logf("run %d: Shutdown ended after the silent connection was 5 s old; again", try)
	}
	t.Fatal("Shutdown ended after the silent connection was 5 s old, three runs out of three: it waited for it")
}

// shutdownWithSilentConnection is one run of the case; false when Shutdown
// ended too late to tell a right one from one the silent connection held.
func shutdownWithSilentConnection(t *testing.T) bool {
	s, err := New(Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	s.Handle("GET", "/slow", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		io.WriteString(w, "done")
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	base := "http://" + ln.Addr().String()
	if code, _, _ := get(t, "GET", base+"/healthz"); code != 200 { // leaves an idle keep-alive connection
		t.Fatal(code)
	}
	slow := make(chan string, 1)
	go func() {
		resp, err := http.Get(base + "/slow")
		if err != nil {
			slow <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		slow <- string(b)
	}()
	select {
	case <-entered:
	case got := <-slow:
		t.Fatalf("slow request answered %q before its handler ran", got)
	case <-time.After(polltest.Max):
		t.Fatalf("slow request not in its handler after %v", polltest.Max)
	}
	// The silent connection, dialled last so that a slow machine ages it
	// the least. The server accepts it after the dial began: net/http
	// would let Shutdown end 5 s after that at the earliest.
	silentHeld := time.Now().Add(5 * time.Second)
	silent, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	polltest.Until(t, "the silent connection accepted", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.fresh) == 1
	})
	// The request is in progress when Shutdown begins, and ends after.
	go func() {
		for stop := time.Now().Add(polltest.Max); !s.stopping.Load() && time.Now().Before(stop); {
			time.Sleep(time.Millisecond)
		}
		close(release)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	defer cancel()
	t0 := time.Now()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v after %v", err, time.Since(t0))
	}
	ended := time.Now()
	if got := <-slow; got != "done" {
		t.Fatalf("request in progress: %q", got)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return ended.Before(silentHeld)
}
