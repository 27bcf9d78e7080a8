package admintoken

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/polltest"
)

func b64basic(userPass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(userPass))
}

const (
	right = "s3cret-Admin-Token~MARK"
	wrong = "s3cret-Admin-Token~MARX" // same length, last byte differs
)

// serve runs a real net/http server on 127.0.0.1 whose routes are wrapped
// by tok.Require and echo the auth headers their handler saw.
func serve(t *testing.T, tok *Token) string {
	t.Helper()
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen := func(name string) string { return strings.Join(r.Header.Values(name), "|") }
		w.Header().Set("X-Seen-Authorization", seen("Authorization"))
		w.Header().Set("X-Seen-Proxy-Authorization", seen("Proxy-Authorization"))
		w.Header().Set("X-Seen-Project", seen(HeaderProject))
		io.WriteString(w, "handled")
	})
	mux := http.NewServeMux()
	mux.Handle("/relay/v1/lanes", tok.Require(ModeOwn, echo))
	mux.Handle("/api/2/export", tok.Require(ModeForward, echo))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

type result struct {
	status                   int
	body                     string
	www, proxyChallenge      string
	seenAuth, seenProxy      string
	seenProject, wholeAnswer string
}

func do(t *testing.T, addr, path string, headers [][2]string) result {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		req.Header.Add(h[0], h[1])
	}
	c := &http.Client{Timeout: polltest.Max}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	whole, err := httputil.DumpResponse(resp, true)
	if err != nil {
		t.Fatal(err)
	}
	body := string(whole[strings.Index(string(whole), "\r\n\r\n")+4:])
	g := resp.Header.Get
	return result{
		status: resp.StatusCode, body: body,
		www: g("WWW-Authenticate"), proxyChallenge: g("Proxy-Authenticate"),
		seenAuth: g("X-Seen-Authorization"), seenProxy: g("X-Seen-Proxy-Authorization"), seenProject: g("X-Seen-Project"),
		wholeAnswer: string(whole),
	}
}

