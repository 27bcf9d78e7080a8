package plan

import (
	"encoding/binary"
	"math/bits"
	"strings"

	"github.com/svcrelay/relay/internal/event"
)

// Property keys are mostly short (product_id, signup_cohort): a key of at
// most 16 bytes without escapes is found and looked up from the two
// little-endian words that hold it (keyAt), as the ingest's parser does
// with event fields. This saves the key's second read and the Go map's
// hashing of it. Longer or escaped keys go through the map.

// shortKey is the longest key a keyTable holds.
const shortKey = 16

// keyWords are a short key's bytes, zero-padded: a short key has no NUL
// byte (event.StringStops stops at one), so its words say its length too.
type keyWords struct{ lo, hi uint64 }

// keyAt finds the end of the key string at b[i] == '"' (-1 if it does not
// end) and whether it has an escape; ok is true when the key is short (at
// most shortKey bytes, no escape) and w holds it.
func keyAt(b []byte, i int) (end int, esc bool, w keyWords, ok bool) {
	if i+2+shortKey <= len(b) {
		w, end = shortKeyAt(b, i)
	} else if i+1 < len(b) {
		// Near the end (a record's last key): read from a zero-padded
		// copy (a zero stops the scan at no quote: not short).
		var pad [shortKey + 2]byte
		pad[0] = '"'
		copy(pad[1:], b[i+1:])
		if w, end = shortKeyAt(pad[:], 0); end > 0 {
			end += i
		}
	}
	if end > 0 {
		return end, false, w, true
	}
	end, esc = event.ScanString(b, i)
	return end, esc, keyWords{}, false
}

// shortKeyAt reads the short key at b[i] == '"', where b holds shortKey+2
// bytes from i: its words and the index past it; end is 0 when the key is
// not short (longer, or escaped).
func shortKeyAt(b []byte, i int) (w keyWords, end int) {
	s := b[i+1 : i+2+shortKey]
	lo, hi := binary.LittleEndian.Uint64(s), binary.LittleEndian.Uint64(s[8:])
	n := shortKey
	if z := event.StringStops(lo); z != 0 {
		n = bits.TrailingZeros64(z) >> 3
	} else if z := event.StringStops(hi); z != 0 {
		n = 8 + bits.TrailingZeros64(z)>>3
	}
	if s[n] != '"' {
		return keyWords{}, 0
	}
	m := &event.KeyMasks[n]
	return keyWords{lo & m[0], hi & m[1]}, i + n + 2
}

// wordsOf is the keyWords of a short name.
func wordsOf(name string) keyWords {
	var buf [2 * 8]byte
	copy(buf[:], name)
	return keyWords{binary.LittleEndian.Uint64(buf[:8]), binary.LittleEndian.Uint64(buf[8:])}
}

// The top-level fields the check reads.
var (
	eventTypeWords  = wordsOf("event_type")
	eventPropsWords = wordsOf("event_properties")
	userPropsWords  = wordsOf("user_properties")
)

// keyTable is a perfect hash table of the short names of a map's values
// (rules, or event types' rules).
type keyTable[V any] struct {
	mul   uint64
	shift uint
	slots []keySlot[V]
}

type keySlot[V any] struct {
	w keyWords
	r *V // nil: an empty slot
}

func (t *keyTable[V]) hash(w keyWords) uint {
	return uint(((w.lo*t.mul ^ w.hi) * t.mul) >> t.shift)
}

// lookup is the rule of the short key w, nil when the table has none of
// its name.
func (t *keyTable[V]) lookup(w keyWords) *V {
	if s := &t.slots[t.hash(w)&uint(len(t.slots)-1)]; s.w == w {
		return s.r
	}
	return nil
}

// newKeyTable holds the short names of rules; the zero table (no slots)
// when none fits in a few tries, its keys then looked up in the map.
func newKeyTable[V any](rules map[string]*V) keyTable[V] {
	size := 8
	for size < 4*len(rules) {
		size *= 2
	}
	for ; size <= 64*len(rules)+8; size *= 2 {
		t := keyTable[V]{shift: uint(64 - bits.TrailingZeros(uint(size))), slots: make([]keySlot[V], size)}
		for k := uint64(1); k <= 256; k++ {
			t.mul = k*0x9E3779B97F4A7C15 | 1
			clear(t.slots)
			if t.fill(rules) {
				return t
			}
		}
	}
	return keyTable[V]{}
}

// fill puts the short names in t, false on a collision. A name with a NUL
// byte stays out: its words are a shorter name's, and no short key has it.
func (t *keyTable[V]) fill(rules map[string]*V) bool {
	for name, r := range rules {
		if len(name) > shortKey || strings.IndexByte(name, 0) >= 0 {
			continue
		}
		w := wordsOf(name)
		s := &t.slots[t.hash(w)]
		if s.r != nil {
			return false
		}
		*s = keySlot[V]{w, r}
	}
	return true
}

// rulesFor is the rule of the key at m: from t when the key is short and
// t has it, else from the map (a key no rule has is a violation: rare).
func rulesFor(t *keyTable[rule], rules map[string]*rule, m *members, buf *[]byte) *rule {
	if m.short && len(t.slots) > 0 {
		if r := t.lookup(m.words); r != nil {
			return r
		}
	}
	return rules[string(m.name(buf))]
}
