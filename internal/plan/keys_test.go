package plan

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestKeyTableMatchesMap checks the short-key path (keyAt and keyTable)
// against the slow one (stringEnd and the Go map) on random keys made of
// the names' own bytes, of every length around shortKey.
func TestKeyTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	// Keys of these, NUL included: a short key is told from a longer one
	// by its length, not by its padding.
	alphabet := []string{"a", "b", "_", "\\", `"`, "\x00", "é"}
	word := func(n int) string {
		s := ""
		for range n {
			s += alphabet[rng.IntN(len(alphabet))]
		}
		return s
	}
	for round := range 200 {
		rules := map[string]*rule{}
		for range 1 + rng.IntN(40) {
			name := word(rng.IntN(shortKey + 4))
			rules[name] = &rule{name: name}
		}
		table := newKeyTable(rules)
		if len(table.slots) == 0 {
			t.Fatalf("round %d: no table for %d names", round, len(rules))
		}
		names := make([]string, 0, len(rules))
		for n := range rules {
			names = append(names, n)
		}
		for range 500 {
			var key []byte
			if rng.IntN(2) == 0 {
				key = []byte(names[rng.IntN(len(names))])
			} else {
				key = []byte(word(rng.IntN(shortKey + 4)))
			}
			if rng.IntN(4) == 0 {
				key = append(key, alphabet[rng.IntN(len(alphabet))]...)
			}
			// A JSON string: escape what needs it (a NUL raw, as the
			// scan allows, unless the key has escapes anyway).
			esc := bytes.ContainsAny(key, `"\\`)
			doc := []byte(`{"`)
			for _, c := range key {
				switch {
				case c == '"' || c == '\\':
					doc = append(doc, '\\', c)
				case c == 0 && esc:
					doc = append(doc, `\u0000`...)
				default:
					doc = append(doc, c)
				}
			}
			doc = append(doc, `":1`...)
			doc = append(doc, []byte(word(rng.IntN(20)))...) // bytes after the key vary
			m := objectAt(doc, 0)
			if !m.nextKey() {
				t.Fatalf("no key in %q", doc)
			}
			wantEnd, wantEsc := stringEnd(doc, 1)
			if m.key.to != wantEnd || m.esc != wantEsc {
				t.Fatalf("%q: end %d esc %v, stringEnd %d %v", doc, m.key.to, m.esc, wantEnd, wantEsc)
			}
			var buf []byte
			got := rulesFor(&table, rules, &m, &buf)
			want := rules[string(key)]
			if got != want {
				t.Fatalf("key %q in %v: %v, map %v", key, names, got, want)
			}
		}
	}
	// Many names still fit (a bigger table, other multipliers).
	rules := map[string]*rule{}
	for i := range 2000 {
		n := fmt.Sprintf("p%d", i)
		rules[n] = &rule{name: n}
	}
	if len(newKeyTable(rules).slots) == 0 {
		t.Fatal("no table for 2000 names")
	}
}
