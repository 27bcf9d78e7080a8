package plan

import (
	"bytes"
	"encoding/json"
	"slices"
)

// This file checks one event (a spool record: a JSON object the ingest
// already validated strictly) against a compiled plan without decoding it:
// a scanner finds event_type, event_properties and user_properties and
// walks their members in place. It assumes valid JSON; on bytes that are
// not (a damaged record the spool's checksum let through cannot be), it
// stops early and reports what it saw, never panics.

// verdict is what check found.
type verdict struct {
	eventType string
	// out is the record with its unplanned properties removed (Filter),
	// nil when nothing was removed.
	out []byte
	// quarantine: the event must not be sent.
	quarantine bool
	// keybuf holds an escaped key or value's unescaped bytes.
	keybuf []byte
}

// check checks data in mode (Observe, Filter or Block), appending its
// violations to vs.
func (c *compiled) check(data []byte, mode Mode, vs []Violation) (verdict, []Violation) {
	var v verdict
	et, ep, up := topFields(data)
	var rules *eventRules
	if raw := et.raw(data); len(raw) > 0 && raw[0] == '$' {
		// The SDKs' own events ($identify, $groupidentify) are no
		// planned event types; their user properties are checked.
		rules = &noRules
	} else if rules = c.events[string(et.key(data, &v.keybuf))]; rules == nil {
		vs = append(vs, Violation{Kind: UnplannedEventType})
	}
	var drop []span
	if rules != nil {
		var seen int
		drop, vs, seen = c.props(data, ep, rules, vs, drop, &v)
		if seen < len(rules.required) {
			vs = missing(data, ep, rules, vs, &v)
		}
	}
	drop, vs = c.userProps(data, up, vs, drop, &v)
	switch {
	case len(vs) == 0:
	case mode == Block:
		v.quarantine = true
	case mode == Filter && rules == nil:
		v.quarantine = true
	case mode == Filter && len(drop) > 0:
		slices.SortFunc(drop, func(a, b span) int { return a.from - b.from })
		v.out = without(data, drop)
	}
	if len(vs) > 0 {
		v.eventType = et.str(data)
	}
	return v, vs
}

var noRules eventRules

// span is a byte range of data; for a member to drop, it covers the member
// and one comma next to it.
type span struct{ from, to int }

// raw is the content of the string at s (escapes as they are), nil when it
// is not a string.
func (s span) raw(b []byte) []byte {
	if s.to-s.from < 2 || b[s.from] != '"' {
		return nil
	}
	return b[s.from+1 : s.to-1]
}

// key is the value of the string at s: its content when it has no escape,
// else its unescaped value in *buf.
func (s span) key(b []byte, buf *[]byte) []byte {
	raw := s.raw(b)
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw
	}
	var out string
	json.Unmarshal(b[s.from:s.to], &out)
	*buf = append((*buf)[:0], out...)
	return *buf
}

// str is the string value at s (unescaped), "" when it is not a string.
func (s span) str(b []byte) string {
	var buf []byte
	return string(s.key(b, &buf))
}

// members iterates over the members of a JSON object.
type members struct {
	b      []byte
	i, end int
	key    span // the key's string token
	member span // from the key to the value's end
	val    span
}

func newMembers(b []byte, obj span) members {
	if obj.to <= obj.from || b[obj.from] != '{' {
		return members{b: b, i: obj.to, end: obj.to}
	}
	return members{b: b, i: skipWS(b, obj.from+1), end: obj.to}
}

// next moves to the next member; false at the end (or on bytes that are
// not JSON).
func (m *members) next() bool {
	b, i := m.b, m.i
	if i >= m.end || b[i] != '"' {
		return false
	}
	ke := stringEnd(b, i)
	if ke < 0 {
		return false
	}
	vi := skipWS(b, ke)
	if vi >= len(b) || b[vi] != ':' {
		return false
	}
	vi = skipWS(b, vi+1)
	ve := valueEnd(b, vi)
	if ve < 0 {
		return false
	}
	m.key, m.member, m.val = span{i, ke}, span{i, ve}, span{vi, ve}
	i = skipWS(b, ve)
	if i < len(b) && b[i] == ',' {
		i = skipWS(b, i+1)
	}
	m.i = i
	return true
}

// topFields finds the values of the record's event_type,
// event_properties and user_properties (zero spans when absent).
func topFields(b []byte) (et, ep, up span) {
	m := newMembers(b, span{0, len(b)})
	for m.next() {
		switch string(m.key.raw(b)) {
		case "event_type":
			et = m.val
		case "event_properties":
			ep = m.val
		case "user_properties":
			up = m.val
		}
	}
	return
}

// props checks the event properties at ep against rules; it appends the
// unplanned members to drop and returns how many required ones it saw.
func (c *compiled) props(b []byte, ep span, rules *eventRules, vs []Violation, drop []span, v *verdict) ([]span, []Violation, int) {
	seen := 0
	m := newMembers(b, ep)
	for m.next() {
		key := m.key.key(b, &v.keybuf)
		r := rules.props[string(key)]
		if r == nil {
			vs = append(vs, Violation{Kind: UnplannedEventProperty, Property: string(key)})
			drop = append(drop, m.member)
			continue
		}
		if r.required && !isNull(b, m.val) {
			seen++
		}
		vs = r.check(b, m.val, false, vs, v)
	}
	return drop, vs, seen
}

// missing appends a RequiredMissing for each required property of rules
// absent (or null) at ep.
func missing(b []byte, ep span, rules *eventRules, vs []Violation, v *verdict) []Violation {
	for _, r := range rules.required {
		found := false
		m := newMembers(b, ep)
		for m.next() {
			if string(m.key.key(b, &v.keybuf)) == r.name && !isNull(b, m.val) {
				found = true
			}
		}
		if !found {
			vs = append(vs, Violation{Kind: RequiredMissing, Property: r.name})
		}
	}
	return vs
}

