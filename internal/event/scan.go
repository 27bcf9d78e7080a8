package event

import (
	"encoding/binary"
	"math/bits"
	"unicode/utf8"
)

// This file is the strict JSON scanner: RFC 8259 as encoding/json.Valid
// implements it. In particular, like json.Valid, it does not check that string
// bytes are valid UTF-8 and does not check that \u surrogates are paired; it
// rejects control bytes below 0x20 in strings, leading zeros, and nesting
// deeper than maxDepth. Scanning functions take the index of the first byte of
// a token and return the index just past it, or -1 when the JSON is invalid.
// The tracking plan's check (internal/plan) reads records with SkipWS,
// ScanString and StringStops too.

// maxDepth is encoding/json's maxNestingDepth: the most containers that may be
// open at once. One more makes json.Valid (and Parse) reject the document.
const maxDepth = 10000

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// SkipWS returns the index of the first non-whitespace byte at or after i.
func SkipWS(b []byte, i int) int {
	for ; i < len(b); i++ {
		c := b[i]
		if c > ' ' || (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
			return i
		}
	}
	return i
}

// colonWS scans the ':' after a key that ends at i, and the whitespace
// around it, returning the index of the value.
func colonWS(b []byte, i int) int {
	if i = SkipWS(b, i); i >= len(b) || b[i] != ':' {
		return -1
	}
	if i = SkipWS(b, i+1); i >= len(b) {
		return -1
	}
	return i
}

// first scans past the '{' or '[' at b[i]: it returns the index of the
// first member or element and true, or the index past an immediate close
// and false.
func first(b []byte, i int, close byte) (int, bool) {
	if i = SkipWS(b, i+1); i < len(b) && b[i] == close {
		return i + 1, false
	}
	return i, true
}

// next scans what follows a member or element that ends at i (-1: invalid
// JSON) in a container that close ends: it returns the index of the next
// member or element and true, or the index past close and false, or -1
// and false.
func next(b []byte, i int, close byte) (int, bool) {
	if i < 0 {
		return -1, false
	}
	if i = SkipWS(b, i); i < len(b) {
		switch b[i] {
		case ',':
			return SkipWS(b, i+1), true
		case close:
			return i + 1, false
		}
	}
	return -1, false
}

// memberKey scans the key at b[i] of an object member and the ':' after
// it. It returns the key's content, unescaped into buf when it fits (a
// longer escaped key names no field a caller looks for), and the index of
// the value (-1: invalid JSON).
func memberKey(b []byte, i int, buf []byte) (key []byte, value int) {
	if i >= len(b) || b[i] != '"' {
		return nil, -1
	}
	end, esc := ScanString(b, i)
	if end < 0 {
		return nil, -1
	}
	if key = b[i+1 : end-1]; esc && len(key) <= len(buf) {
		key = appendUnescaped(buf[:0], key)
	}
	return key, colonWS(b, end)
}

// ScanString scans the string token at b[i] == '"'. It reports whether the
// string holds escapes (its content is then not its value).
func ScanString(b []byte, i int) (end int, esc bool) {
	i++
	for {
		// Sixteen bytes per iteration while none stops the string, the
		// second word read only when the first has no stop (most keys
		// and many values end in it).
		for i+16 <= len(b) {
			w := b[i : i+16]
			if lo := StringStops(binary.LittleEndian.Uint64(w)); lo != 0 {
				i += bits.TrailingZeros64(lo) >> 3
				break
			}
			if hi := StringStops(binary.LittleEndian.Uint64(w[8:])); hi != 0 {
				i += 8 + bits.TrailingZeros64(hi)>>3
				break
			}
			i += 16
		}
		if i >= len(b) {
			return -1, esc
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, esc
		case c == '\\':
			esc = true
			if i+1 >= len(b) {
				return -1, esc
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || hex4(b[i+2:i+6]) < 0 {
					return -1, esc
				}
				i += 6
			default:
				return -1, esc
			}
		case c < 0x20:
			return -1, esc
		default:
			i++
		}
	}
}

// StringStops flags the bytes of x (eight string bytes, little endian) that
// stop a string scan: '"', '\\' and control bytes below 0x20. The lowest
// flag (the high bit of its byte) is exact; borrows may set false flags
// above it. 0 means none of the eight bytes stops the scan.
func StringStops(x uint64) uint64 {
	// x^0x02 maps '"' (0x22) to 0x20 and keeps control bytes below 0x20, so
	// one "byte below 0x21" test finds both; x^'\\' is zero at a backslash.
	// The three tested values share x's high bits, so one &^x serves all.
	t := x ^ (lsb * 0x02)
	s := x ^ (lsb * '\\')
	return ((t - lsb*0x21) | (s - lsb)) &^ x & msb
}

// hex4 decodes four hex digits, or returns -1.
func hex4(h []byte) rune {
	if len(h) < 4 {
		return -1
	}
	var r rune
	for _, c := range h[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// scanNumber scans the number token at b[i]. isInt reports that it has no
// fraction and no exponent.
func scanNumber(b []byte, i int) (end int, isInt bool) {
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return -1, false
	}
	switch c := b[i]; {
	case c == '0':
		i++
	case '1' <= c && c <= '9':
		i++
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		return -1, false
	}
	isInt = true
	if i < len(b) && b[i] == '.' {
		isInt = false
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return -1, false
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		isInt = false
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return -1, false
		}
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	}
	return i, isInt
}

