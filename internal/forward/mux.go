package forward

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/valyala/fasthttp"
)

// Params are the percent-decoded values of a pattern's {name} segments.
type Params map[string]string

// Handler serves one matched route.
type Handler func(ctx *fasthttp.RequestCtx, p Params)

// Mux routes requests by method and path pattern on the RAW request path
// (the path that is forwarded), segment by segment. Patterns are literal
// segments and {name} segments, e.g.
// "/api/1/experiments/{id}/variants/{variantKey}". A {name} segment matches
// one non-empty raw segment (which may hold percent-encoded '/'). Paths that
// CheckPath refuses, and paths no pattern matches, are answered 404
// locally; a path matched with another method is answered 405 with Allow.
// Register with Handle before serving; Serve is safe for concurrent use.
type Mux struct {
	routes []muxRoute
}

type muxRoute struct {
	method string
	segs   []string
	h      Handler
}

// Handle registers h for method and pattern. It panics on a malformed
// pattern or a duplicate (programming errors).
func (m *Mux) Handle(method, pattern string, h Handler) {
	if !strings.HasPrefix(pattern, "/") || h == nil || method == "" {
		panic(fmt.Sprintf("forward: bad route %s %q", method, pattern))
	}
	segs := strings.Split(pattern[1:], "/")
	for _, r := range m.routes {
		if r.method == method && slices.Equal(r.segs, segs) {
			panic(fmt.Sprintf("forward: route %s %s registered twice", method, pattern))
		}
	}
	m.routes = append(m.routes, muxRoute{method: method, segs: segs, h: h})
}

// match reports whether raw segments match the pattern segments, filling p.
func match(pat []string, segs [][]byte, p Params) bool {
	if len(pat) != len(segs) {
		return false
	}
	for i, ps := range pat {
		s := segs[i]
		if strings.HasPrefix(ps, "{") {
			if len(s) == 0 {
				return false
			}
			continue
		}
		if string(s) != ps {
			return false
		}
	}
	for i, ps := range pat {
		if strings.HasPrefix(ps, "{") {
			v, _ := unescape(segs[i]) // CheckPath decoded every segment already
			p[ps[1:len(ps)-1]] = v
		}
	}
	return true
}

// Serve routes ctx (a fasthttp.RequestHandler).
func (m *Mux) Serve(ctx *fasthttp.RequestCtx) {
	raw := ctx.URI().PathOriginal()
	if !CheckPath(raw) {
		WriteError(ctx, fasthttp.StatusNotFound, "not found: path has empty, '.' or '..' segments")
		return
	}
	segs := bytes.Split(raw[1:], []byte{'/'})
	method := string(ctx.Method())
	var allow []string
	for _, r := range m.routes {
		p := Params{}
		if !match(r.segs, segs, p) {
			continue
		}
		if r.method == method {
			r.h(ctx, p)
			return
		}
		if !slices.Contains(allow, r.method) {
			allow = append(allow, r.method)
		}
	}
	if len(allow) > 0 {
		slices.Sort(allow)
		WriteError(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed")
		ctx.Response.Header.Set(fasthttp.HeaderAllow, strings.Join(allow, ", "))
		return
	}
	WriteError(ctx, fasthttp.StatusNotFound, "not found: the relay forwards only the documented routes of this API")
}

// Methods returns the registered methods, sorted.
func (m *Mux) Methods() []string {
	var ms []string
	for _, r := range m.routes {
		if !slices.Contains(ms, r.method) {
			ms = append(ms, r.method)
		}
	}
	slices.Sort(ms)
	return ms
}

// AdminRoutes returns the admin-listener routes that send every request
// under root (root itself and root + "/...") with one of the registered
// methods to m.Serve, in admintoken.ModeForward. root is a path without a
// trailing slash, e.g. "/api/1/experiments".
func (m *Mux) AdminRoutes(root string) []adminroute.Route {
	var out []adminroute.Route
	for _, meth := range m.Methods() {
		out = append(out,
			adminroute.Route{Method: meth, Path: root, Mode: admintoken.ModeForward, Handler: m.Serve},
			adminroute.Route{Method: meth, Path: root + "/", Mode: admintoken.ModeForward, Handler: m.Serve})
	}
	return out
}

var errBadEscape = errors.New("bad percent escape")

// unescape decodes %XX in a path segment ('+' stays '+').
func unescape(s []byte) (string, error) {
	if bytes.IndexByte(s, '%') < 0 {
		return string(s), nil
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			out = append(out, s[i])
			continue
		}
		if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			return "", errBadEscape
		}
		out = append(out, unhex(s[i+1])<<4|unhex(s[i+2]))
		i += 2
	}
	return string(out), nil
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}
