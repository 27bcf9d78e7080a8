package plan

import (
	"encoding/binary"
	"encoding/json"
	"hash/fnv"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/event"
)

// Verdicts (doc.go, "Modes and the check"): the ingest marks an event it
// found clean "clean against plan P in mode M" (Vet), and delivery skips
// its check only for the plan and mode in force (Check).
//
// P is a hash of the plan's canonical form (its JSON, as kept in Dir) and
// of checkRules, so that a verdict holds across a restart and on every
// relay that read the same plan, and not across a change to the check's
// own rules. A verdict is the hash with its two low bits replaced by the
// mode (never Off, so never zero: zero is "no verdict").

// checkRules is the version of what check considers a violation: change
// it with the rules, so that records marked clean by an older relay are
// checked again.
const checkRules = 1

// planTag is p's tag: the FNV-1a hash of checkRules and p's JSON.
func planTag(p *Plan) uint64 {
	raw, err := json.Marshal(p)
	if err != nil { // cannot happen for a Plan; no tag: nothing is marked
		return 0
	}
	h := fnv.New64a()
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], checkRules)
	h.Write(v[:])
	h.Write(raw)
	return h.Sum64()
}

// verdictOf is the verdict of an event clean against the plan tagged tag
// in mode m (not Off).
func verdictOf(tag uint64, m Mode) uint64 { return tag&^3 | uint64(m&3) }

// isClean reports whether data breaks none of c's rules (whatever the
// mode: a clean event is delivered unchanged in every mode). It allocates
// only for a violation.
func (c *compiled) isClean(data []byte) bool {
	_, vs := c.check(data, Observe, nil)
	return len(vs) == 0
}

// cleanAt is isClean for an event the ingest's parser has just read
// (req, e): it found the keys of event_type, event_properties and
// user_properties (event.Event.PlanKeys) and, when asked
// (Request.PlanMembers), the property objects' members
// (Request.PropMembers), so that only the members' keys and values are
// read again, not the event. An event whose keys are not as the check
// reads them (one given twice, or escaped: the check matches a key only as
// it is written) is checked in full.
func (c *compiled) cleanAt(req *event.Request, e *event.Event) bool {
	raw, keys := e.Raw, e.PlanKeys()
	et, ok0 := memberAt(raw, keys[0], "event_type")
	ep, ok1 := memberAt(raw, keys[1], "event_properties")
	up, ok2 := memberAt(raw, keys[2], "user_properties")
	if !ok0 || !ok1 || !ok2 {
		return c.isClean(raw)
	}
	var v verdict
	var vs []Violation
	ets := span{-1, -1}
	var w keyWords
	short := false
	if et >= 0 && raw[et] == '"' {
		ets.from = et
		ets.to, _, w, short = keyAt(raw, et)
	} else if et >= 0 {
		ets = span{et, valueEnd(raw, et)}
	}
	rules, vs := c.typeRules(raw, ets, short, w, vs, &v)
	if len(vs) > 0 {
		return false
	}
	if ms, ok := req.PropMembers(e, 0); ok {
		if !c.propsClean(raw, ms, rules, &v) {
			return false
		}
	} else if _, vs, _ = c.props(raw, ep, rules, vs, nil, &v); len(vs) > 0 {
		return false
	}
	if ms, ok := req.PropMembers(e, 1); ok {
		return c.userPropsClean(raw, ms, &v)
	}
	_, vs, _ = c.userProps(raw, up, vs, nil, &v)
	return len(vs) == 0
}

// ruleOf is the rule of m's key in t or rules: rulesFor's lookup, from
// the key's words when the parser read them.
func ruleOf(raw []byte, m *event.Member, t *keyTable[rule], rules map[string]*rule, buf *[]byte) *rule {
	if m.Short > 0 && len(t.slots) > 0 {
		if r := t.lookup(keyWords{m.Lo, m.Hi}); r != nil {
			return r
		}
	}
	k := int(m.Key)
	ms := members{b: raw}
	var end int
	if end, ms.esc, ms.words, ms.short = keyAt(raw, k); end < 0 {
		return nil
	}
	ms.key = span{k, end}
	return rulesFor(t, rules, &ms, buf)
}

