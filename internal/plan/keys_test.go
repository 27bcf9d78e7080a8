package plan

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/svcrelay/relay/internal/event"
)

// TestKeyTableMatchesMap checks the short-key path (keyAt and keyTable)
// against the slow one (event.ScanString and the Go map) on random keys made of
// the names' own bytes, of every length around shortKey.
func TestKeyTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	// Keys of these, NUL included (escaped, as JSON has it).
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
		c := &compiled{events: map[string]*eventRules{}}
		for n := range rules {
			c.events[n] = &eventRules{}
		}
		c.eventTable = newKeyTable(c.events)
		if len(table.slots) == 0 || len(c.eventTable.slots) == 0 {
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
			// A JSON string: escape what needs it.
			doc := []byte(`{"`)
			for _, c := range key {
				switch {
				case c == '"' || c == '\\':
					doc = append(doc, '\\', c)
				case c == 0:
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
			wantEnd, wantEsc := event.ScanString(doc, 1)
			if m.key.to != wantEnd || m.esc != wantEsc {
				t.Fatalf("%q: end %d esc %v, ScanString %d %v", doc, m.key.to, m.esc, wantEnd, wantEsc)
			}
			var buf []byte
			got := rulesFor(&table, rules, &m, &buf)
			want := rules[string(key)]
			if got != want {
				t.Fatalf("key %q in %v: %v, map %v", key, names, got, want)
			}
			// And a short key the table holds is found there, not only
			// through the map (the fast path is taken).
			if want != nil && len(key) <= shortKey && bytes.IndexByte(key, 0) < 0 && !bytes.ContainsAny(key, `"\`) {
				if !m.short || table.lookup(m.words) != want {
					t.Fatalf("key %q: short %v, not found in the table", key, m.short)
				}
			}
			// The same string as an event type.
			end, _, w, short := keyAt(doc, 1)
			var vd verdict
			gotType, _ := c.typeRules(doc, span{1, end}, short, w, nil, &vd)
			if wantType := c.events[string(key)]; gotType != wantType && (len(key) == 0 || key[0] != '$') {
				t.Fatalf("event type %q in %v: %v, map %v", key, names, gotType, wantType)
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

// TestPassesMatchesCheck checks the first-byte fast path (passes) against
// check on random rules and values: a value it lets through must have no
// violation, and a rule checking only types must let through the values
// of its type.
func TestPassesMatchesCheck(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	types := []string{"", "any", "string", "number", "boolean", "enum", "other"}
	values := []string{`"x"`, `"1"`, `""`, `"a\"b"`, `null`, `{}`, `{"a":[1]}`, `[]`, `["x"]`, `[1,"x"]`, `[null]`, `true`, `false`,
		`1`, `-2.5e3`, `0`, `"free"`, `["free"]`, `"SKU-1"`, `1.0`}
	for range 2000 {
		p := Property{Name: "p", Type: types[rng.IntN(len(types))], Array: rng.IntN(3) == 0}
		if rng.IntN(3) == 0 {
			p.Enum = []string{"free", "1"}
		}
		if rng.IntN(4) == 0 {
			p.Regex = `SKU-[0-9]+`
		}
		r, err := compileProp(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range values {
			var vd verdict
			vs := r.check([]byte(s), span{0, len(s)}, false, nil, &vd)
			if r.passes(s[0]) && len(vs) > 0 {
				t.Fatalf("%+v on %s: passes, check %v", p, s, vs)
			}
		}
		if p.Enum == nil && p.Regex == "" && !p.Array && (p.Type == "string" || p.Type == "") && !r.passes('"') {
			t.Fatalf("%+v: strings not passed", p)
		}
	}
}