// userProps checks the user properties at up: plain members, or the
// members of the operations ($set, $setOnce, $add, $append, $unset, ...);
// values are checked for plain members and $set/$setOnce only.
func (c *compiled) userProps(b []byte, up span, vs []Violation, drop []span, v *verdict) ([]span, []Violation) {
	one := func(m *members, values bool) {
		key := m.key.key(b, &v.keybuf)
		r := c.users[string(key)]
		if r == nil {
			vs = append(vs, Violation{Kind: UnplannedUserProperty, Property: "user:" + string(key)})
			drop = append(drop, m.member)
			return
		}
		if values {
			vs = r.check(b, m.val, true, vs, v)
		}
	}
	m := newMembers(b, up)
	for m.next() {
		op := m.key.raw(b)
		if len(op) == 0 || op[0] != '$' {
			one(&m, true)
			continue
		}
		values := string(op) == "$set" || string(op) == "$setOnce"
		in := newMembers(b, m.val)
		for in.next() {
			one(&in, values)
		}
	}
	return drop, vs
}

func isNull(b []byte, v span) bool { return v.to > v.from && b[v.from] == 'n' }

// check appends the violations of the value at v (of a user property when
// user).
func (r *rule) check(b []byte, v span, user bool, vs []Violation, vd *verdict) []Violation {
	if isNull(b, v) {
		return vs
	}
	name := func() string {
		if user {
			return "user:" + r.name
		}
		return r.name
	}
	if b[v.from] != '[' {
		if r.array {
			return append(vs, Violation{Kind: ArrayMismatch, Property: name()})
		}
		if k := r.scalar(b, v, vd); k != "" {
			vs = append(vs, Violation{Kind: k, Property: name()})
		}
		return vs
	}
	if !r.array {
		return append(vs, Violation{Kind: ArrayMismatch, Property: name()})
	}
	// Each kind once per property, however many elements break it.
	var kinds [3]string
	n := 0
	i := skipWS(b, v.from+1)
	for i < v.to && b[i] != ']' {
		e := valueEnd(b, i)
		if e < 0 {
			break
		}
		if k := r.scalar(b, span{i, e}, vd); k != "" && k != kinds[0] && k != kinds[1] && n < len(kinds) {
			kinds[n] = k
			n++
			vs = append(vs, Violation{Kind: k, Property: name()})
		}
		i = skipWS(b, e)
		if i < len(b) && b[i] == ',' {
			i = skipWS(b, i+1)
		}
	}
	return vs
}

// scalar is the violation kind of one (element) value, "" when it passes.
func (r *rule) scalar(b []byte, v span, vd *verdict) string {
	c := b[v.from]
	switch {
	case c == 'n':
		return ""
	case c == '{' || c == '[':
		if r.typ != tAny {
			return WrongType
		}
		return ""
	case c == '"':
		if r.typ == tNumber || r.typ == tBoolean {
			return WrongType
		}
		if r.enum == nil && r.re == nil {
			return ""
		}
		s := v.key(b, &vd.keybuf)
		if r.enum != nil {
			if _, ok := r.enum[string(s)]; !ok {
				return NotInEnum
			}
		}
		if r.re != nil && !r.re.Match(s) {
			return RegexMismatch
		}
		return ""
	case c == 't' || c == 'f':
		if r.typ == tString || r.typ == tNumber {
			return WrongType
		}
	default: // a number
		if r.typ == tString || r.typ == tBoolean {
			return WrongType
		}
	}
	if r.enum != nil {
		if _, ok := r.enum[string(b[v.from:v.to])]; !ok {
			return NotInEnum
		}
	}
	return ""
}

// without returns a copy of b without the member spans drop (each
// ascending within its object), and the comma that went with each.
func without(b []byte, drop []span) []byte {
	out := make([]byte, 0, len(b))
	at := 0
	for _, d := range drop {
		from, to := d.from, d.to
		// Take the comma after the member, else the one before it.
		j := skipWS(b, to)
		if j < len(b) && b[j] == ',' {
			to = skipWS(b, j+1)
		} else {
			k := from - 1
			for k > at && isWS(b[k]) {
				k--
			}
			if k >= at && b[k] == ',' {
				from = k
			}
		}
		if from < at {
			from = at
		}
		out = append(out, b[at:from]...)
		at = to
	}
	return append(out, b[at:]...)
}

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipWS(b []byte, i int) int {
	for i < len(b) && isWS(b[i]) {
		i++
	}
	return i
}

// stringEnd is the index past the string at b[i] == '"', -1 if
// unterminated: the next '"' not escaped (an odd run of backslashes before
// it), found with IndexByte rather than byte by byte.
func stringEnd(b []byte, i int) int {
	i++
	for {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return -1
		}
		q := i + j
		n := 0
		for k := q - 1; k >= i && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return q + 1
		}
		i = q + 1
	}
}

// structural marks the bytes valueEnd stops at inside a container.
var structural = [256]bool{'"': true, '{': true, '[': true, '}': true, ']': true}

// valueEnd is the index past the JSON value at b[i], -1 when it does not
// end.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			if !structural[b[i]] {
				continue
			}
			switch b[i] {
			case '"':
				e := stringEnd(b, i)
				if e < 0 {
					return -1
				}
				i = e - 1
			case '{', '[':
				depth++
			default: // '}', ']'
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return -1
	}
	for ; i < len(b); i++ {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return i
}
