package forward

import (
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"
)

// FuzzCheckPath: an accepted path has no empty, "." or ".." segment even
// after decoding, and the Mux never panics on any path.
func FuzzCheckPath(f *testing.F) {
	for _, s := range []string{"/", "/a/b", "/a/%2e%2E", "//x", "/a/%zz", "/a%2F..%2Fb", "/%00"} {
		f.Add(s)
	}
	var m Mux
	m.Handle("GET", "/a/{x}/b", func(ctx *fasthttp.RequestCtx, p Params) {})
	f.Fuzz(func(t *testing.T, p string) {
		if CheckPath([]byte(p)) {
			segs := bytes.Split([]byte(p)[1:], []byte{'/'})
			for i, s := range segs {
				d, err := unescape(s)
				if err != nil || d == "." || d == ".." || (len(s) == 0 && i != len(segs)-1) {
					t.Fatalf("accepted %q", p)
				}
			}
		}
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("GET")
		ctx.Request.SetRequestURI(p)
		m.Serve(&ctx)
	})
}

// FuzzBasicUser never panics and returns a user only for a Basic value.
func FuzzBasicUser(f *testing.F) {
	f.Add("Basic dXNlcjpwYXNz")
	f.Add("basic ")
	f.Add("Bearer x")
	f.Fuzz(func(t *testing.T, v string) {
		if u, ok := basicUser([]byte(v)); ok && u == "" {
			t.Fatalf("empty user accepted from %q", v)
		}
	})
}
