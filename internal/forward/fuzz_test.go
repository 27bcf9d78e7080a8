package forward

import (
	"testing"
)

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
