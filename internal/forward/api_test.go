package forward

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/ratelimit"
)

// serveAPIs serves the routes of apis (forwarded by f) on a plain ServeMux
// on 127.0.0.1 and returns its base URL.
func serveAPIs(t *testing.T, f *Forwarder, apis ...API) string {
	t.Helper()
	rs, err := f.Routes(apis...)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	for _, r := range rs {
		mux.Handle(r.Pattern(), r.Handler)
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func send(t *testing.T, method, url, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	c := &http.Client{Timeout: polltest.Max, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// TestAPITable: one table's route goes through decode, Check, Resolve,
// Limits, the Accept default and the header allow-list, in that order.
func TestAPITable(t *testing.T) {
	up := startUpstream(t, nil)
	creds := testCreds(t, up.URL)
	f, err := New(Config{}, credentials.NewRef(creds), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var checked atomic.Int32
	base := serveAPIs(t, f, API{
		Upstream: Upstream{API: "t", Kind: credentials.KindAnalytics, Fallback: baseurl.NewRef(up.URL), Scheme: SchemeProjectBasic},
		Accept:   "application/json",
		Headers:  []string{"Accept", "X-Keep"},
		Routes: []adminroute.Route{{Method: "POST", Path: "/t/{name}", Handler: Endpoint{BodyLimit: 64, Check: func(r *http.Request, body []byte) *Problem {
			checked.Add(1)
			if r.PathValue("name") != "ok" {
				return Bad("name %q refused", r.PathValue("name"))
			}
			if string(body) != `{"a":1}` {
				return &Problem{Status: 422, Msg: "body", Extra: map[string]int{"failed": 1}}
			}
			return nil
		}}}},
	})
	// Refused by Check: 400 or the Problem's status, with Extra's fields.
	if resp, body := send(t, "POST", base+"/t/no", `{"a":1}`); resp.StatusCode != 400 || !strings.Contains(body, `"source":"relay"`) {
		t.Fatalf("bad name: %d %s", resp.StatusCode, body)
	}
	resp, body := send(t, "POST", base+"/t/ok", `{"a":2}`)
	var e map[string]any
	if json.Unmarshal([]byte(body), &e); resp.StatusCode != 422 || e["failed"] != float64(1) || e["source"] != "relay" {
		t.Fatalf("Extra: %d %s", resp.StatusCode, body)
	}
	// Over BodyLimit: 413; not decodable: 400.
	if resp, body := send(t, "POST", base+"/t/ok", strings.Repeat("x", 65)); resp.StatusCode != 413 {
		t.Fatalf("large: %d %s", resp.StatusCode, body)
	}
	if resp, body := send(t, "POST", base+"/t/ok", "plain", "Content-Encoding", "br"); resp.StatusCode != 400 {
		t.Fatalf("br: %d %s", resp.StatusCode, body)
	}
	// Unknown project: Resolve's 400, after the checks.
	if resp, body := send(t, "POST", base+"/t/ok", `{"a":1}`, "X-Relay-Project", "nope"); resp.StatusCode != 400 || !strings.Contains(body, "names no project") {
		t.Fatalf("unknown project: %d %s", resp.StatusCode, body)
	}
	if n := up.count(); n != 0 {
		t.Fatalf("refused calls reached the upstream: %d", n)
	}
	// Forwarded: injected credentials, Accept set, only allowed headers.
	if resp, body := send(t, "POST", base+"/t/ok", `{"a":1}`, "X-Relay-Project", "web-prod", "X-Keep", "k", "Cookie", "c=1"); resp.StatusCode != 200 {
		t.Fatalf("forward: %d %s", resp.StatusCode, body)
	}
	s := up.last(t)
	if s.Body != `{"a":1}` || s.Header.Get("Accept") != "application/json" || s.Header.Get("X-Keep") != "k" ||
		s.Header.Get("Cookie") != "" || !strings.HasPrefix(s.Auth, "Basic ") || s.Header.Get("X-Relay-Project") != "" {
		t.Fatalf("upstream saw %+v", s)
	}
}

// TestAPILimits: a client-side limit refuses with 429 and Retry-After; a
// limit whose Cost is 0 for the method does not apply; an upstream 429
// pauses the account for its Retry-After.
func TestAPILimits(t *testing.T) {
	var status atomic.Int32
	status.Store(200)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if s := int(status.Load()); s != 200 {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(s)
		}
	})
	f := newForwarder(t, Config{})
	api := API{
		Upstream: Upstream{API: "lim", Fallback: baseurl.NewRef(up.URL), Scheme: SchemeProjectBasic},
		Limits: []Limit{{
			Config: ratelimit.Config{Name: "lim", Limit: 2, Window: time.Hour, MaxWait: -1},
			Cost: func(m string) int {
				if m == "POST" {
					return 0
				}
				return 1
			},
			Says: "2 per hour",
		}},
		Routes: []adminroute.Route{{Method: "GET", Path: "/l"}, {Method: "POST", Path: "/l"}},
	}
	base := serveAPIs(t, f, api)
	auth := []string{"Authorization", "Basic YTpi"}
	var got []int
	for range 3 {
		resp, body := send(t, "GET", base+"/l", "", auth...)
		got = append(got, resp.StatusCode)
		if resp.StatusCode == 429 && (resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "2 per hour")) {
			t.Fatalf("local 429: %v %s", resp.Header, body)
		}
	}
	if fmt.Sprint(got) != "[200 200 429]" {
		t.Fatalf("GETs: %v", got)
	}
	if resp, _ := send(t, "POST", base+"/l", "", auth...); resp.StatusCode != 200 {
		t.Fatalf("POST (cost 0) limited: %d", resp.StatusCode)
	}
	// Another account: the upstream's 429 is passed back and pauses it.
	other := []string{"Authorization", "Basic Yzpk"}
	status.Store(429)
	if resp, body := send(t, "GET", base+"/l", "", other...); resp.StatusCode != 429 || strings.Contains(body, "relay") {
		t.Fatalf("upstream 429: %d %s", resp.StatusCode, body)
	}
	status.Store(200)
	n := up.count()
	if resp, body := send(t, "GET", base+"/l", "", other...); resp.StatusCode != 429 || !strings.Contains(body, `"source":"relay"`) || up.count() != n {
		t.Fatalf("after the upstream's 429: %d %s", resp.StatusCode, body)
	}
}

// TestAPIConfig: APIConfig.Over changes what is set of a documented limit,
// never its Name; Routes refuses a limit whose bound is below the cost of
// one of the API's routes (every such call would be refused).
func TestAPIConfig(t *testing.T) {
	doc := ratelimit.Config{Name: "doc", Limit: 10, Window: time.Hour, MaxInFlight: 4}
	for _, c := range []struct {
		change, want ratelimit.Config
	}{
		{ratelimit.Config{}, doc},
		{ratelimit.Config{Name: "x", Limit: 3}, ratelimit.Config{Name: "doc", Limit: 3, Window: time.Hour, MaxInFlight: 4}},
		{ratelimit.Config{Window: time.Second, MaxWait: -1, MaxWaiting: 2},
			ratelimit.Config{Name: "doc", Limit: 10, Window: time.Second, MaxInFlight: 4, MaxWait: -1, MaxWaiting: 2}},
		{ratelimit.Config{MaxInFlight: 1}, ratelimit.Config{Name: "doc", Limit: 10, Window: time.Hour, MaxInFlight: 1}},
	} {
		if got := (APIConfig{Limit: c.change}).Over(doc); got != c.want {
			t.Errorf("Over(%+v) = %+v, want %+v", c.change, got, c.want)
		}
	}
	postCosts2 := func(m string) int {
		if m == "POST" {
			return 2
		}
		return 1
	}
	f := newForwarder(t, Config{})
	for _, c := range []struct {
		lim    ratelimit.Config
		cost   func(string) int
		routes []adminroute.Route
		ok     bool
	}{
		{ratelimit.Config{Name: "a", MaxInFlight: 1}, postCosts2, []adminroute.Route{{Method: "GET", Path: "/a"}}, true},
		{ratelimit.Config{Name: "b", MaxInFlight: 1}, postCosts2, []adminroute.Route{{Method: "GET", Path: "/b"}, {Method: "POST", Path: "/b"}}, false},
		{ratelimit.Config{Name: "c", Limit: 1}, postCosts2, []adminroute.Route{{Method: "POST", Path: "/c"}}, false},
		{ratelimit.Config{Name: "d", Limit: 2, MaxInFlight: 2}, postCosts2, []adminroute.Route{{Method: "POST", Path: "/d"}}, true},
		{ratelimit.Config{Name: "e", MaxInFlight: 1}, nil, []adminroute.Route{{Method: "POST", Path: "/e"}}, true},
	} {
		api := API{Upstream: Upstream{API: c.lim.Name}, Limits: []Limit{{Config: c.lim, Cost: c.cost}}, Routes: c.routes}
		if _, err := f.Routes(api); (err == nil) != c.ok {
			t.Errorf("%+v: %v", c.lim, err)
		}
	}
}

// TestFollow: a route with Follow follows the upstream's redirects (up to
// its count); others pass the redirect back.
func TestFollow(t *testing.T) {
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/f", "/p":
			http.Redirect(w, r, "/hop1", http.StatusFound)
		case "/hop1":
			http.Redirect(w, r, "/file", http.StatusTemporaryRedirect)
		case "/file":
			io.WriteString(w, "the file")
		}
	})
	f := newForwarder(t, Config{})
	base := serveAPIs(t, f, API{
		Upstream: Upstream{API: "f", Fallback: baseurl.NewRef(up.URL), Scheme: SchemeProjectBasic},
		Routes:   []adminroute.Route{{Method: "GET", Path: "/f", Handler: Endpoint{Follow: 3}}, {Method: "GET", Path: "/p"}},
	})
	if resp, body := send(t, "GET", base+"/f", "", "Authorization", "Basic YTpi"); resp.StatusCode != 200 || body != "the file" {
		t.Fatalf("followed: %d %q", resp.StatusCode, body)
	}
	if resp, _ := send(t, "GET", base+"/p", ""); resp.StatusCode != 302 || resp.Header.Get("Location") != "/hop1" {
		t.Fatalf("passed back: %d %v", resp.StatusCode, resp.Header)
	}
}

