package ingest

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/valyala/fasthttp"
)

// CORS: which browser pages may send to the ingest paths.

var (
	headerOrigin       = []byte(fasthttp.HeaderOrigin)
	headerReqMethod    = []byte(fasthttp.HeaderAccessControlRequestMethod)
	headerVary         = []byte(fasthttp.HeaderVary)
	headerACAO         = []byte(fasthttp.HeaderAccessControlAllowOrigin)
	valueStar          = []byte("*")
	headerAllowMethods = []byte(fasthttp.HeaderAccessControlAllowMethods)
	headerAllowHeaders = []byte(fasthttp.HeaderAccessControlAllowHeaders)
	headerMaxAge       = []byte(fasthttp.HeaderAccessControlMaxAge)
	valueAllowMethods  = []byte("POST")
	// The request headers a preflight may ask for: what the official
	// browser SDK's transports set (fetch and XHR send Content-Type:
	// application/json, Accept and, with request compression,
	// Content-Encoding: gzip). Accept is safelisted; it is named for clarity.
	valueAllowHeaders = []byte("Content-Type, Content-Encoding, Accept")
	// How long a browser may cache a preflight answer, in seconds: two
	// hours, the most Chromium honours.
	valueMaxAge = []byte("7200")
)

// corsPolicy is the parsed Config.CORSOrigins; nil means CORS is off.
// Read-only after newCORS.
type corsPolicy struct {
	any     bool                // "*": every origin
	origins map[string]struct{} // normalized origins
}

// newCORS parses origins (see Config.CORSOrigins); nil or empty gives a nil
// policy.
func newCORS(origins []string) (*corsPolicy, error) {
	if len(origins) == 0 {
		return nil, nil
	}
	c := &corsPolicy{origins: make(map[string]struct{}, len(origins))}
	for _, o := range origins {
		if o == "*" {
			if len(origins) > 1 {
				return nil, errors.New(`ingest: CORS origin "*" must be the only one`)
			}
			c.any = true
			continue
		}
		n, err := NormalizeOrigin(o)
		if err != nil {
			return nil, err
		}
		c.origins[n] = struct{}{}
	}
	return c, nil
}

// NormalizeOrigin returns o in the form a browser sends in its Origin
// header: scheme://host[:port], lower case, without the scheme's default
// port. It refuses anything else (a path, query, user info, "null").
func NormalizeOrigin(o string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(o))
	switch {
	case err != nil:
		return "", fmt.Errorf("ingest: CORS origin %q: %w", o, err)
	case u.Scheme == "" || u.Host == "" || u.Opaque != "":
		return "", fmt.Errorf("ingest: CORS origin %q: want scheme://host[:port], e.g. https://www.example.com", o)
	case u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return "", fmt.Errorf("ingest: CORS origin %q: an origin has no path, query, fragment or user info", o)
	}
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if (scheme == "https" && port == "443") || (scheme == "http" && port == "80") {
		port = ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port != "" {
		host += ":" + port
	}
	return scheme + "://" + host, nil
}

// setHeaders sets the CORS headers of the answer to ctx's request on an
// ingest path: Vary always, the allowed origin when it is allowed.
// Credentials are never allowed. It returns the request's Origin (nil:
// none) and whether it is allowed.
func (c *corsPolicy) setHeaders(ctx *fasthttp.RequestCtx) (origin []byte, allowed bool) {
	origin = ctx.Request.Header.PeekBytes(headerOrigin)
	if allowed = len(origin) > 0 && c.any; len(origin) > 0 && !c.any {
		_, allowed = c.origins[string(origin)]
	}
	h := &ctx.Response.Header
	h.SetCanonical(headerVary, headerOrigin) // Vary: Origin
	switch {
	case allowed && c.any:
		h.SetCanonical(headerACAO, valueStar)
	case allowed:
		h.SetCanonical(headerACAO, origin)
	}
	return origin, allowed
}

// cors applies the policy to a request on an ingest path. It answers
// preflights itself, and refuses (403) a request from a browser page of an
// origin the policy does not allow, since the browser would send a simple
// request (text/plain, navigator.sendBeacon) without asking. It returns
// true when the request is answered.
func (s *Server) cors(ctx *fasthttp.RequestCtx, p pathIdx, pol *corsPolicy) bool {
	origin, allowed := pol.setHeaders(ctx)
	h := &ctx.Response.Header
	switch {
	case ctx.IsOptions() && (len(origin) == 0 || len(ctx.Request.Header.PeekBytes(headerReqMethod)) == 0):
		// Not a preflight.
		h.Set(fasthttp.HeaderAllow, "OPTIONS, POST")
		ctx.SetStatusCode(fasthttp.StatusNoContent)
	case len(origin) > 0 && !allowed && (ctx.IsOptions() || ctx.IsPost()):
		s.rejectf(ctx, p, fasthttp.StatusForbidden, "Origin not allowed", reasonOriginNotAllowed, 0)
	case ctx.IsOptions(): // a preflight of an allowed origin
		h.SetCanonical(headerAllowMethods, valueAllowMethods)
		h.SetCanonical(headerAllowHeaders, valueAllowHeaders)
		h.SetCanonical(headerMaxAge, valueMaxAge)
		ctx.SetStatusCode(fasthttp.StatusNoContent)
	default:
		return false
	}
	return true
}