func TestCheckOverHTTP(t *testing.T) {
	tok, err := New(right)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, tok)
	const own, fwd = "/relay/v1/lanes", "/api/2/export"
	const basic = "Basic Y2FsbGVyOm93bg==" // the caller's own upstream credentials
	auth := func(v string) [2]string { return [2]string{"Authorization", v} }
	proxy := func(v string) [2]string { return [2]string{"Proxy-Authorization", v} }
	project := [2]string{HeaderProject, "web-prod"}
	tests := []struct {
		name       string
		path       string
		headers    [][2]string
		status     int
		seenAuth   string // Authorization the handler saw, on 200
		www, proxy bool   // challenges expected on 401
	}{
		// ModeOwn: Authorization (or Proxy-Authorization).
		{"own: none", own, nil, 401, "", true, false},
		{"own: Authorization wrong", own, [][2]string{auth("Bearer " + wrong)}, 403, "", false, false},
		{"own: Authorization right", own, [][2]string{auth("Bearer " + right)}, 200, "", false, false},
		{"own: scheme case and spaces", own, [][2]string{auth("bEaReR   " + right)}, 200, "", false, false},
		{"own: Proxy-Authorization right", own, [][2]string{proxy("Bearer " + right)}, 200, "", false, false},
		{"own: Proxy-Authorization wrong", own, [][2]string{proxy("Bearer " + wrong)}, 403, "", false, false},
		{"own: Basic is no token", own, [][2]string{auth(basic)}, 401, "", true, false},
		{"own: Bearer without token", own, [][2]string{auth("Bearer")}, 401, "", true, false},
		{"own: token as scheme", own, [][2]string{auth(right)}, 401, "", true, false},
		{"own: prefix of token", own, [][2]string{auth("Bearer " + right[:len(right)-1])}, 403, "", false, false},
		{"own: token plus a byte", own, [][2]string{auth("Bearer " + right + "x")}, 403, "", false, false},
		{"own: short wrong token", own, [][2]string{auth("Bearer x")}, 403, "", false, false},
		{"own: right in second value", own, [][2]string{auth("Bearer " + wrong), auth("Bearer " + right)}, 200, "", false, false},
		// ModeForward without X-Relay-Project: Proxy-Authorization only;
		// the caller's Authorization passes through.
		{"fwd: none", fwd, nil, 401, "", false, true},
		{"fwd: Proxy right, own Authorization kept", fwd, [][2]string{proxy("Bearer " + right), auth(basic)}, 200, basic, false, false},
		{"fwd: Proxy right, caller bearer kept", fwd, [][2]string{proxy("Bearer " + right), auth("Bearer upstream-tok")}, 200, "Bearer upstream-tok", false, false},
		{"fwd: Proxy right, no Authorization", fwd, [][2]string{proxy("Bearer " + right)}, 200, "", false, false},
		{"fwd: Proxy wrong", fwd, [][2]string{proxy("Bearer " + wrong), auth(basic)}, 403, "", false, false},
		{"fwd: token in Authorization is not the slot", fwd, [][2]string{auth("Bearer " + right)}, 401, "", false, true},
		{"fwd: wrong in Authorization is not the slot", fwd, [][2]string{auth("Bearer " + wrong)}, 401, "", false, true},
		{"fwd: admin token in Authorization too is stripped", fwd, [][2]string{proxy("Bearer " + right), auth("Bearer " + right)}, 200, "", false, false},
		{"fwd: Basic only", fwd, [][2]string{auth(basic)}, 401, "", false, true},
		// The admin token is stripped from Authorization whatever scheme it
		// rides in: never forwarded upstream.
		{"fwd: token in Token scheme stripped", fwd, [][2]string{proxy("Bearer " + right), auth("Token " + right)}, 200, "", false, false},
		{"fwd: bare token stripped", fwd, [][2]string{proxy("Bearer " + right), auth(right)}, 200, "", false, false},
		{"fwd: Basic user=token stripped", fwd, [][2]string{proxy("Bearer " + right), auth(b64basic(right + ":x"))}, 200, "", false, false},
		{"fwd: Basic password=token stripped", fwd, [][2]string{proxy("Bearer " + right), auth(b64basic("user:" + right))}, 200, "", false, false},
		{"fwd: Basic token alone stripped", fwd, [][2]string{proxy("Bearer " + right), auth(b64basic(right))}, 200, "", false, false},
		{"fwd: unpadded Basic token stripped", fwd, [][2]string{proxy("Bearer " + right), auth("Basic " + base64.RawStdEncoding.EncodeToString([]byte("u:"+right)))}, 200, "", false, false},
		{"fwd: only the carrying value stripped", fwd, [][2]string{proxy("Bearer " + right), auth("Token " + right), auth(basic)}, 200, basic, false, false},
		{"fwd: Basic wrong token kept", fwd, [][2]string{proxy("Bearer " + right), auth(b64basic("user:" + wrong))}, 200, b64basic("user:" + wrong), false, false},
		// ModeForward with X-Relay-Project: Authorization or Proxy-Authorization.
		{"project: none", fwd, [][2]string{project}, 401, "", true, true},
		{"project: Authorization right", fwd, [][2]string{project, auth("Bearer " + right)}, 200, "", false, false},
		{"project: Authorization wrong", fwd, [][2]string{project, auth("Bearer " + wrong)}, 403, "", false, false},
		{"project: Proxy right, Authorization dropped", fwd, [][2]string{project, proxy("Bearer " + right), auth(basic)}, 200, "", false, false},
		{"project: Proxy wrong", fwd, [][2]string{project, proxy("Bearer " + wrong)}, 403, "", false, false},
		{"project: Basic only", fwd, [][2]string{project, auth(basic)}, 401, "", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, addr, tt.path, tt.headers)
			if r.status != tt.status {
				t.Fatalf("status %d, want %d (body %q)", r.status, tt.status, r.body)
			}
			if strings.Contains(r.wholeAnswer, right) {
				t.Errorf("answer contains the admin token: %q", r.wholeAnswer)
			}
			switch tt.status {
			case 200:
				if r.body != "handled" {
					t.Errorf("handler not called: %q", r.body)
				}
				if r.seenProxy != "" {
					t.Errorf("handler saw Proxy-Authorization %q", r.seenProxy)
				}
				if r.seenAuth != tt.seenAuth {
					t.Errorf("handler saw Authorization %q, want %q", r.seenAuth, tt.seenAuth)
				}
				if strings.Contains(r.seenAuth, right) {
					t.Error("the admin token reached the handler")
				}
			case 401:
				if got := r.www != ""; got != tt.www || (got && r.www != Challenge) {
					t.Errorf("WWW-Authenticate %q, want present=%v", r.www, tt.www)
				}
				if got := r.proxyChallenge != ""; got != tt.proxy || (got && r.proxyChallenge != Challenge) {
					t.Errorf("Proxy-Authenticate %q, want present=%v", r.proxyChallenge, tt.proxy)
				}
				if !strings.Contains(r.body, "admin token required") {
					t.Errorf("body %q", r.body)
				}
			case 403:
				if r.www != "" || r.proxyChallenge != "" || r.body != "wrong admin token\n" {
					t.Errorf("403 answer: challenge %q/%q, body %q", r.www, r.proxyChallenge, r.body)
				}
			}
		})
	}
}

