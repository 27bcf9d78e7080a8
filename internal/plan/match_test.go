package plan

import (
	"math/rand/v2"
	"regexp"
	"testing"
)

// TestSimpleMatchesRegexp checks the hand matcher against Go's regexp on
// random strings built from the patterns' own bytes, and that the patterns
// it must not take are left to regexp.
func TestSimpleMatchesRegexp(t *testing.T) {
	patterns := []string{`SKU-[0-9]{6}`, `/.*`, `btn-.*`, `2026-W[0-9]{2}`, `[a-z]+`, `[a-z]*`, `a?b`, `x[0-9]{2,4}y`,
		`[0-9a-f]{8}-[0-9a-f]{4}`, `v[0-9]+\.x`, `a|b`, `\d+`, `.`, `a.+`, `a.{2,3}`, `(ab)[c-e]?`, `[a-c]{0,2}[x-z]`}
	for _, p := range patterns {
		if _, ok := simple(p); !ok {
			t.Errorf("%q: not simple", p)
		}
	}
	// Overlapping runs need backtracking, the rest is not pieces or not
	// ASCII: regexp keeps them.
	for _, p := range []string{`[a-z]*[a-z]`, `a?a`, `[a-z]+[0-9]?[a-z]`, `.*x`, `v[0-9]+\.[0-9]+`, `(?i)abc`, `a|bc`, `(ab)+`, `é+`, `[^a]`, `a*?`, `(?s).*`, `^a`} {
		if _, ok := simple(p); ok {
			t.Errorf("%q: taken as simple", p)
		}
	}
	alphabet := []byte("SKU-0123456789/btnaxyzW2026cdefv.é\n\xff")
	rng := rand.New(rand.NewPCG(1, 2))
	for _, p := range patterns {
		m, _ := simple(p)
		re := regexp.MustCompile(`^(?:` + p + `)$`)
		for range 20000 {
			s := make([]byte, rng.IntN(12))
			for i := range s {
				s[i] = alphabet[rng.IntN(len(alphabet))]
			}
			if got, want := m.match(s), re.Match(s); got != want {
				t.Fatalf("%q on %q: %v, regexp %v", p, s, got, want)
			}
		}
		// And the strings the pattern generates (random bytes rarely match).
		for _, s := range []string{"SKU-123456", "/x", "btn-", "2026-W07", "abc", "", "b", "ab", "x12y", "x1234y", "0123abcd-ef01", "v1.2", "é", "a\xff\xff", "abe", "cx", "y"} {
			if got, want := m.match([]byte(s)), re.MatchString(s); got != want {
				t.Fatalf("%q on %q: %v, regexp %v", p, s, got, want)
			}
		}
	}
}
