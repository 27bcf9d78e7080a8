package plan

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/svcrelay/relay/internal/event"
)

// Mode is how a project's events are checked against its plan.
type Mode uint8

// Modes, by the contract's --tracking-plan.
const (
	// Off: nothing is checked.
	Off Mode = iota
	// Observe: every event is delivered unchanged; violations are counted.
	Observe
	// Filter: unplanned event and user properties are removed, the rest is
	// delivered; an unplanned event type is quarantined.
	Filter
	// Block: an event with any violation is quarantined.
	Block
)

var modeNames = [...]string{"off", "observe", "filter", "block"}

func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", m)
}

// ParseMode reads a mode name; "" is Off.
func ParseMode(s string) (Mode, error) {
	if s == "" {
		return Off, nil
	}
	for i, n := range modeNames {
		if s == n {
			return Mode(i), nil
		}
	}
	return Off, fmt.Errorf("tracking plan mode %q: want off, observe, filter or block", s)
}

// Property is one planned property, as the taxonomy API describes it.
type Property struct {
	Name string `json:"name"`
	// Type is string, number, boolean, enum or any ("" means any).
	Type  string `json:"type,omitempty"`
	Regex string `json:"regex,omitempty"`
	// Enum holds the allowed values (enum_values split at commas).
	Enum     []string `json:"enum,omitempty"`
	Array    bool     `json:"is_array_type,omitempty"`
	Required bool     `json:"is_required,omitempty"`
}

// Plan is a project's tracking plan: what the taxonomy API answered.
type Plan struct {
	// EventTypes are the planned event types.
	EventTypes []string `json:"event_types"`
	// Shared are the shared event properties: planned on every event type.
	Shared []Property `json:"shared_properties"`
	// Overrides are the event-type-specific properties by event type; one
	// replaces the shared property of its name on that event type.
	Overrides map[string][]Property `json:"event_properties"`
	// UserProperties are the planned user properties (without "gp:").
	UserProperties []Property `json:"user_properties"`
}

// Violation kinds, the values of relay_plan_violations_total's kind label.
const (
	UnplannedEventType     = "unplanned_event_type"
	UnplannedEventProperty = "unplanned_event_property"
	UnplannedUserProperty  = "unplanned_user_property"
	RequiredMissing        = "required_missing"
	WrongType              = "wrong_type"
	NotInEnum              = "not_in_enum"
	RegexMismatch          = "regex_mismatch"
	ArrayMismatch          = "array_mismatch"
)

// Kinds lists every violation kind.
var Kinds = []string{UnplannedEventType, UnplannedEventProperty, UnplannedUserProperty, RequiredMissing,
	WrongType, NotInEnum, RegexMismatch, ArrayMismatch}

// Violation is one way an event breaks its plan.
type Violation struct {
	Kind string `json:"kind"`
	// Property names the property ("" for the event type); user
	// properties are prefixed "user:".
	Property string `json:"property,omitempty"`
}

// rule is a compiled Property.
type rule struct {
	name     string
	typ      uint8
	array    bool
	required bool
	// re checks the value when it is not simple (else match does).
	re    *regexp.Regexp
	match matcher
	enum  map[string]struct{}
	// plain: the classes of values that pass (see plain).
	plain uint8
}

// Value types of a rule.
const (
	tAny uint8 = iota
	tString
	tNumber
	tBoolean
	tEnum
)

var typeNames = map[string]uint8{"string": tString, "number": tNumber, "boolean": tBoolean, "enum": tEnum}

// compiled is a Plan made for fast checks: a map of rules per event type
// (the shared ones merged with its overrides), so that a property is one
// lookup: in a perfect hash table of the short names by the key's words
// (keys.go: it also saves the key's second read, ~11% of the check), else
// in the map.
type compiled struct {
	events     map[string]*eventRules
	eventTable keyTable[eventRules] // events' short names
	users      map[string]*rule
	userTable  keyTable[rule] // users' short names
	// tag names the plan by its content (verdict.go).
	tag uint64
	// clean is the method value of cleanAt, made once (Vet hands it out).
	clean func(*event.Request, *event.Event) bool
}

type eventRules struct {
	props    map[string]*rule
	table    keyTable[rule] // props' short names
	required []*rule
}

func compileProp(p Property) (*rule, error) {
	r := &rule{name: p.Name, array: p.Array, required: p.Required}
	// A type the document does not name is any (tAny, the zero value),
	// rather than quarantining every event for a newer upstream's type.
	r.typ = typeNames[strings.ToLower(p.Type)]
	if p.Regex != "" {
		// The plan's pattern describes the whole value.
		re, err := regexp.Compile(`^(?:` + p.Regex + `)$`)
		if err != nil {
			return nil, fmt.Errorf("property %q: regex: %w", p.Name, err)
		}
		if m, ok := simple(p.Regex); ok {
			r.match = m
		} else {
			r.re = re
		}
	}
	if len(p.Enum) > 0 {
		r.enum = make(map[string]struct{}, len(p.Enum))
		for _, v := range p.Enum {
			r.enum[v] = struct{}{}
		}
	}
	r.plain = plain(r)
	return r, nil
}

// compile makes the checker of p. A property whose regex does not compile
// is an error: the plan is refused whole (the cached one stays).
func compile(p *Plan) (*compiled, error) {
	shared := make([]*rule, 0, len(p.Shared))
	for _, sp := range p.Shared {
		r, err := compileProp(sp)
		if err != nil {
			return nil, err
		}
		shared = append(shared, r)
	}
	c := &compiled{events: make(map[string]*eventRules, len(p.EventTypes)), users: make(map[string]*rule, len(p.UserProperties))}
	for _, et := range p.EventTypes {
		all := slices.Clone(shared)
		for _, op := range p.Overrides[et] {
			r, err := compileProp(op)
			if err != nil {
				return nil, fmt.Errorf("event type %q: %w", et, err)
			}
			all = append(all, r)
		}
		er := &eventRules{props: make(map[string]*rule, len(all))}
		for _, r := range all { // an override replaces the shared rule of its name
			er.props[r.name] = r
		}
		// In the plan's order, so that missing ones are reported in it.
		for _, r := range all {
			if er.props[r.name] == r && r.required {
				er.required = append(er.required, r)
			}
		}
		er.table = newKeyTable(er.props)
		c.events[et] = er
	}
	for _, up := range p.UserProperties {
		r, err := compileProp(up)
		if err != nil {
			return nil, fmt.Errorf("user %w", err)
		}
		c.users[r.name] = r
	}
	c.userTable = newKeyTable(c.users)
	c.eventTable = newKeyTable(c.events)
	c.tag = planTag(p)
	c.clean = c.cleanAt
	return c, nil
}
