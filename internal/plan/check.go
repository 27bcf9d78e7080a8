package plan

import (
	"encoding/json"
	"slices"
	"strings"
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
}

// check checks data in mode (Observe, Filter or Block), appending its
// violations to vs.
func (c *compiled) check(data []byte, mode Mode, vs []Violation) (verdict, []Violation) {
	var v verdict
	et, ep, up := topFields(data)
	v.eventType = et.str(data)
	var rules *eventRules
	if strings.HasPrefix(v.eventType, "$") {
		// The SDKs' own events ($identify, $groupidentify) are no
		// planned event types; their user properties are checked.
		rules = &eventRules{}
	} else if rules = c.events[v.eventType]; rules == nil {
		vs = append(vs, Violation{Kind: UnplannedEventType})
	}
	var dropE, dropU []span
	if rules != nil {
		var seen int
		dropE, vs, seen = c.props(data, ep, rules, vs)
		if seen < len(rules.required) {
			vs = missing(data, ep, rules, vs)
		}
	}
	dropU, vs = c.userProps(data, up, vs)
	switch {
	case len(vs) == 0:
	case mode == Block:
		v.quarantine = true
	case mode == Filter && rules == nil:
		v.quarantine = true
	case mode == Filter && len(dropE)+len(dropU) > 0:
		drop := append(dropE, dropU...)
		slices.SortFunc(drop, func(a, b span) int { return a.from - b.from })
		v.out = without(data, drop)
	}
	return v, vs
}

// span is a byte range of data; for a member to drop, it covers the member
// and one comma next to it.
type span struct{ from, to int }

// str is the string value at s (unescaped), "" when it is not a string.
func (s span) str(b []byte) string {
	if s.to <= s.from || b[s.from] != '"' {
		return ""
	}
	raw := b[s.from+1 : s.to-1]
	if strings.IndexByte(string(raw), '\\') < 0 {
		return string(raw)
	}
	var out string
	json.Unmarshal(b[s.from:s.to], &out)
	return out
}

// topFields finds the values of the record's event_type,
// event_properties and user_properties (zero spans when absent).
func topFields(b []byte) (et, ep, up span) {
	eachMember(b, span{0, len(b)}, func(key string, k, v span) {
		switch key {
		case "event_type":
			et = v
		case "event_properties":
			ep = v
		case "user_properties":
			up = v
		}
	})
	return
}

// eachMember calls f for each member of the object at obj (key, the span of
// the member from its key to its value's end, the value's span).
func eachMember(b []byte, obj span, f func(key string, member, val span)) {
	if obj.to <= obj.from || b[obj.from] != '{' {
		return
	}
	i := skipWS(b, obj.from+1)
	for i < obj.to && b[i] == '"' {
		ke := stringEnd(b, i)
		if ke < 0 {
			return
		}
		key := span{i, ke}.str(b)
		vi := skipWS(b, ke)
		if vi >= len(b) || b[vi] != ':' {
			return
		}
		vi = skipWS(b, vi+1)
		ve := valueEnd(b, vi)
		if ve < 0 {
			return
		}
		f(key, span{i, ve}, span{vi, ve})
		i = skipWS(b, ve)
		if i < len(b) && b[i] == ',' {
			i = skipWS(b, i+1)
		}
	}
}

// props checks the event properties at ep against rules; it returns the
// unplanned members (to drop) and how many required ones it saw.
func (c *compiled) props(b []byte, ep span, rules *eventRules, vs []Violation) ([]span, []Violation, int) {
	var drop []span
	seen := 0
	eachMember(b, ep, func(key string, m, v span) {
		r := rules.props[key]
		if r == nil {
			vs = append(vs, Violation{Kind: UnplannedEventProperty, Property: key})
			drop = append(drop, m)
			return
		}
		if r.required && !isNull(b, v) {
			seen++
		}
		vs = r.check(b, v, key, vs)
	})
	return drop, vs, seen
}

// missing appends a RequiredMissing for each required property of rules
// absent (or null) at ep.
func missing(b []byte, ep span, rules *eventRules, vs []Violation) []Violation {
	for _, r := range rules.required {
		found := false
		eachMember(b, ep, func(key string, _, v span) {
			if key == r.name && !isNull(b, v) {
				found = true
			}
		})
		if !found {
			vs = append(vs, Violation{Kind: RequiredMissing, Property: r.name})
		}
	}
	return vs
}

// userProps checks the user properties at up: plain members, or the
// members of the operations ($set, $setOnce, $add, $append, $unset, ...);
// values are checked for plain members and $set/$setOnce only.
func (c *compiled) userProps(b []byte, up span, vs []Violation) ([]span, []Violation) {
	var drop []span
	one := func(key string, m, v span, values bool) {
		r := c.users[key]
		if r == nil {
			vs = append(vs, Violation{Kind: UnplannedUserProperty, Property: "user:" + key})
			drop = append(drop, m)
			return
		}
		if values {
			vs = r.check(b, v, "user:"+key, vs)
		}
	}
	eachMember(b, up, func(key string, m, v span) {
		if !strings.HasPrefix(key, "$") {
			one(key, m, v, true)
			return
		}
		values := key == "$set" || key == "$setOnce"
		eachMember(b, v, func(key string, m, v span) { one(key, m, v, values) })
	})
	return drop, vs
}

func isNull(b []byte, v span) bool { return v.to > v.from && b[v.from] == 'n' }

// check appends the violations of the value at v.
func (r *rule) check(b []byte, v span, name string, vs []Violation) []Violation {
	if isNull(b, v) {
		return vs
	}
	if b[v.from] != '[' {
		if r.array {
			return append(vs, Violation{Kind: ArrayMismatch, Property: name})
		}
		if k := r.scalar(b, v); k != "" {
			vs = append(vs, Violation{Kind: k, Property: name})
		}
		return vs
	}
	if !r.array {
		return append(vs, Violation{Kind: ArrayMismatch, Property: name})
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
		if k := r.scalar(b, span{i, e}); k != "" && k != kinds[0] && k != kinds[1] && n < len(kinds) {
			kinds[n] = k
			n++
			vs = append(vs, Violation{Kind: k, Property: name})
		}
		i = skipWS(b, e)
		if i < len(b) && b[i] == ',' {
			i = skipWS(b, i+1)
		}
	}
	return vs
}

// scalar is the violation kind of one (element) value, "" when it passes.
func (r *rule) scalar(b []byte, v span) string {
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
		s := v.str(b)
		if r.enum != nil {
			if _, ok := r.enum[s]; !ok {
				return NotInEnum
			}
		}
		if r.re != nil && !r.re.MatchString(s) {
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

// stringEnd is the index past the string at b[i] == '"', -1 if unterminated.
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

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
			switch b[i] {
			case '"':
				e := stringEnd(b, i)
				if e < 0 {
					return -1
				}
				i = e - 1
			case '{', '[':
				depth++
			case '}', ']':
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
