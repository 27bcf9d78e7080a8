package event

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// refScanString is ScanString one byte at a time, the obvious way.
func refScanString(b []byte, i int) (end int, esc bool) {
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1, esc
		case c < 0x20:
			return -1, esc
		case c == '\\':
			esc = true
			if i+1 >= len(b) {
				return -1, esc
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if hex4(b[i+2:min(i+6, len(b))]) < 0 {
					return -1, esc
				}
				i += 5
			default:
				return -1, esc
			}
		}
	}
	return -1, esc
}

// stopProbes are bytes that stop a string scan and their neighbours (and
// the bytes that differ from them only in the bit the SWAR test ignores).
var stopProbes = []byte{
	'"', '\\', 0x00, 0x01, 0x1f, 0x20, 0x21, 0x23, 0x02, 0x03, 0x5b, 0x5d, 0x5c ^ 0x02,
	0x7f, 0x80, 0x81, 0xa0, 0xa2, 0xa1, 0xdc, 0xdd, 0xfe, 0xff, 'u', 'a',
}

// TestScanString puts every probe byte at every offset of a string (so at
// every position of the 8- and 16-byte words ScanString reads), with and
// without the string's end at the end of the buffer, after a clean prefix
// of every length and after an escape ending at a word boundary.
func TestScanString(t *testing.T) {
	tails := []string{`"`, `"x`, `" ,"abc":1}` + strings.Repeat(" ", 20), ``}
	for _, pre := range []string{``, `\n`, `ab\u00e9`, `\\`, `abcdef\"`, `abcdefghijklmn\/`} {
		for n := range 40 {
			for _, probe := range stopProbes {
				for _, tail := range tails {
					body := `"` + pre + strings.Repeat("y", n) + string(probe) + strings.Repeat("z", n%17) + tail
					b := []byte(body)
					end, esc := ScanString(b, 0)
					wantEnd, wantEsc := refScanString(b, 0)
					if end != wantEnd || (end >= 0 && esc != wantEsc) {
						t.Fatalf("ScanString(%q) = %d, %v; want %d, %v", body, end, esc, wantEnd, wantEsc)
					}
					// The verdict is json.Valid's on the string alone.
					if end >= 0 && json.Valid(b[:end]) != true || end < 0 && tail == `"` && json.Valid(b) {
						t.Fatalf("ScanString(%q) = %d disagrees with json.Valid", body, end)
					}
				}
			}
		}
	}
}

// TestStringStops checks the exact lowest flag for every byte value at every
// position of the word, after bytes that do not stop the scan.
func TestStringStops(t *testing.T) {
	for pos := range 8 {
		for v := range 256 {
			var w [8]byte
			for k := range w {
				w[k] = 'a' + byte(k)
			}
			w[pos] = byte(v)
			x := uint64(0)
			for k := 7; k >= 0; k-- {
				x = x<<8 | uint64(w[k])
			}
			stops := v == '"' || v == '\\' || v < 0x20
			m := StringStops(x)
			low := m & -m
			if stops != (low == 0x80<<(8*pos)) || !stops && m != 0 {
				t.Errorf("byte %#02x at %d: StringStops = %#016x", v, pos, m)
			}
		}
	}
}

// TestAppendJSONString round-trips strings with runs of plain bytes broken
// by every kind of byte that is escaped or replaced, at the start, middle
// and end.
func TestAppendJSONString(t *testing.T) {
	for _, special := range []string{``, `"`, `\`, "\x00", "\x1f", "\x7f", "é", "\u2028", "\xff", "\xe2\x82", "\U0001F600"} {
		for _, s := range []string{special, "10.0.0.1" + special, special + "10.0.0.1", "a" + special + "b" + special + "c"} {
			out := appendJSONString([]byte("x"), []byte(s))
			var got string
			// valid UTF-8 out: invalid bytes are replaced, not copied
			if out[0] != 'x' || !utf8.Valid(out) || json.Unmarshal(out[1:], &got) != nil || got != jsonString([]byte(s)) {
				t.Errorf("appendJSONString(%q) = %s, decodes to %q", s, out, got)
			}
		}
	}
}

// FuzzScanString compares ScanString with refScanString, and eventKey with
// the slow path it shortcuts, at every '"' of the input.
func FuzzScanString(f *testing.F) {
	f.Add([]byte(`"user_id":"abcdefghijklmn\"\u00e9op","event_properties":{"a\\b":"\u0000"}`))
	f.Add([]byte("\"time\x01\"\"ip\"\"0123456789abcdef\"\"0123456789abcde\\\""))
	f.Fuzz(func(t *testing.T, b []byte) {
		for i, c := range b {
			if c != '"' {
				continue
			}
			end, esc := ScanString(b, i)
			wantEnd, wantEsc := refScanString(b, i)
			if end != wantEnd || end >= 0 && esc != wantEsc {
				t.Fatalf("ScanString(%q, %d) = %d, %v; want %d, %v", b, i, end, esc, wantEnd, wantEsc)
			}
			wantF := -1
			if end >= 0 {
				k := b[i+1 : end-1]
				if esc {
					k = appendUnescaped(nil, k)
				}
				wantF = lookupField(k)
			}
			if kEnd, f := eventKey(b, i); kEnd != end || end >= 0 && f != wantF {
				t.Fatalf("eventKey(%q, %d) = %d, %d; want %d, %d", b, i, kEnd, f, end, wantF)
			}
		}
	})
}
