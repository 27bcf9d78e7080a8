package forward_test

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/forward"
	ft "github.com/svcrelay/relay/internal/forward/forwardtest"
)

// TestAdminTokenNeverForwarded sends the admin token to a forwarded route
// in every header and scheme a client might use (besides the
// Proxy-Authorization that admits it) through the real admin listener, and
// requires that no header the upstream receives carries it, while the
// caller's own headers pass.
func TestAdminTokenNeverForwarded(t *testing.T) {
	var mu sync.Mutex
	var got http.Header
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = r.Header.Clone()
		mu.Unlock()
	}))
	t.Cleanup(up.Close)
	f := ft.Forwarder(t, forward.Config{}, nil)
	base := ft.Serve(t, []adminroute.Route{{Method: http.MethodGet, Path: "/api/2/x", Mode: admintoken.ModeForward,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f.Forward(w, r, forward.Target{API: "x", Base: up.URL})
		})}})

	tok := ft.AdminToken
	b64 := base64.StdEncoding.EncodeToString
	for _, h := range [][2]string{
		{"Authorization", `Digest username="` + tok + `", realm="relay", nonce="abc", uri="/api/2/x", response="6629fae4"`},
		{"Authorization", "Basic " + b64([]byte("user:"+tok))},
		{"Authorization", "Token " + tok},
		{"Cookie", "relay_admin=" + tok},
		{"X-Forwarded-Authorization", "Bearer " + tok},
		{"X-Auth-Token", tok},
		{"X-Original-Authorization", "Basic " + b64([]byte(tok+":"))},
	} {
		resp := ft.Do(t, "GET", base+"/api/2/x", "", "Proxy-Authorization", "Bearer "+tok, h[0], h[1], "X-Keep", "k")
		if resp.Status != 200 {
			t.Fatalf("%s: %v", h[0], resp)
		}
		mu.Lock()
		seen := got
		mu.Unlock()
		for name, vals := range seen {
			for _, v := range vals {
				if strings.Contains(v, tok) || strings.Contains(v, b64([]byte(tok))[:16]) {
					t.Errorf("sent %s: upstream saw %s: %q", h[0], name, v)
				}
			}
		}
		if seen.Get("X-Keep") != "k" {
			t.Errorf("sent %s: X-Keep dropped: %v", h[0], seen)
		}
	}
	// The caller's own credentials pass.
	own := "Digest username=\"alice\", realm=\"relay\", response=\"00\""
	ft.Do(t, "GET", base+"/api/2/x", "", "Proxy-Authorization", "Bearer "+tok, "Authorization", own, "Cookie", "a=b")
	mu.Lock()
	defer mu.Unlock()
	if got.Get("Authorization") != own || got.Get("Cookie") != "a=b" {
		t.Errorf("caller's own headers: upstream saw %v", got)
	}
}
