package adminapi

import (
	"net/http"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/polltest"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestServerLogRedacted: net/http's own log lines (here a handler's panic,
// whose value quotes a header and a query) reach the log redacted.
func TestServerLogRedacted(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	s, err := New(Config{}, zap.New(core), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Handle("GET", "/boom", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic(`bad header "Authorization: Bearer s3cret-tok" on /usermap?api_key=KEY123`)
	}))
	base := start(t, s)
	c := &http.Client{Timeout: polltest.Max}
	if resp, err := c.Get(base + "/boom"); err == nil {
		resp.Body.Close()
	}
	polltest.Until(t, "net/http's panic line in the log", func() bool { return logs.FilterMessage("admin listener").Len() > 0 })
	entries := logs.FilterMessage("admin listener").All()
	for _, e := range entries {
		d := e.ContextMap()["detail"].(string)
		if strings.Contains(d, "s3cret") || strings.Contains(d, "KEY123") {
			t.Fatalf("log line holds request content: %q", d)
		}
		if !strings.Contains(d, "[redacted]") {
			t.Fatalf("log line not redacted: %q", d)
		}
	}
}

// TestSetToken: a token swapped at run time is in force for the next
// request; nil opens the routes.
func TestSetToken(t *testing.T) {
	s, err := New(Config{Token: mustToken(t, "old")}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Register(adminroute.Route{Method: "GET", Path: "/own", Mode: admintoken.ModeOwn, Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})})
	base := start(t, s)
	if code, _, _ := get(t, "GET", base+"/own", "Authorization", "Bearer old"); code != 200 {
		t.Fatalf("old token: %d", code)
	}
	s.SetToken(mustToken(t, "new"))
	if code, _, _ := get(t, "GET", base+"/own", "Authorization", "Bearer old"); code != 403 {
		t.Fatalf("old token after the swap: %d", code)
	}
	if code, _, _ := get(t, "GET", base+"/own", "Authorization", "Bearer new"); code != 200 {
		t.Fatalf("new token: %d", code)
	}
	s.SetToken(nil)
	if code, _, _ := get(t, "GET", base+"/own"); code != 200 {
		t.Fatalf("no token: %d", code)
	}
}

// TestPathRefusedBeforeToken: a refused path is 400 with the relay's JSON,
// counted as "refused", whatever the token.
func TestPathRefusedBeforeToken(t *testing.T) {
	s, err := New(Config{Token: mustToken(t, "tok")}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	called := false
	s.Register(adminroute.Route{Method: "GET", Path: "/relay/v1/lanes/{label}", Mode: admintoken.ModeOwn,
		Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true })})
	base := start(t, s)
	for _, p := range []string{"/relay/v1/lanes/a%2Fb", "/relay/v1/lanes/%2e%2e", "/relay/v1/lanes/a;b"} {
		code, hdr, body := get(t, "GET", base+p, "Authorization", "Bearer tok")
		if code != 400 || hdr.Get("Content-Type") != "application/json" || !strings.Contains(body, `"source":"relay"`) {
			t.Errorf("GET %s: %d %q", p, code, body)
		}
	}
	if called {
		t.Fatal("a refused path reached its handler")
	}
}