// fitsInt64 reports whether the integer token n (-?digits, no leading zeros)
// is within the int64 range.
func fitsInt64(n []byte) bool {
	limit := "9223372036854775807"
	if n[0] == '-' {
		n = n[1:]
		limit = "9223372036854775808"
	}
	if len(n) != len(limit) {
		return len(n) < len(limit)
	}
	return string(n) <= limit
}

// parseNonNeg parses the integer token n as a non-negative int up to max, or
// returns -1.
func parseNonNeg(n []byte, max int) int {
	if n[0] == '-' {
		if string(n) == "-0" {
			return 0
		}
		return -1
	}
	v := 0
	for _, c := range n {
		v = v*10 + int(c-'0')
		if v > max {
			return -1
		}
	}
	return v
}

// scanLiteral scans true, false or null at b[i].
func scanLiteral(b []byte, i int) int {
	var lit string
	switch b[i] {
	case 't':
		lit = "true"
	case 'f':
		lit = "false"
	case 'n':
		lit = "null"
	default:
		return -1
	}
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

// skipper scans arbitrary values without recursion. Its bit stack records,
// per open container, whether it is an object (1) or an array (0).
type skipper struct {
	stack [maxDepth/64 + 1]uint64
}

// skipValue scans the value at b[i] (i must be at its first byte), where
// depth containers are already open around it. It returns the index past the
// value and the deepest nesting inside it (0 for a scalar, 1 for {} or [], 2
// for {"a":{}} ...).
func (s *skipper) skipValue(b []byte, i, depth int) (end, deepest int) {
	d := 0 // containers open inside this value
	for {
		// A value is expected at i.
		if i >= len(b) {
			return -1, 0
		}
		switch c := b[i]; c {
		case '{', '[':
			d++
			if depth+d > maxDepth {
				return -1, 0
			}
			if d > deepest {
				deepest = d
			}
			w, bit := uint(d)>>6, uint64(1)<<(uint(d)&63)
			i = SkipWS(b, i+1)
			if c == '{' {
				s.stack[w] |= bit
				if i < len(b) && b[i] == '}' {
					i++
					d--
					break
				}
				if i = s.key(b, i); i < 0 {
					return -1, 0
				}
				continue
			}
			s.stack[w] &^= bit
			if i < len(b) && b[i] == ']' {
				i++
				d--
				break
			}
			continue
		case '"':
			if i, _ = ScanString(b, i); i < 0 {
				return -1, 0
			}
		case 't', 'f', 'n':
			if i = scanLiteral(b, i); i < 0 {
				return -1, 0
			}
		default:
			if i, _ = scanNumber(b, i); i < 0 {
				return -1, 0
			}
		}
		// A value ended at i: close containers until one continues.
	closing:
		for {
			if d == 0 {
				return i, deepest
			}
			obj := s.stack[uint(d)>>6]&(uint64(1)<<(uint(d)&63)) != 0
			if i+1 < len(b) && b[i] == ',' && b[i+1] > ' ' {
				i++ // compact JSON: the next member or element
				if obj {
					if i = s.key(b, i); i < 0 {
						return -1, 0
					}
				}
				break closing
			}
			i = SkipWS(b, i)
			if i >= len(b) {
				return -1, 0
			}
			switch c := b[i]; {
			case c == ',':
				i = SkipWS(b, i+1)
				if obj {
					if i = s.key(b, i); i < 0 {
						return -1, 0
					}
				}
				break closing
			case obj && c == '}', !obj && c == ']':
				i++
				d--
			default:
				return -1, 0
			}
		}
	}
}

// key scans `"key" :` and the whitespace after it, returning the index of
// the value.
func (s *skipper) key(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	if i, _ = ScanString(b, i); i < 0 {
		return -1
	}
	if i+1 < len(b) && b[i] == ':' && b[i+1] > ' ' {
		return i + 1 // compact JSON
	}
	return colonWS(b, i)
}

// appendUnescaped appends the value of the string content s (between the
// quotes, already validated by ScanString) to dst, decoding escapes as
// encoding/json does: a \u surrogate that is not part of a valid pair becomes
// U+FFFD. Other bytes are copied as they are (invalid UTF-8 is kept, where
// encoding/json would replace each invalid byte by U+FFFD; rune counts agree).
// The result is never longer than s.
func appendUnescaped(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			j := i + 1
			for j < len(s) && s[j] != '\\' {
				j++
			}
			dst = append(dst, s[i:j]...)
			i = j
			continue
		}
		switch s[i+1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(s[i+2:])
			i += 6
			if 0xD800 <= r && r < 0xE000 {
				if r < 0xDC00 && i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
					if r2 := hex4(s[i+2:]); 0xDC00 <= r2 && r2 < 0xE000 {
						dst = utf8.AppendRune(dst, 0x10000+(r-0xD800)<<10+(r2-0xDC00))
						i += 6
						continue
					}
				}
				r = utf8.RuneError
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default: // '"', '\\', '/'
			dst = append(dst, s[i+1])
		}
		i += 2
	}
	return dst
}
