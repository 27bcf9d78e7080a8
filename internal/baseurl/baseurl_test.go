package baseurl

import "testing"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		base     string
		ok, user bool
	}{
		{"http://upstream.test", true, false},
		{"https://upstream.test:8443/api/", true, false},
		{"https://user:pw@proxy.test", true, true}, // the caller judges user info
		{"", false, false},
		{"ftp://upstream.test", false, false},
		{"upstream.test", false, false},
		{"http://", false, false},
		{"https://upstream.test/?token=q", false, false},
		{"https://upstream.test/?", false, false},
		{"https://upstream.test/#top", false, false},
		{"https://upstream.test/#", false, false},
		{"https://upstream.test/a b", false, false},
	} {
		u, ok := Parse(tc.base)
		if ok != tc.ok || (ok && (u.User != nil) != tc.user) {
			t.Errorf("Parse(%q) = %v, %v; want ok %v, user info %v", tc.base, u, ok, tc.ok, tc.user)
		}
	}
}

func TestRef(t *testing.T) {
	var nilRef *Ref
	if got := nilRef.Load(); got != "" {
		t.Errorf("nil Ref: %q", got)
	}
	r := NewRef("http://a.test//")
	if got := r.Load(); got != "http://a.test" {
		t.Errorf("Load = %q, want no trailing slash", got)
	}
	r.Store("http://b.test")
	if got := r.Load(); got != "http://b.test" {
		t.Errorf("after Store: %q", got)
	}
}
