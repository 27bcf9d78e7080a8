package event

// This file serves IP anonymization: finding the ip values a
// client gave, so that the relay can rewrite them before they are spooled.

// HasGivenIP reports whether the event has a top-level ip member (any of
// duplicate keys) whose value is a string other than "$remote": an address
// the client chose, which AppendRewritten forwards unchanged. Events without
// one need no AppendIPsReplaced pass.
func (e *Event) HasGivenIP() bool { return e.flags&evIPGiven != 0 }

// AppendIPsReplaced appends obj, one JSON object as Parse accepts events (an
// Event's Raw, or what AppendRewritten made of it), to dst, with the value of
// every top-level ip member that is a string replaced by what repl appends
// for that string's unescaped content. repl must append exactly one JSON
// value (a string or null). Keys are matched as Parse matches them (escaped
// keys included); members of nested objects and every other byte are copied
// unchanged. obj must not overlap dst's spare capacity.
//
// Should obj not be a well-formed object, the rest of it from where the scan
// stopped is copied unchanged.
func AppendIPsReplaced(dst, obj []byte, repl func(dst, ip []byte) []byte) []byte {
	var (
		sk  skipper
		buf [64]byte
	)
	pos := 0 // obj[:pos] is in dst
	i := SkipWS(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return append(dst, obj...)
	}
	i, more := first(obj, i, '}')
	for ; more && i < len(obj) && obj[i] == '"'; i, more = next(obj, i, '}') {
		end, f := eventKey(obj, i)
		if end < 0 {
			break
		}
		if i = colonWS(obj, end); i < 0 {
			break
		}
		if f == fIP && obj[i] == '"' {
			end, esc := ScanString(obj, i)
			if end < 0 {
				break
			}
			content := obj[i+1 : end-1]
			if esc {
				content = appendUnescaped(buf[:0], content)
			}
			dst = append(dst, obj[pos:i]...)
			dst = repl(dst, content)
			pos, i = end, end
		} else {
			i, _ = sk.skipValue(obj, i, 1)
		}
	}
	return append(dst, obj[pos:]...)
}
