package plan

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/bits"
	"slices"

	"github.com/svcrelay/relay/internal/event"
)

// This file checks one event (a spool record: a JSON object the ingest
// already validated strictly) against a compiled plan without decoding it:
// one walk over the record's top level finds event_type, event_properties
// and user_properties and checks the objects' members where they lie
// (bench/RESULTS.md has what it costs and where). It assumes valid JSON; on bytes that are
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
//
// It walks the record's top level once. The event properties are checked
// in place when the event type came before them, the user properties when
// the event properties were done (or absent so far): the violations keep
// one order (event type, event properties, missing ones, user properties)
// whatever the record's. What came too early is checked after the walk; a
// key given twice (the last one counts) has the walk's findings dropped
// and its objects checked after it.
func (c *compiled) check(data []byte, mode Mode, vs []Violation) (verdict, []Violation) {
	var v verdict
	et, ep, up := span{-1, -1}, span{-1, -1}, span{-1, -1}
	var rules *eventRules
	var drop []span
	n0 := len(vs)
	typed, epDone, upDone, dup := false, false, false, false
	// The top level by hand: its keys are read and matched by their words
	// and the values it skips (strings, mostly) scanned in the same loop,
	// without a call per member.
	b := data
	i := len(b)
	if len(b) > 0 && b[0] == '{' {
		touch(b)
		i = event.SkipWS(b, 1)
	}
	for i < len(b) && b[i] == '"' {
		ke, short := 0, false
		var w keyWords
		if i+2+shortKey <= len(b) {
			w, ke = shortKeyAt(b, i)
			short = ke > 0
		}
		if ke == 0 {
			if ke, _, w, short = keyAt(b, i); ke < 0 {
				break
			}
		}
		from := event.SkipWS(b, ke)
		if from >= len(b) || b[from] != ':' {
			break
		}
		from = event.SkipWS(b, from+1)
		end := -1
		// A key matches only as it is written (an escaped one is no
		// field of the check), so only a short key can.
		switch {
		case short && w == eventTypeWords:
			dup = dup || et.from >= 0
			var w keyWords
			short := false
			if from < len(b) && b[from] == '"' {
				end, _, w, short = keyAt(b, from)
			} else {
				end = valueEnd(b, from)
			}
			et = span{from, end}
			if !dup {
				rules, vs = c.typeRules(b, et, short, w, vs, &v)
				typed = true
			}
		case short && w == eventPropsWords:
			dup = dup || ep.from >= 0
			if typed && !dup {
				end, vs, drop = c.props(b, from, rules, vs, drop, &v)
				epDone = true
			}
			if end < 0 {
				end = valueEnd(b, from)
			}
			ep = span{from, end}
		case short && w == userPropsWords:
			dup = dup || up.from >= 0
			if typed && (epDone || rules == nil) && !dup {
				end, vs, drop = c.userProps(b, from, vs, drop, &v)
				upDone = true
			}
			if end < 0 {
				end = valueEnd(b, from)
			}
			up = span{from, end}
		default:
			end = skipValue(b, from)
		}
		if end < 0 {
			break
		}
		if end+1 < len(b) && b[end] == ',' && b[end+1] == '"' {
			i = end + 1 // compact JSON: the next key
			continue
		}
		i = event.SkipWS(b, end)
		if i < len(b) && b[i] == ',' {
			i = event.SkipWS(b, i+1)
		}
	}
	if dup {
		vs, drop = vs[:n0], drop[:0]
		typed, epDone, upDone = false, false, false
	}
	if !typed {
		rules, vs = c.typeRules(data, et, false, keyWords{}, vs, &v)
	}
	if !epDone {
		_, vs, drop = c.props(data, ep.from, rules, vs, drop, &v)
	}
	if !upDone {
		_, vs, drop = c.userProps(data, up.from, vs, drop, &v)
	}
	switch {
	case len(vs) == n0:
	case mode == Block:
		v.quarantine = true
	case mode == Filter && rules == nil:
		v.quarantine = true
	case mode == Filter && len(drop) > 0:
		slices.SortFunc(drop, func(a, b span) int { return a.from - b.from })
		v.out = without(data, drop)
	}
	if len(vs) > n0 {
		v.eventType = string(et.key(data, &v.keybuf))
	}
	return v, vs
}

// touch reads one byte of each cache line of b. At delivery a record has
// often left the cache since the ingest wrote it; the walk then meets its
// lines one at a time, each load waiting for the one before (where the
// next string ends), while these loads are independent and all fetched at
// once. (Not inlined, so that the loads, whose result no caller uses,
// are kept.)
//
//go:noinline
func touch(b []byte) (x byte) {
	for j := 0; j < len(b); j += 64 {
		x |= b[j]
	}
	return x
}

