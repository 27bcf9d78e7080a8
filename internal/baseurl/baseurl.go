// Package baseurl holds an upstream base URL of the configuration (a
// --*-url flag) that a reload may change while requests are routed: its
// readers load it at each use and never keep a copy, so the request routed
// after a Store goes to the new base.
package baseurl

import (
	"strings"
	"sync/atomic"
)

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
