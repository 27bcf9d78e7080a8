package forward_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/adminapi"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
	ft "github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/ratelimit"
)

// recorder is a real upstream on 127.0.0.1 that records the request lines
// it receives.
type recorder struct {
	mu   sync.Mutex
	uris []string
}

func (r *recorder) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.uris...)
}

// startAttackRelay wires every forwarded API to one recording upstream on
// the real admin listener, as cmd/relay does, and returns the listener's
// address and the recorder.
func startAttackRelay(t *testing.T) (string, *recorder) {
	t.Helper()
	rec := &recorder{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.mu.Lock()
		rec.uris = append(rec.uris, r.RequestURI)
		rec.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"upstream":true}`)
	}))
	t.Cleanup(up.Close)
	creds, err := credentials.Parse([]byte(ft.CredentialsYAML))
	if err != nil {
		t.Fatal(err)
	}
	fwd, err := forward.New(forward.Config{}, credentials.NewRef(creds), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := forward.APIConfig{URL: baseurl.NewRef(up.URL)}
	routes, err := fwd.Routes(forward.SCIM(c), forward.Taxonomy(c), forward.DSAR(c), forward.Experiments(forward.APIConfig{URL: baseurl.NewRef(up.URL)}), forward.Deletion(c), forward.Export(forward.APIConfig{URL: baseurl.NewRef(up.URL)}))
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := admintoken.New(ft.AdminToken)
	admin, err := adminapi.New(adminapi.Config{Token: tok}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	admin.Register(routes...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go admin.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		admin.Shutdown(ctx)
	})
	return ln.Addr().String(), rec
}

// raw sends one request line as written (no client normalizes it) with the
// project's injected credentials, and returns the status and body.
func raw(t *testing.T, addr, method, target string) (int, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, method+" "+target+" HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer "+ft.AdminToken+
		"\r\nX-Relay-Project: "+ft.Project+"\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPathAttacksNeverForwarded: encoded traversals that once reached
// the export through a SCIM or deletion route, and the classic
// path-confusion list, are answered 400 by the relay, and the
// upstream sees nothing; a clean path is forwarded on exactly the path
// that was routed.
func TestPathAttacksNeverForwarded(t *testing.T) {
	addr, rec := startAttackRelay(t)
	const q = "?start=20260101T00&end=20260101T01"
	for _, target := range []string{
		// A SCIM or deletion route that reached the export.
		"/scim/1/Users/..%2F..%2F..%2Fapi%2F2%2Fexport" + q,
		"/api/2/deletions/users%2F..%2F..%2F..%2Fapi%2F2%2Fexport" + q,
		"/api/2/deletions/users/1%2F..%2F..%2F..%2F..%2Fapi%2F2%2Fexport" + q,
		// Encoded dots and separators.
		"/scim/1/Users/%2e%2e/%2e%2e/%2e%2e/api/2/export" + q,
		"/scim/1/Users/%2E%2E%2F%2E%2E%2Fapi",
		"/api/2/taxonomy/event/x%2Fy",
		"/api/2/taxonomy/event/..%5C..%5Capi",
		"/api/2/taxonomy/event/a%2eb",
		// Double encoding.
		"/scim/1/Users/..%252F..%252Fapi%252F2%252Fexport",
		"/scim/1/Users/%252e%252e",
		// Raw dot segments, empty segments, backslashes.
		"/scim/1/Users/../../api/2/export" + q,
		"/scim/1/./Users",
		"/scim/1//Users",
		"//scim/1/Users",
		"/scim/1/Users/a\\..\\..\\api",
		"/api/2/export/.." + q,
		// Path parameters.
		"/api/2/export;x=1" + q,
		"/scim/1/Users/..;/..;/api/2/export" + q,
		"/scim/1/Users/a%3B",
		// Overlong UTF-8 and invalid UTF-8.
		"/scim/1/Users/%C0%AE%C0%AE%C0%AFapi",
		"/scim/1/Users/%C0%AF",
		"/scim/1/Users/%E0%80%AF",
		"/scim/1/Users/%FF",
		// NUL and controls.
		"/scim/1/Users/a%00b",
		"/scim/1/Users/a%0D%0AX-Injected:%201",
		// Absolute-form target with a traversal.
		"http://relay/scim/1/Users/..%2F..%2Fapi%2F2%2Fexport" + q,
	} {
		status, body := raw(t, addr, "GET", target)
		if status != http.StatusBadRequest || !strings.Contains(body, `"source":"relay"`) {
			t.Errorf("GET %s: %d %q, want the relay's 400", target, status, body)
		}
	}
	if got := rec.seen(); len(got) != 0 {
		t.Fatalf("the upstream saw %q", got)
	}

	// Clean paths are forwarded on the routed path, escapes as sent.
	for target, want := range map[string]string{
		"/scim/1/Users/alice%40example.com": "/scim/1/Users/alice%40example.com",
		"/scim/1/Users/alice@example.com":   "/scim/1/Users/alice@example.com",
		"/api/2/export" + q:                 "/api/2/export" + q,
	} {
		before := len(rec.seen())
		if status, body := raw(t, addr, "GET", target); status != 200 {
			t.Errorf("GET %s: %d %q", target, status, body)
			continue
		}
		got := rec.seen()
		if len(got) != before+1 || got[before] != want {
			t.Errorf("GET %s: upstream saw %q, want %q", target, got[before:], want)
		}
	}
}

// TestDocumentedLimits: each API with limits gives the documents' figures
// by default (one forward.APIConfig for all, each API's limits its own),
// and a change (here MaxWait and a budget) reaches every one of them.
func TestDocumentedLimits(t *testing.T) {
	for _, c := range []struct {
		api  func(forward.APIConfig) forward.API
		want []ratelimit.Config
	}{
		{forward.SCIM, []ratelimit.Config{{Name: "scim", Limit: 100, Window: time.Minute}}},
		{forward.Taxonomy, []ratelimit.Config{{Name: "taxonomy", Limit: 7200, Window: time.Hour, MaxInFlight: 4}}},
		{forward.DSAR, []ratelimit.Config{{Name: "dsar", Limit: 14400, Window: time.Hour}}},
		{forward.Deletion, []ratelimit.Config{{Name: "deletion_post", Limit: 1, Window: time.Second}, {Name: "deletion", MaxInFlight: 8}}},
	} {
		for _, change := range []ratelimit.Config{{}, {MaxWait: -1, Limit: 9}} {
			a := c.api(forward.APIConfig{URL: baseurl.NewRef("http://up"), Limit: change})
			var got []ratelimit.Config
			for _, l := range a.Limits {
				got = append(got, l.Config)
			}
			want := make([]ratelimit.Config, len(c.want))
			for i, w := range c.want {
				want[i] = forward.APIConfig{Limit: change}.Over(w)
			}
			if a.Fallback.Load() != "http://up" || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s with %+v: base %q, limits %+v, want %+v", a.API, change, a.Fallback.Load(), got, want)
			}
		}
	}
}