// propsClean is props on the recorded members ms: whether they break none
// of rules.
func (c *compiled) propsClean(raw []byte, ms []event.Member, rules *eventRules, v *verdict) bool {
	seen := 0
	for i := range ms {
		m := &ms[i]
		r := ruleOf(raw, m, &rules.table, rules.props, &v.keybuf)
		if r == nil {
			return false
		}
		val := span{int(m.From), int(m.To)}
		if r.required && !isNull(raw, val) {
			seen++
		}
		if !r.passes(raw[val.from]) && len(r.check(raw, val, false, nil, v)) > 0 {
			return false
		}
	}
	return seen >= len(rules.required)
}

// userPropsClean is userProps on the recorded members ms.
func (c *compiled) userPropsClean(raw []byte, ms []event.Member, v *verdict) bool {
	for i := range ms {
		m := &ms[i]
		k := int(m.Key)
		if raw[k+1] != '$' {
			r := ruleOf(raw, m, &c.userTable, c.users, &v.keybuf)
			if r == nil || !r.passes(raw[m.From]) && len(r.check(raw, span{int(m.From), int(m.To)}, true, nil, v)) > 0 {
				return false
			}
			continue
		}
		// An operation ($set, $add, ...), as userProps reads it.
		end, _ := event.ScanString(raw, k)
		op := span{k, end}.raw(raw)
		values := string(op) == "$set" || string(op) == "$setOnce"
		var vs []Violation
		in := objectAt(raw, int(m.From))
		for in.next() {
			vs, _ = c.userProp(raw, &in, values, vs, nil, v)
		}
		if len(vs) > 0 {
			return false
		}
	}
	return true
}

// memberAt is the index of the value of the member whose key, name, is at
// raw[k] (-1 when k is 0: no such member); false when the key is not
// there as written (k < 0: more than one).
func memberAt(raw []byte, k int32, name string) (int, bool) {
	if k == 0 {
		return -1, true
	}
	// The parser found a key spelling name at k: it is written as name
	// when it ends where name would (an escape lengthens it, and name has
	// no quote).
	i := int(k) + len(name) + 2
	if k < 0 || i > len(raw) || raw[i-1] != '"' {
		return -1, false
	}
	i = event.SkipWS(raw, i)
	if i >= len(raw) || raw[i] != ':' {
		return -1, false
	}
	return event.SkipWS(raw, i+1), true
}

// vetIndex is what Vet looks up: the projects of a credentials file in a
// mode other than off, by api key, for the mode default in force.
type vetIndex struct {
	store *credentials.Store
	live  *Live
	by    map[string]vetTarget // nil when no project is checked
}

type vetTarget struct {
	st *state
	m  Mode
}

// Vet returns, for the events of a request with apiKey, the verdict a
// clean event gets and the function that tells a clean event (one of a
// request as parsed, with PlanMembers: the ingest's rewrites touch no
// member the check reads), or 0 and nil when they are not checked (no project
// has the key, its mode is off, or its plan was never read). Both are of
// the same plan. It costs a few loads per request when no project is
// checked, and allocates nothing.
func (e *Enforcer) Vet(apiKey []byte) (verdict uint64, clean func(*event.Request, *event.Event) bool) {
	ix := e.index()
	if ix.by == nil {
		return 0, nil
	}
	t, ok := ix.by[string(apiKey)]
	if !ok {
		return 0, nil
	}
	cur := t.st.cur.Load()
	if cur == nil || cur.c.tag == 0 {
		return 0, nil
	}
	return verdictOf(cur.c.tag, t.m), cur.c.clean
}

// Checking reports whether Vet may check some request's events: the ingest
// then has its parser record what the check reads (event.Request's
// PlanMembers), which it spares itself otherwise.
func (e *Enforcer) Checking() bool { return e.index().by != nil }

// index is the vetIndex of the credentials and modes in force.
func (e *Enforcer) index() *vetIndex {
	store, live := e.creds.Load(), e.live.Load()
	if ix := e.vets.Load(); ix != nil && ix.store == store && ix.live == live {
		return ix
	}
	return e.vetIndex(store, live)
}

// vetIndex builds and keeps the index of store under live.
func (e *Enforcer) vetIndex(store *credentials.Store, live *Live) *vetIndex {
	ix := &vetIndex{store: store, live: live}
	for _, p := range store.Projects() {
		if m := e.mode(p); m != Off {
			if ix.by == nil {
				ix.by = map[string]vetTarget{}
			}
			ix.by[p.APIKey.Reveal()] = vetTarget{st: e.state(p.Name), m: m}
		}
	}
	e.vets.Store(ix)
	return ix
}