func TestDecodedBody(t *testing.T) {
	const plain = `{"x":"decoded"}`
	var gz, zl bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write([]byte(plain))
	w.Close()
	z := zlib.NewWriter(&zl)
	z.Write([]byte(plain))
	z.Close()
	enc, _ := zstd.NewWriter(nil)
	zs := enc.EncodeAll([]byte(plain), nil)
	for _, c := range []struct {
		encoding string
		body     []byte
		limit    int
		want     string
		err      error
	}{
		{"", []byte(plain), 100, plain, nil},
		{"identity", []byte(plain), 100, plain, nil},
		{"gzip", gz.Bytes(), 100, plain, nil},
		{"deflate", zl.Bytes(), 100, plain, nil},
		{"zstd", zs, 100, plain, nil},
		{"gzip", []byte("not gzip"), 100, "", ErrUndecodable},
		{"br", []byte(plain), 100, "", ErrUndecodable},
		{"", []byte(plain), 5, "", ErrBodyTooLarge},
		{"gzip", gz.Bytes(), 10, "", ErrBodyTooLarge}, // decodes past the limit
	} {
		r := httptest.NewRequest("POST", "/", bytes.NewReader(c.body))
		if c.encoding != "" {
			r.Header.Set("Content-Encoding", c.encoding)
		}
		got, err := DecodedBody(r, c.limit)
		if c.err != nil {
			if err == nil || !strings.Contains(err.Error(), c.err.Error()) {
				t.Errorf("%s: %v, want %v", c.encoding, err, c.err)
			}
			continue
		}
		if err != nil || string(got) != c.want {
			t.Errorf("%s: %q %v", c.encoding, got, err)
			continue
		}
		if sent, _ := io.ReadAll(r.Body); !bytes.Equal(sent, c.body) {
			t.Errorf("%s: the body to forward is not the one sent", c.encoding)
		}
	}
}