// typeRules returns the rules of the event type at et (absent: from < 0;
// w holds it when short), nil with a violation when it is not planned.
func (c *compiled) typeRules(data []byte, et span, short bool, w keyWords, vs []Violation, v *verdict) (*eventRules, []Violation) {
	if raw := et.raw(data); len(raw) > 0 && raw[0] == '$' {
		// The SDKs' own events ($identify, $groupidentify) are no
		// planned event types; their user properties are checked.
		return &noRules, vs
	}
	if short && len(c.eventTable.slots) > 0 {
		if rules := c.eventTable.lookup(w); rules != nil {
			return rules, vs
		}
	}
	rules := c.events[string(et.key(data, &v.keybuf))]
	if rules == nil {
		vs = append(vs, Violation{Kind: UnplannedEventType})
	}
	return rules, vs
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

// members iterates over the members of a JSON object in place: the
// object's end is found by walking it.
type members struct {
	b      []byte
	i      int
	bad    bool // not an object
	key    span // the key's string token
	esc    bool // the key has an escape
	short  bool // words holds the key (see keyAt)
	words  keyWords
	member span // from the key to the value's end
	val    span // its from is known after nextKey, its to after skip
}

// objectAt starts the members of the object at b[from] (none when from <
// 0 or it is no object).
func objectAt(b []byte, from int) members {
	if from < 0 || from >= len(b) || b[from] != '{' {
		return members{b: b, i: len(b), bad: true}
	}
	return members{b: b, i: event.SkipWS(b, from+1)}
}

// nextKey moves to the next member's key and the start of its value;
// false at the end (or on bytes that are not JSON).
func (m *members) nextKey() bool {
	b, i := m.b, m.i
	if i >= len(b) || b[i] != '"' {
		return false
	}
	ke := 0
	if i+2+shortKey <= len(b) {
		// keyAt's short path, here to save a call per key.
		if m.words, ke = shortKeyAt(b, i); ke > 0 {
			m.esc, m.short = false, true
		}
	}
	if ke == 0 {
		if ke, m.esc, m.words, m.short = keyAt(b, i); ke < 0 {
			return false
		}
	}
	vi := event.SkipWS(b, ke)
	if vi >= len(b) || b[vi] != ':' {
		return false
	}
	m.key, m.val.from = span{i, ke}, event.SkipWS(b, vi+1)
	return true
}

// name is the member's key (unescaped in *buf when it has an escape).
func (m *members) name(buf *[]byte) []byte {
	if !m.esc {
		return m.key.raw(m.b)
	}
	return m.key.key(m.b, buf)
}

// skip ends the member whose value ends at end and moves past its comma;
// false when end < 0 (a value that does not end).
func (m *members) skip(end int) bool {
	if end < 0 {
		m.i = len(m.b)
		m.bad = true
		return false
	}
	b := m.b
	m.member, m.val.to = span{m.key.from, end}, end
	i := event.SkipWS(b, end)
	if i < len(b) && b[i] == ',' {
		i = event.SkipWS(b, i+1)
	}
	m.i = i
	return true
}

// next moves to the next member; false at the end.
func (m *members) next() bool {
	if !m.nextKey() {
		return false
	}
	end := skipValue(m.b, m.val.from)
	if end < 0 {
		return m.skip(end)
	}
	b := m.b
	if end+1 < len(b) && b[end] == ',' && b[end+1] == '"' {
		// compact JSON: skip's work without its calls
		m.member, m.val.to, m.i = span{m.key.from, end}, end, end+1
		return true
	}
	return m.skip(end)
}

// end is the index past the object once next or nextKey returned false,
// -1 when the bytes were no object's.
func (m *members) end() int {
	if m.bad || m.i >= len(m.b) || m.b[m.i] != '}' {
		return -1
	}
	return m.i + 1
}

// props checks the event properties at b[from] (absent: from < 0) against
// rules (nil: not checked), appending the unplanned members to drop, and
// the required ones missing; it returns the index past them (-1 when
// unknown).
func (c *compiled) props(b []byte, from int, rules *eventRules, vs []Violation, drop []span, v *verdict) (int, []Violation, []span) {
	if rules == nil {
		return -1, vs, drop
	}
	seen := 0
	m := objectAt(b, from)
	for m.next() {
		r := rulesFor(&rules.table, rules.props, &m, &v.keybuf)
		if r == nil {
			vs = append(vs, Violation{Kind: UnplannedEventProperty, Property: string(m.name(&v.keybuf))})
			drop = append(drop, m.member)
			continue
		}
		if r.required && !isNull(b, m.val) {
			seen++
		}
		if r.passes(b[m.val.from]) {
			continue
		}
		vs = r.check(b, m.val, false, vs, v)
	}
	end := m.end()
	if seen < len(rules.required) {
		vs = missing(b, from, rules, vs, v)
	}
	return end, vs, drop
}

// missing appends a RequiredMissing for each required property of rules
// absent (or null) at b[from].
func missing(b []byte, from int, rules *eventRules, vs []Violation, v *verdict) []Violation {
	for _, r := range rules.required {
		found := false
		m := objectAt(b, from)
		for m.next() {
			if string(m.name(&v.keybuf)) == r.name && !isNull(b, m.val) {
				found = true
			}
		}
		if !found {
			vs = append(vs, Violation{Kind: RequiredMissing, Property: r.name})
		}
	}
	return vs
}

// userProps checks the user properties at b[from] (absent: from < 0):
// plain members, or the members of the operations ($set, $setOnce, $add,
// $append, $unset, ...); values are checked for plain members and
// $set/$setOnce only. It returns the index past them (-1 when unknown).
func (c *compiled) userProps(b []byte, from int, vs []Violation, drop []span, v *verdict) (int, []Violation, []span) {
	m := objectAt(b, from)
	for m.nextKey() {
		op := m.key.raw(b)
		if len(op) == 0 || op[0] != '$' {
			if !m.skip(valueEnd(b, m.val.from)) {
				break
			}
			vs, drop = c.userProp(b, &m, true, vs, drop, v)
			continue
		}
		values := string(op) == "$set" || string(op) == "$setOnce"
		in := objectAt(b, m.val.from)
		for in.next() {
			vs, drop = c.userProp(b, &in, values, vs, drop, v)
		}
		end := in.end()
		if end < 0 {
			end = valueEnd(b, m.val.from)
		}
		if !m.skip(end) {
			break
		}
	}
	return m.end(), vs, drop
}

// userProp checks the user property at m.
func (c *compiled) userProp(b []byte, m *members, values bool, vs []Violation, drop []span, v *verdict) ([]Violation, []span) {
	r := rulesFor(&c.userTable, c.users, m, &v.keybuf)
	if r == nil {
		vs = append(vs, Violation{Kind: UnplannedUserProperty, Property: "user:" + string(m.name(&v.keybuf))})
		return vs, append(drop, m.member)
	}
	if values && !r.passes(b[m.val.from]) {
		vs = r.check(b, m.val, true, vs, v)
	}
	return vs, drop
}

// passes is true when any value starting with c passes r: r checks no
// more than the value's type (see plain).
func (r *rule) passes(c byte) bool { return r.plain&(1<<firstClass[c]) != 0 }

// firstClass is the class of a value by its first byte: what a rule
// without enum, pattern or array checks ('"', 'n', '{', '[', 't' or 'f',
// the rest: a number).
var firstClass = func() (t [256]uint8) {
	for c := range t {
		t[c] = 5
	}
	t['"'], t['n'], t['{'], t['['], t['t'], t['f'] = 0, 1, 2, 3, 4, 4
	return t
}()

// plain is the set of firstClass classes whose values all pass r: none
// when r has an enum, a pattern or is an array (its verdict then depends on
// more than the first byte). It is found by checking one value of each
// class, so that it agrees with check by construction.
func plain(r *rule) uint8 {
	if r.enum != nil || r.re != nil || r.match != nil || r.array {
		return 0
	}
	var set uint8
	for _, s := range []string{`"x"`, `null`, `{}`, `[]`, `true`, `1`} {
		var vd verdict
		if vs := r.check([]byte(s), span{0, len(s)}, false, nil, &vd); len(vs) == 0 {
			set |= 1 << firstClass[s[0]]
		}
	}
	return set
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
	i := event.SkipWS(b, v.from+1)
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
		i = event.SkipWS(b, e)
		if i < len(b) && b[i] == ',' {
			i = event.SkipWS(b, i+1)
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
		if r.enum == nil && r.re == nil && r.match == nil {
			return ""
		}
		s := v.key(b, &vd.keybuf)
		if r.enum != nil {
			if _, ok := r.enum[string(s)]; !ok {
				return NotInEnum
			}
		}
		if r.match != nil && !r.match.match(s) || r.re != nil && !r.re.Match(s) {
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
		j := event.SkipWS(b, to)
		if j < len(b) && b[j] == ',' {
			to = event.SkipWS(b, j+1)
		} else {
			k := from - 1
			for k > at && (b[k] == ' ' || b[k] == '\t' || b[k] == '\n' || b[k] == '\r') {
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

// skipValue is valueEnd(b, i), a string's end found here (the commonest
// value, most within a few words) without valueEnd's call to ScanString.
func skipValue(b []byte, i int) int {
	if i < len(b) && b[i] == '"' {
		for j := i + 1; j+8 <= len(b); j += 8 {
			if z := event.StringStops(binary.LittleEndian.Uint64(b[j:])); z != 0 {
				if j += bits.TrailingZeros64(z) >> 3; b[j] == '"' {
					return j + 1
				}
				break // an escape: ScanString's
			}
		}
	}
	return valueEnd(b, i)
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
		e, _ := event.ScanString(b, i)
		return e
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			if !structural[b[i]] {
				continue
			}
			switch b[i] {
			case '"':
				e, _ := event.ScanString(b, i)
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
		if scalarEnd[b[i]] {
			return i
		}
	}
	return i
}

// scalarEnd marks the bytes a number, true, false or null ends at.
var scalarEnd = [256]bool{',': true, '}': true, ']': true, ' ': true, '\t': true, '\n': true, '\r': true}