func TestNilTokenOverHTTP(t *testing.T) {
	addr := serve(t, nil)
	tests := []struct {
		name, path string
		headers    [][2]string
		seenAuth   string
	}{
		{"own, nothing", "/relay/v1/lanes", nil, ""},
		{"own, Authorization dropped", "/relay/v1/lanes", [][2]string{{"Authorization", "Bearer x"}, {"Proxy-Authorization", "Bearer y"}}, ""},
		{"fwd, own Authorization kept", "/api/2/export", [][2]string{{"Authorization", "Basic abc"}, {"Proxy-Authorization", "Bearer y"}}, "Basic abc"},
		{"fwd, project: Authorization dropped", "/api/2/export", [][2]string{{HeaderProject, "p"}, {"Authorization", "Basic abc"}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, addr, tt.path, tt.headers)
			if r.status != 200 || r.seenProxy != "" || r.seenAuth != tt.seenAuth {
				t.Fatalf("status %d, saw Authorization %q Proxy-Authorization %q; want 200, %q, none",
					r.status, r.seenAuth, r.seenProxy, tt.seenAuth)
			}
		})
	}
}

func TestCheckAndStripDirect(t *testing.T) {
	tok, err := New(right)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer "+right)
	w := httptest.NewRecorder()
	if status, ok := tok.Check(w, r, ModeOwn); !ok || status != 0 {
		t.Fatalf("Check = %d, %v", status, ok)
	}
	if status, ok := (*Token)(nil).Check(w, r, ModeForward); !ok || status != 0 {
		t.Fatalf("nil Check = %d, %v", status, ok)
	}
	tok.Strip(r, ModeForward) // no project, but it carries the token
	if v, ok := r.Header["Authorization"]; ok {
		t.Fatalf("Authorization %q not stripped", v)
	}
	for _, v := range []string{"Token " + right, b64basic(right + ":"), "Basic " + base64.URLEncoding.EncodeToString([]byte(right)), " " + right + " "} {
		r.Header.Set("Proxy-Authorization", "Bearer "+right)
		r.Header.Set("Authorization", v)
		tok.Strip(r, ModeForward)
		if got := r.Header.Get("Authorization") + r.Header.Get("Proxy-Authorization"); got != "" {
			t.Errorf("%q: left %q", v, got)
		}
	}
}

// TestStripEveryHeader: the admin token is removed from every header it
// rides in, whatever the scheme or encoding, on every mode; values that do
// not carry it (the caller's own credentials, a value that merely contains
// the token inside a longer word) are kept.
func TestStripEveryHeader(t *testing.T) {
	tok, err := New(right)
	if err != nil {
		t.Fatal(err)
	}
	carrying := [][2]string{
		{"Authorization", `Digest username="` + right + `", realm="r", nonce="n", uri="/", response="0f"`},
		{"Authorization", `Digest realm="r", username=` + right},
		{"Authorization", "Token token=" + right},
		{"Authorization", "AWS4-HMAC-SHA256 Credential=" + right + "/20261128/x"},
		{"Authorization", b64basic("user:" + right)},
		{"Cookie", "session=" + right + "; theme=dark"},
		{"Cookie", "session=" + strings.ReplaceAll(right, "~", "%7E")},
		{"Cookie", "s=" + base64.RawURLEncoding.EncodeToString([]byte(right))},
		{"X-Forwarded-Authorization", "Bearer " + right},
		{"X-Api-Key", right},
		{"X-Custom", b64basic(right)},
	}
	kept := [][2]string{
		{"Authorization", b64basic("caller:own")},
		{"Cookie", "theme=dark"},
		{"X-Api-Key", "x" + right + "x"}, // a longer word, not the token
		{"X-Keep", "k"},
	}
	for _, mode := range []Mode{ModeOwn, ModeForward} {
		for _, c := range carrying {
			r := httptest.NewRequest("GET", "/", nil)
			for _, h := range kept {
				r.Header.Add(h[0], h[1])
			}
			r.Header.Add(c[0], c[1])
			tok.Strip(r, mode)
			if slices.Contains(r.Header.Values(c[0]), c[1]) {
				t.Errorf("%v, %s: %q left in %s", mode, c[0], c[1], r.Header)
			}
			for _, h := range kept {
				if mode == ModeOwn && h[0] == "Authorization" {
					continue // ModeOwn reads Authorization as the token slot
				}
				if !slices.Contains(r.Header.Values(h[0]), h[1]) {
					t.Errorf("%v, %s: %s %q dropped", mode, c[1], h[0], h[1])
				}
			}
		}
	}
}