func (u *testUpstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.reqs)
}

// TestCredentialsSwap: a credentials file swapped at run time (a reload)
// is in force for the next request.
func TestCredentialsSwap(t *testing.T) {
	up := startUpstream(t, nil)
	ref := credentials.NewRef(testCreds(t, up.URL))
	f, err := New(Config{}, ref, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := serveAPIs(t, f, API{
		Upstream: Upstream{API: "s", Kind: credentials.KindAnalytics, Fallback: baseurl.NewRef(up.URL), Scheme: SchemeProjectBasic},
		Routes:   []adminroute.Route{{Method: "GET", Path: "/s"}},
	})
	if resp, _ := send(t, "GET", base+"/s", "", "X-Relay-Project", "fresh"); resp.StatusCode != 400 {
		t.Fatalf("unknown project before the swap: %d", resp.StatusCode)
	}
	next, err := credentials.Parse([]byte("projects:\n  - name: fresh\n    api_key: \"pk-fresh\"\n    secret_key: \"ps-fresh\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	ref.Swap(next)
	if resp, body := send(t, "GET", base+"/s", "", "X-Relay-Project", "fresh"); resp.StatusCode != 200 {
		t.Fatalf("after the swap: %d %s", resp.StatusCode, body)
	}
	if resp, _ := send(t, "GET", base+"/s", "", "X-Relay-Project", "web-prod"); resp.StatusCode != 400 {
		t.Fatalf("a project of the old file after the swap: %d", resp.StatusCode)
	}
}

// TestRoutesServeEndpoints: a table's route is the admin listener's route
// as registered (same method and path, ModeForward) whose handler forwards;
// a route whose handler is not its Endpoint is refused at start, and an
// Endpoint served on its own answers 500 without forwarding.
func TestRoutesServeEndpoints(t *testing.T) {
	up := startUpstream(t, nil)
	f := newForwarder(t, Config{})
	api := API{
		Upstream: Upstream{API: "r", Fallback: baseurl.NewRef(up.URL), Scheme: SchemeProjectBasic},
		Routes:   []adminroute.Route{{Method: "GET", Path: "/r/{id}"}, {Method: "POST", Path: "/r", Handler: Endpoint{BodyLimit: 8}}},
	}
	rs, err := f.Routes(api)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		if r.Method != api.Routes[i].Method || r.Path != api.Routes[i].Path || r.Mode != admintoken.ModeForward {
			t.Errorf("route %d: %s %s mode %v", i, r.Method, r.Path, r.Mode)
		}
		if _, ok := r.Handler.(Endpoint); ok {
			t.Errorf("route %d: the Endpoint itself is served", i)
		}
	}
	api.Routes = append(api.Routes, adminroute.Route{Method: "GET", Path: "/other", Handler: http.NotFoundHandler()})
	if _, err := f.Routes(api); err == nil {
		t.Error("a route whose handler is not an Endpoint was accepted")
	}
	w := httptest.NewRecorder()
	Endpoint{}.ServeHTTP(w, httptest.NewRequest("GET", "/r/1", nil))
	if w.Code != 500 || up.count() != 0 {
		t.Errorf("unserved Endpoint: %d, upstream saw %d", w.Code, up.count())
	}
}
