package plan

import (
	"bytes"
	"regexp/syntax"
	"unicode/utf8"
)

// A plan's patterns are mostly a few literals, ASCII classes and repeats
// (SKU-[0-9]{6}, btn-.*, [a-z]+, a UUID's): matcher checks those by hand,
// in a few nanoseconds, instead of Go's regexp. A pattern it cannot check
// exactly as regexp would (see simple) keeps regexp.

// piece is one item of a simple pattern: a literal, or a run of min to
// max (-1: no bound) runes of one set.
type piece struct {
	set      [2]uint64 // ASCII runes of the set, by bit
	lit      string    // a literal: its bytes in order (set: their union)
	any      bool      // any rune but '\n' (set unused); only as the last piece
	min, max int
}

func (p *piece) has(c byte) bool { return c < 128 && p.set[c>>6]&(1<<(c&63)) != 0 }

// matcher is a simple pattern: a sequence of pieces, each a run whose set
// shares no rune with the sets of the pieces after it. A greedy match is
// then exact: a run can only end where its set ends, so no backtracking
// could find another match.
type matcher []piece

// simple compiles re (matched whole, as Go's regexp with Perl flags
// would) to a matcher, ok false when it is not one.
func simple(re string) (m matcher, ok bool) {
	t, err := syntax.Parse(re, syntax.Perl)
	if err != nil {
		return nil, false
	}
	if !m.add(t) {
		return nil, false
	}
	for i := range m {
		if m[i].any && i != len(m)-1 {
			return nil, false
		}
		if m[i].min == m[i].max {
			continue
		}
		for j := i + 1; j < len(m); j++ {
			if m[i].any || m[i].set[0]&m[j].set[0] != 0 || m[i].set[1]&m[j].set[1] != 0 {
				return nil, false
			}
		}
	}
	return m, true
}

// add appends the pieces of t, false when t is not made of pieces.
func (m *matcher) add(t *syntax.Regexp) bool {
	switch t.Op {
	case syntax.OpEmptyMatch:
		return true
	case syntax.OpConcat:
		for _, s := range t.Sub {
			if !m.add(s) {
				return false
			}
		}
		return true
	case syntax.OpCapture:
		return m.add(t.Sub[0])
	case syntax.OpLiteral:
		// One piece of one rune per byte, matched as one compare.
		p := piece{min: 1, max: 1}
		for _, r := range t.Rune {
			if r >= utf8.RuneSelf || t.Flags&syntax.FoldCase != 0 {
				return false
			}
			p.set[r>>6] |= 1 << (r & 63)
			p.lit += string(r)
		}
		*m = append(*m, p)
		return true
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest, syntax.OpRepeat:
		if t.Flags&syntax.NonGreedy != 0 {
			// Lazy or greedy, a whole match is the same; kept simple.
			return false
		}
		p, ok := one(t.Sub[0])
		if !ok {
			return false
		}
		switch t.Op {
		case syntax.OpStar:
			p.min, p.max = 0, -1
		case syntax.OpPlus:
			p.min, p.max = 1, -1
		case syntax.OpQuest:
			p.min, p.max = 0, 1
		default:
			p.min, p.max = t.Min, t.Max
		}
		*m = append(*m, p)
		return true
	}
	p, ok := one(t)
	if ok {
		*m = append(*m, p)
	}
	return ok
}

// one is the piece of exactly one rune of t's set, ok false when t is not
// such a set or not of ASCII runes (or any rune but '\n').
func one(t *syntax.Regexp) (p piece, ok bool) {
	p.min, p.max = 1, 1
	switch t.Op {
	case syntax.OpAnyCharNotNL:
		p.any = true
		return p, true
	case syntax.OpLiteral:
		if len(t.Rune) != 1 || t.Flags&syntax.FoldCase != 0 || t.Rune[0] >= utf8.RuneSelf {
			return p, false
		}
		r := t.Rune[0]
		p.set[r>>6] |= 1 << (r & 63)
		return p, true
	case syntax.OpCharClass:
		for i := 0; i+1 < len(t.Rune); i += 2 {
			lo, hi := t.Rune[i], t.Rune[i+1]
			if hi >= utf8.RuneSelf {
				return p, false
			}
			for r := lo; r <= hi; r++ {
				p.set[r>>6] |= 1 << (r & 63)
			}
		}
		return p, true
	}
	return p, false
}

// match reports whether s is wholly matched. A byte of a set piece is
// one rune: a byte >= 128 (part of a rune beyond ASCII, or not UTF-8,
// which regexp reads as U+FFFD) is in no set.
func (m matcher) match(s []byte) bool {
	i := 0
	for k := range m {
		p := &m[k]
		if p.lit != "" {
			if len(s)-i < len(p.lit) || string(s[i:i+len(p.lit)]) != p.lit {
				return false
			}
			i += len(p.lit)
			continue
		}
		if p.any { // the last piece
			rest := s[i:]
			if bytes.IndexByte(rest, '\n') >= 0 {
				return false
			}
			if p.min == 0 && p.max < 0 {
				return true
			}
			n := utf8.RuneCount(rest)
			return n >= p.min && (p.max < 0 || n <= p.max)
		}
		n := 0
		for i < len(s) && (p.max < 0 || n < p.max) && p.has(s[i]) {
			i++
			n++
		}
		if n < p.min {
			return false
		}
	}
	return i == len(s)
}