func writeFile(t *testing.T, content string, perm fs.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(content), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil { // beat the umask
		t.Fatal(err)
	}
	return path
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name        string
		token, file string
		wantNil     bool
		wantErr     error  // errors.Is target, or nil
		errHas      string // substring of the error
		readable    bool
	}{
		{name: "neither", wantNil: true},
		{name: "flag", token: right},
		{name: "flag with newline", token: right + "\n"},
		{name: "both", token: right, file: writeFile(t, right, 0o600), wantErr: ErrBoth},
		{name: "file with newline", file: writeFile(t, right+"\n", 0o600)},
		{name: "file with CRLF", file: writeFile(t, right+"\r\n", 0o600)},
		{name: "file with spaces", file: writeFile(t, "  "+right+"  \n\n", 0o400)},
		{name: "file readable by others", file: writeFile(t, right+"\n", 0o644), readable: true},
		{name: "file readable by group", file: writeFile(t, right, 0o640), readable: true},
		{name: "empty file", file: writeFile(t, "", 0o600), wantErr: ErrEmpty},
		{name: "newline only", file: writeFile(t, "\n", 0o600), wantErr: ErrEmpty},
		{name: "empty flag after trim", token: " \n", wantErr: ErrEmpty},
		{name: "space inside", file: writeFile(t, "s3cret Admin-Token~MARK\n", 0o600), wantErr: ErrBadChar},
		{name: "control char", token: "s3cret\x01Admin-Token~MARK", wantErr: ErrBadChar},
		{name: "non-ASCII", token: "s3cretÄdmin-Token~MARK", wantErr: ErrBadChar},
		{name: "two lines", file: writeFile(t, right+"\n"+right+"\n", 0o600), wantErr: ErrBadChar},
		{name: "missing file", file: filepath.Join(dir, "nope"), wantErr: fs.ErrNotExist},
		{name: "directory", file: dir, errHas: "not a regular file"},
		{name: "too large", file: writeFile(t, strings.Repeat("a", MaxFileBytes)+right, 0o600), errHas: "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok, err := Load(tt.token, tt.file)
			if tt.wantErr != nil || tt.errHas != "" {
				if err == nil {
					t.Fatal("no error")
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Errorf("error %v, want %v", err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.errHas) {
					t.Errorf("error %q does not contain %q", err, tt.errHas)
				}
				if tok != nil {
					t.Error("token with error")
				}
				for _, s := range []string{"~MARK", "s3cret", "Admin-Token"} {
					if strings.Contains(err.Error(), s) {
						t.Errorf("error %q contains part of the token", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantNil {
				if tok != nil {
					t.Fatal("want nil token")
				}
				return
			}
			if tok.ReadableByOthers() != tt.readable {
				t.Errorf("ReadableByOthers = %v, want %v", tok.ReadableByOthers(), tt.readable)
			}
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("Authorization", "Bearer "+right)
			if _, ok := tok.Check(httptest.NewRecorder(), r, ModeOwn); !ok {
				t.Error("loaded token does not accept the token")
			}
			r.Header.Set("Authorization", "Bearer "+wrong)
			if status, ok := tok.Check(httptest.NewRecorder(), r, ModeOwn); ok || status != 403 {
				t.Errorf("wrong token: %d, %v", status, ok)
			}
		})
	}
	if (*Token)(nil).ReadableByOthers() {
		t.Error("nil token readable")
	}
}

func TestTokenNeverPrinted(t *testing.T) {
	tok, err := New(right)
	if err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%d", "%q"} {
		for _, v := range []any{tok, *tok, struct{ t *Token }{tok}} {
			if out := fmt.Sprintf(verb, v); strings.Contains(out, right) || strings.Contains(out, fmt.Sprintf("%x", right)) {
				t.Errorf("%s printed the token: %s", verb, out)
			}
		}
	}
}

func BenchmarkCheck(b *testing.B) {
	tok, err := New(right)
	if err != nil {
		b.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Proxy-Authorization", "Bearer "+right)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := tok.Check(w, r, ModeForward); !ok {
			b.Fatal("rejected")
		}
	}
}

// FuzzMatch feeds header values to the Bearer parser: it must not panic and
// must accept only "Bearer" (any case), white space and the exact token.
func FuzzMatch(f *testing.F) {
	for _, s := range []string{"Bearer " + right, "bearer\t" + right, "Bearer " + wrong, "Bearer", "Basic abc", right, "Bearer  " + right + " ", ""} {
		f.Add([]byte(s))
	}
	tok, err := New(right)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		tok.carries(string(v)) // never panics
		bearer, ok := tok.match(string(v))
		if ok && !bearer {
			t.Fatal("ok without bearer")
		}
		if ok {
			rest := strings.TrimSpace(string(v[len("bearer"):]))
			if !strings.EqualFold(string(v[:len("bearer")]), "bearer") || rest != right {
				t.Fatalf("accepted %q", v)
			}
		}
	})
}
