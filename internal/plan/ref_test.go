package plan

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/benchtest"
)

// The check as it was before its loops were fused (one call per step),
// kept as the reference the fused check must agree with exactly.

func (m *members) refNext() bool {
	return m.nextKey() && m.skip(valueEnd(m.b, m.val.from))
}

func (c *compiled) refCheck(data []byte, mode Mode, vs []Violation) (verdict, []Violation) {
	var v verdict
	et, ep, up := span{-1, -1}, span{-1, -1}, span{-1, -1}
	var rules *eventRules
	var drop []span
	n0 := len(vs)
	typed, epDone, upDone, dup := false, false, false, false
	m := objectAt(data, 0)
	for m.nextKey() {
		from, end := m.val.from, -1
		switch string(m.key.raw(data)) {
		case "event_type":
			dup = dup || et.from >= 0
			var w keyWords
			short := false
			if data[from] == '"' {
				end, _, w, short = keyAt(data, from)
			} else {
				end = valueEnd(data, from)
			}
			et = span{from, end}
			if !dup {
				rules, vs = c.typeRules(data, et, short, w, vs, &v)
				typed = true
			}
		case "event_properties":
			dup = dup || ep.from >= 0
			if typed && !dup {
				end, vs, drop = c.refProps(data, from, rules, vs, drop, &v)
				epDone = true
			}
			if end < 0 {
				end = valueEnd(data, from)
			}
			ep = span{from, end}
		case "user_properties":
			dup = dup || up.from >= 0
			if typed && (epDone || rules == nil) && !dup {
				end, vs, drop = c.refUserProps(data, from, vs, drop, &v)
				upDone = true
			}
			if end < 0 {
				end = valueEnd(data, from)
			}
			up = span{from, end}
		default:
			end = valueEnd(data, from)
		}
		if !m.skip(end) {
			break
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
		_, vs, drop = c.refProps(data, ep.from, rules, vs, drop, &v)
	}
	if !upDone {
		_, vs, drop = c.refUserProps(data, up.from, vs, drop, &v)
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

func (c *compiled) refProps(b []byte, from int, rules *eventRules, vs []Violation, drop []span, v *verdict) (int, []Violation, []span) {
	if rules == nil {
		return -1, vs, drop
	}
	seen := 0
	m := objectAt(b, from)
	for m.refNext() {
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
		vs = refMissing(b, from, rules, vs, v)
	}
	return end, vs, drop
}

func refMissing(b []byte, from int, rules *eventRules, vs []Violation, v *verdict) []Violation {
	for _, r := range rules.required {
		found := false
		m := objectAt(b, from)
		for m.refNext() {
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

func (c *compiled) refUserProps(b []byte, from int, vs []Violation, drop []span, v *verdict) (int, []Violation, []span) {
	m := objectAt(b, from)
	for m.nextKey() {
		op := m.key.raw(b)
		if len(op) == 0 || op[0] != '$' {
			if !m.skip(valueEnd(b, m.val.from)) {
				break
			}
			vs, drop = c.refUserProp(b, &m, true, vs, drop, v)
			continue
		}
		values := string(op) == "$set" || string(op) == "$setOnce"
		in := objectAt(b, m.val.from)
		for in.refNext() {
			vs, drop = c.refUserProp(b, &in, values, vs, drop, v)
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

func (c *compiled) refUserProp(b []byte, m *members, values bool, vs []Violation, drop []span, v *verdict) ([]Violation, []span) {
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

// agreeCases are records for the reference check: both plans' events,
// and each with whitespace, the fields' order, keys near the end, escapes
// and duplicates varied.
func agreeCases() []string {
	base := []string{
		`{"event_type":"Product Viewed","event_properties":{"product_id":"SKU-1","category":"garden","tags":["a","b"],"price":3.5,"in_stock":true},"user_properties":{"$set":{"plan":"pro"}}}`,
		`{"event_type":"Search","event_properties":{"page":{"a":1},"price":"3","x":1},"user_properties":{"$set":{"x":1},"$unset":{"age":"-"},"plan":"gold"}}`,
		`{"user_properties":{"w":1},"event_type":"Product Viewed","event_properties":{"x":1,"product_id":null}}`,
		`{"event_type":"Nope","event_properties":{"page":"/a"},"event_type":"Search","user_properties":{"age":[1]}}`,
		`{"event_type":"Search","event_properties":{"pa\u0067e":"/x"},"user_properties":{"$set":{"a\u0067e":1}}}`,
		`{"event_typ\u0065":"Search","event_properties":{"x":1}}`,
		`{"a_key_longer_than_sixteen":"v\"q","event_type":"$identify","user_properties":{"plan":"free","nope":2}}`,
		`{"event_properties":{"x":1},"event_type":"Search","event_properties":{"page":"/a","y":null},"user_properties":{"w":1},"user_properties":{"age":"3"}}`,
		`{"event_type":"Search","event_properties":{"price":1e3,"page":"\\","zz":[{"event_type":"x"}]},"event_type":"Search"}`,
		`{}`, `[]`, `"x"`, `{"event_type":null}`, `{"event_type":1,"event_properties":[]}`, `{"event_type":"Search","event_properties":{}}`,
	}
	for i := range 40 {
		base = append(base, benchtest.SDKEvent(i))
	}
	var out []string
	for _, s := range base {
		out = append(out, s,
			strings.ReplaceAll(s, ",", " ,\n\t"),
			strings.ReplaceAll(strings.ReplaceAll(s, ":", " : "), "{", "{ "),
			strings.Replace(s, `"event_type"`, `"insert_id":"5b3c2d1e-0a9f-4e8d-9c7b-6a5f4e3d2c1b","time":1795682223335,"event_type"`, 1),
			strings.Replace(s, `{`, `{"event_properties":{"early":1},`, 1),
			s[:len(s)-1]+`,"end":"x"}`, s[:len(s)-1]+`,"e":1}`)
	}
	return out
}

func TestCheckAgreesWithReference(t *testing.T) {
	for _, p := range []*Plan{testPlan(), benchPlan()} {
		c, err := compile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range agreeCases() {
			agree(t, c, []byte(s))
		}
	}
}

func agree(t *testing.T, c *compiled, b []byte) {
	t.Helper()
	for _, m := range []Mode{Observe, Filter, Block} {
		v, vs := c.check(b, m, nil)
		rv, rvs := c.refCheck(b, m, nil)
		v.keybuf, rv.keybuf = nil, nil
		if !reflect.DeepEqual(v, rv) || !reflect.DeepEqual(vs, rvs) {
			t.Fatalf("%v of %s:\n got %+v %v\nwant %+v %v", m, b, v, vs, rv, rvs)
		}
	}
}

func FuzzCheckAgrees(f *testing.F) {
	for _, s := range agreeCases() {
		f.Add([]byte(s))
	}
	c, err := compile(testPlan())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if json.Valid(b) {
			agree(t, c, b)
		}
	})
}
