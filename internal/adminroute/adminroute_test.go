package adminroute

import (
	"net/http"
	"net/url"
	"path"
	"strings"
	"testing"
)

// TestCheckPath is the classic path-confusion list: every entry that could
// make routing and forwarding disagree is refused.
func TestCheckPath(t *testing.T) {
	for p, ok := range map[string]bool{
		"/": true, "/a": true, "/a/": true, "/a/%20": true, "/scim/1/Users/a%40b.co": true, "/a/b-c_d~e": true,
		"/api/2/taxonomy/event/%C3%A9t%C3%A9": true, // UTF-8 é
		"":                                    false, "a": false, "*": false, "example.com:443": false,
		"//a": false, "/a//b": false, "/./a": false, "/a/.": false, "/a/..": false, "/a/../b": false,
		"/a/%2e": false, "/a/%2E%2e/b": false, "/a/.%2e/b": false, "/a%2eb": false,
		"/a/b%2Fc": false, "/a/b%2fc": false, "/a%5Cb": false, "/a\\b": false, "/a/..%2F..%2Fb": false,
		"/a/%252F": false, "/a/%25": false, "/a/%zz": false, "/a/%4": false, "/a/%": false, "/a/%+4x": false, "/a/%_4": false,
		"/a;b": false, "/a/b;jsessionid=1": false, "/a%3Bb": false,
		"/a%00": false, "/a\x00": false, "/a%0a": false, "/a b": false, "/a\tb": false, "/a#b": false,
		"/a/%C0%AF": false, "/a/%C0%AE%C0%AE/b": false, "/a/%E0%80%AF": false, "/a/%FF": false, "/a/\xc3\xa9": false,
	} {
		if got := CheckPath(p); got != ok {
			t.Errorf("CheckPath(%q) = %v, want %v", p, got, ok)
		}
	}
}

// TestRawPath: the path is the request line's, whatever net/http decoded.
func TestRawPath(t *testing.T) {
	for uri, want := range map[string]string{
		"/a%2Fb?x=1":                  "/a%2Fb",
		"/a/b":                        "/a/b",
		"http://evil.example/a%2e%2e": "/a%2e%2e",
		"http://evil.example":         "",
		"*":                           "",
	} {
		r := &http.Request{RequestURI: uri, URL: &url.URL{Path: "/clean"}}
		if got := RawPath(r); got != want {
			t.Errorf("RawPath(%q) = %q, want %q", uri, got, want)
		}
	}
	if got := RawPath(&http.Request{URL: &url.URL{Path: "/a b"}}); got != "/a%20b" {
		t.Errorf("client request: %q", got)
	}
}

// FuzzCheckPath: a path CheckPath accepts has one meaning. Decoded, it is
// clean (no "//", "." or ".." segments), has as many segments as the raw
// path, is valid UTF-8, and encodes back to a path with the same decoding.
func FuzzCheckPath(f *testing.F) {
	for _, s := range []string{"/", "/a/b", "/a/%2e%2E", "//x", "/a/%zz", "/a%2F..%2Fb", "/%00", "/a%40b/", "/%C0%AF"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if !CheckPath(raw) {
			return
		}
		dec, err := url.PathUnescape(raw)
		if err != nil {
			t.Fatalf("accepted %q: %v", raw, err)
		}
		if strings.Count(dec, "/") != strings.Count(raw, "/") {
			t.Fatalf("accepted %q: decodes to %q, other segments", raw, dec)
		}
		clean := path.Clean(dec)
		if strings.HasSuffix(dec, "/") && clean != "/" {
			clean += "/"
		}
		if clean != dec {
			t.Fatalf("accepted %q: decodes to %q, which cleans to %q", raw, dec, clean)
		}
		u := url.URL{Path: dec, RawPath: raw}
		if back, err := url.PathUnescape(u.EscapedPath()); err != nil || back != dec {
			t.Fatalf("accepted %q: re-encoded %q decodes to %q", raw, u.EscapedPath(), back)
		}
	})
}
