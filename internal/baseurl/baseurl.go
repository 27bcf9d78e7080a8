// Package baseurl is an upstream base URL: the one rule every base is
// checked by (Parse), and a base of the configuration (a --*-url flag) that
// a reload may change while requests are routed (Ref): its readers load it
// at each use and never keep a copy, so the request routed after a Store
// goes to the new base.
package baseurl

import (
	"net/url"
	"strings"
	"sync/atomic"
)

// Parse returns base parsed when it is an upstream base: an absolute
// http:// or https:// URL with a host, and no query, fragment or white
// space, since paths are appended to it. User info is the caller's to
// judge: the relay's --*-url flags may carry it, a credentials file's bases
// and a forwarded request's may not.
func Parse(base string) (*url.URL, bool) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.ContainsAny(base, "?# \t\r\n") {
		return nil, false
	}
	return u, true
}

// Ref is one base URL in force. A nil *Ref, like a zero Ref, holds none
// ("").
type Ref struct{ p atomic.Pointer[string] }

// NewRef returns a Ref holding base.
func NewRef(base string) *Ref {
	r := new(Ref)
	r.Store(base)
	return r
}

// Load returns the base in force, without a trailing slash; "" for none.
func (r *Ref) Load() string {
	if r == nil {
		return ""
	}
	if p := r.p.Load(); p != nil {
		return *p
	}
	return ""
}

// Store puts base in force for every later Load.
func (r *Ref) Store(base string) {
	base = strings.TrimRight(base, "/")
	r.p.Store(&base)
}
