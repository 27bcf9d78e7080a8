package plan

import (
	"encoding/binary"
	"encoding/json"
	"hash/fnv"

	"github.com/svcrelay/relay/internal/credentials"
)

// Verdicts. The ingest's strict parser has just read each event when it
// writes its record, so the ingest checks it there, in the cache (Vet),
// and leaves a verdict with the record: "clean against plan P in mode M".
// Delivery, where the decision is made, skips its own check only when the
// verdict names the plan and mode in force (Check); any other record (none,
// an older relay's, another plan's or mode's, or a violating event) is
// checked in full there as before. So a new plan or mode still applies to
// the backlog, violations are counted and quarantined at delivery only,
// and nothing is refused at ingest for the plan.
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
// clean event gets and the function that tells a clean event (data: the
// record as spooled), or 0 and nil when they are not checked (no project
// has the key, its mode is off, or its plan was never read). Both are of
// the same plan. It costs a few loads per request when no project is
// checked, and allocates nothing.
func (e *Enforcer) Vet(apiKey []byte) (verdict uint64, clean func(data []byte) bool) {
	store, live := e.creds.Load(), e.live.Load()
	ix := e.vets.Load()
	if ix == nil || ix.store != store || ix.live != live {
		ix = e.vetIndex(store, live)
	}
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
