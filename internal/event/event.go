package event

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"unicode/utf8"
)

// Request is one parsed ingest envelope. Reuse it across calls to Parse.
type Request struct {
	// APIKey is the envelope's api_key, unescaped.
	APIKey []byte
	// Options is the canonical JSON of the envelope's "options" object (see
	// canonicalOptions: keys sorted, compact, min_id_length normalized), or
	// nil when absent or saying nothing. Requests with equal Options share a
	// lane; it is what delivery sends.
	Options []byte
	// MinIDLength is options.min_id_length, or DefaultMinIDLength.
	MinIDLength int
	// Events holds one entry per element of "events", in order.
	Events []Event
	// PlanMembers, set by the caller (Parse leaves it), makes Parse
	// record the members of each event's event_properties and
	// user_properties for a tracking plan's check (PropMembers).
	PlanMembers bool

	// scratch holds the unescaped values of escaped ids and api_key.
	scratch []byte
	// tmp is room to unescape one id of a dropped event.
	tmp []byte
	// dropped are the ids of events dropped while scanning whose
	// errors depend on min_id_length.
	dropped []droppedIDs
	// members are the recorded members (PlanMembers) of all events.
	members []Member
	// opts holds Options; optsOf is the options object opts was made from
	// when it had keys other than min_id_length (a sender sends the same
	// options in every request: they are canonicalized once per Request).
	opts, optsOf []byte
	// sk lives here rather than in parser so that Parse does not clear its
	// 1.25 KiB nesting stack each time: skipValue reads only levels it
	// has written.
	sk skipper
}

// droppedIDs is what an event dropped while scanning still needs for the
// min_id_length rule: the rune counts of its ids (-1: absent).
type droppedIDs struct{ idx, user, dev int }

// DefaultMinIDLength is the upstream's minimum user_id/device_id length.
const DefaultMinIDLength = 5

// MaxMinIDLength is the largest options.min_id_length Parse takes (the
// largest int32); a larger one is refused as an invalid request body.
const MaxMinIDLength = 1<<31 - 1

// Event is one event object of a Request. Its slices alias the request body.
type Event struct {
	// Raw is the event object's bytes, from '{' to '}' inclusive.
	Raw []byte
	// DeviceID and UserID are the unescaped ids, nil when absent or shorter
	// than the request's MinIDLength (the upstream removes such ids).
	DeviceID, UserID []byte
	// HasInsertID and HasTime report whether insert_id / time are present.
	HasInsertID, HasTime bool

	flags   uint16
	invalid uint64 // bit f: field f has an invalid value
	// Offsets in Raw (0 means none, since Raw[0] is '{'): the value of a null
	// insert_id or time, and the string token of an ip equal to "$remote".
	insNull, timeNull, ipOff, ipEnd int
	idx                             int // index in the events array
	// planKeys: see PlanKeys.
	planKeys [3]int32
	// planMembers: where Request.members holds the members of the
	// event's event_properties and user_properties, from+1 and to (0, 0:
	// not recorded).
	planMembers [2][2]int32
}

// Member is a member of a property object: the offsets in Event.Raw of
// its key's opening quote, of its value's first byte and past its value;
// for a key of at most 16 bytes without escapes, its length + 1 (Short;
// 0: not such a key) and its bytes in two zero-padded little-endian words.
type Member struct {
	Key, From, To, Short int32
	Lo, Hi               uint64
}

// PropMembers returns the members of e's event_properties (k 0) or
// user_properties (k 1), in order, as Parse recorded them (PlanMembers);
// ok is false when it did not (not asked, absent, not an object, or given
// twice).
func (r *Request) PropMembers(e *Event, k int) (m []Member, ok bool) {
	span := e.planMembers[k]
	if span[0] == 0 || e.planKeys[k+1] <= 0 {
		return nil, false
	}
	return r.members[span[0]-1 : span[1]], true
}

// PlanKeys returns the offsets in Raw of the keys of event_type,
// event_properties and user_properties, the members a tracking plan
// checks (internal/plan): 0 when the event has none, -1 when it has more
// than one (an escaped key counts as the name it spells).
func (e *Event) PlanKeys() [3]int32 { return e.planKeys }

// planKey records that the key of plan member k is at off in Raw.
func (e *Event) planKey(k, off int) {
	if e.planKeys[k] != 0 {
		e.planKeys[k] = -1
		return
	}
	e.planKeys[k] = int32(off)
}

// Event.flags bits.
const (
	evNonEmpty  = 1 << iota // the object has at least one member
	evHasType               // event_type is a non-empty string
	evUserEsc               // UserID is still the escaped string content
	evDevEsc                // DeviceID is still the escaped string content
	evUserShort             // user_id was removed for min_id_length
	evDevShort              // device_id was removed for min_id_length
	evIPGiven               // some ip member is a string other than "$remote"
)

// Prefixes of OrderKey: the device id and user id spaces are kept apart.
const (
	DeviceKeyPrefix = "d:"
	UserKeyPrefix   = "u:"
)

// OrderKey returns the key under which the upstream orders and rate limits
// this event: the device id, else the user id (prefixed so the two spaces
// cannot collide). Events with the same OrderKey must be delivered in order.
//
// The key is DeviceKeyPrefix+DeviceID when the event has a device id, else
// UserKeyPrefix+UserID, appended to dst. An event of an accepted Request
// always has one of them.
func (e *Event) OrderKey(dst []byte) []byte {
	if e.DeviceID != nil {
		return append(append(dst, DeviceKeyPrefix...), e.DeviceID...)
	}
	if e.UserID != nil {
		return append(append(dst, UserKeyPrefix...), e.UserID...)
	}
	return dst
}

// Parse parses and validates body into req (which is reset first). A nil
// *Error means every event is acceptable to the upstream.
//
// The checks, in the order that decides which single error is returned:
//  1. empty body, or JSON whitespace (space, tab, CR, LF) only: "Missing
//     request body";
//  2. body not valid JSON (as json.Valid decides) or not an object, or
//     options present but neither null nor an object, or
//     options.min_id_length present but neither null nor an integer in
//     0..MaxMinIDLength: "Invalid JSON request body";
//  3. api_key absent, null or "": "Request missing required field" with
//     missing_field "api_key"; api_key of another type: "Invalid API key";
//  4. events absent, null or an empty array: "Request missing required
//     field" with missing_field "events";
//  5. events of another type than array, or an element of events that is
//     not an object: "Invalid event JSON";
//  6. per event field errors (see Error), with the index of the first event
//     per field.
//
// Duplicate keys: the last one counts, as with encoding/json. A null value
// of an optional event field counts as absent.
//
// When Parse returns an error, the contents of req are unspecified (Events
// in particular is incomplete: events found bad while scanning are not kept).
func Parse(body []byte, req *Request) *Error {
	req.APIKey = nil
	req.Options = nil
	req.MinIDLength = DefaultMinIDLength
	req.Events = req.Events[:0]
	req.scratch = req.scratch[:0]
	req.dropped = req.dropped[:0]
	req.members = req.members[:0]
	if SkipWS(body, 0) == len(body) {
		return newError(msgMissingBody)
	}
	p := parser{b: body, req: req, sk: &req.sk}
	if !p.envelope() {
		req.Events = req.Events[:0]
		return newError(msgInvalidJSON)
	}
	return p.finalize()
}

// parser is the state of one Parse.
type parser struct {
	b   []byte
	req *Request
	sk  *skipper

	apiKey     []byte // api_key string content, nil when absent, null or ""
	apiKeyEsc  bool
	apiKeyBad  bool // api_key is neither a string nor null
	events     bool // events is an array
	eventsBad  bool // events is neither an array nor null
	badEvent   bool // an element of events is not an object
	optionsBad bool
	optRaw     []byte // the options object as sent, nil when absent or null
	optOther   bool   // options has a key other than min_id_length
	n          int    // elements of events seen so far

	// Per-event errors: for each field, 1 + the index of the first event
	// with an invalid value / with the field missing (0: none).
	badAt     [numFields]int
	missingAt [3]int // event_type, user_id, device_id
	anyErr    bool
}

// envelope scans the whole body; false means invalid JSON (or an envelope
// that is not an object).
func (p *parser) envelope() bool {
	b := p.b
	i := SkipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	var buf [6 * len("api_key")]byte // every character may be a \uXXXX
	i, more := first(b, i, '}')
	for ; more; i, more = next(b, i, '}') {
		var key []byte
		if key, i = memberKey(b, i, buf[:]); i < 0 {
			return false
		}
		switch string(key) {
		case "api_key":
			p.apiKey, p.apiKeyEsc, p.apiKeyBad = nil, false, false
			switch b[i] {
			case '"':
				s := i
				if i, p.apiKeyEsc = ScanString(b, i); i < 0 {
					return false
				}
				if i-s > 2 {
					p.apiKey = b[s+1 : i-1]
				}
			case 'n':
				i = scanLiteral(b, i)
			default:
				p.apiKeyBad = true
				i, _ = p.sk.skipValue(b, i, 1)
			}
		case "events":
			p.events, p.eventsBad, p.badEvent, p.n, p.anyErr = false, false, false, 0, false
			p.badAt, p.missingAt = [numFields]int{}, [3]int{}
			p.req.Events = p.req.Events[:0]
			p.req.dropped = p.req.dropped[:0]
			switch b[i] {
			case '[':
				p.events = true
				i = p.eventArray(i)
			case 'n':
				i = scanLiteral(b, i)
			default:
				p.eventsBad = true
				i, _ = p.sk.skipValue(b, i, 1)
			}
		case "options":
			p.optRaw, p.optOther, p.req.MinIDLength, p.optionsBad = nil, false, DefaultMinIDLength, false
			switch b[i] {
			case '{':
				s := i
				if i = p.options(i); i >= 0 {
					p.optRaw = b[s:i]
				}
			case 'n':
				i = scanLiteral(b, i)
			default:
				p.optionsBad = true
				i, _ = p.sk.skipValue(b, i, 1)
			}
		default:
			i, _ = p.sk.skipValue(b, i, 1)
		}
	}
	return i >= 0 && SkipWS(b, i) == len(b)
}

// options scans the options object at b[i] == '{' (depth 2 inside it).
func (p *parser) options(i int) int {
	b := p.b
	var buf [6 * len("min_id_length")]byte
	i, more := first(b, i, '}')
	for ; more; i, more = next(b, i, '}') {
		var key []byte
		if key, i = memberKey(b, i, buf[:]); i < 0 {
			return -1
		}
		if string(key) == "min_id_length" {
			p.req.MinIDLength, p.optionsBad = DefaultMinIDLength, false
			switch c := b[i]; {
			case c == 'n':
				i = scanLiteral(b, i)
			case c == '-' || ('0' <= c && c <= '9'):
				s := i
				var isInt bool
				if i, isInt = scanNumber(b, i); i < 0 {
					return -1
				}
				n := -1
				if isInt {
					n = parseNonNeg(b[s:i], MaxMinIDLength)
				}
				if n < 0 {
					p.optionsBad = true
				} else {
					p.req.MinIDLength = n
				}
			default:
				p.optionsBad = true
				i, _ = p.sk.skipValue(b, i, 2)
			}
		} else {
			p.optOther = true
			i, _ = p.sk.skipValue(b, i, 2)
		}
	}
	return i
}

// eventArray scans the events array at b[i] == '['.
func (p *parser) eventArray(i int) int {
	b := p.b
	i = SkipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1
	}
	for {
		if i >= len(b) {
			return -1
		}
		if b[i] == '{' {
			i = p.event(i)
		} else {
			p.badEvent = true
			i, _ = p.sk.skipValue(b, i, 2)
		}
		p.n++
		if i < 0 {
			return -1
		}
		if i = SkipWS(b, i); i >= len(b) {
			return -1
		}
		switch b[i] {
		case ',':
			i = SkipWS(b, i+1)
		case ']':
			return i + 1
		default:
			return -1
		}
	}
}

// event scans one event object at b[i] == '{' and appends it to req.Events.
func (p *parser) event(i int) int {
	b := p.b
	start := i
	evs := append(p.req.Events, Event{})
	p.req.Events = evs
	e := &evs[len(evs)-1]
	e.idx = p.n
	i = SkipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		p.done(e)
		return i + 1
	}
	e.flags |= evNonEmpty
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	for {
		// b[i] is the '"' of a member's key.
		key := i
		var f int
		if i, f = eventKey(b, i); i < 0 {
			return -1
		}
		if i+1 < len(b) && b[i] == ':' && b[i+1] > ' ' {
			i++ // compact JSON
		} else if i = colonWS(b, i); i < 0 {
			return -1
		}
		switch {
		case f < 0:
			i, _ = p.sk.skipValue(b, i, 3)
		case f > lastRecorded && fieldKinds[f] == kString && b[i] == '"':
			// The commonest member, spared typedValue's dispatch.
			i, _ = ScanString(b, i)
			e.setValid(f, true)
		case f > lastRecorded:
			if f <= fUserProps {
				e.planKey(f-fEventProps+1, key-start)
				if p.req.PlanMembers && b[i] == '{' {
					i = p.propMembers(e, f, i, start)
					break
				}
			}
			// Only the type of the value matters.
			var ok bool
			i, ok = p.typedValue(fieldKinds[f], i)
			e.setValid(f, ok)
		default:
			if f == fEventType {
				e.planKey(0, key-start)
			}
			i = p.recordedField(e, f, i, start)
		}
		if i < 0 {
			return -1
		}
		if i+1 < len(b) && b[i] == ',' && b[i+1] == '"' {
			i++ // compact JSON: the next member's key
			continue
		}
		if i = SkipWS(b, i); i >= len(b) {
			return -1
		}
		switch b[i] {
		case ',':
			if i = SkipWS(b, i+1); i >= len(b) || b[i] != '"' {
				return -1
			}
		case '}':
			i++
			e.Raw = b[start:i]
			p.done(e)
			return i
		default:
			return -1
		}
	}
}

// eventKey scans the key at b[i] == '"' of an event member and returns the
// index past it and the field it names (-1: none).
func eventKey(b []byte, i int) (end, f int) {
	// A key of at most 16 bytes without escapes, as event keys are, is
	// both found and matched from the two words that hold it: the stop test
	// of ScanString finds its end, and byWords its field. This saves a
	// second pass over the key (lookupField's) and a call.
	if i+2+shortFieldLen <= len(b) {
		w := b[i+1 : i+2+shortFieldLen]
		lo, hi := binary.LittleEndian.Uint64(w), binary.LittleEndian.Uint64(w[8:])
		n := shortFieldLen
		if m := StringStops(lo); m != 0 {
			n = bits.TrailingZeros64(m) >> 3
		} else if m := StringStops(hi); m != 0 {
			n = 8 + bits.TrailingZeros64(m)>>3
		}
		if w[n] == '"' {
			// Zero the bytes past the key.
			lo &= KeyMasks[n][0]
			hi &= KeyMasks[n][1]
			return i + n + 2, byWords.lookup(lo, hi)
		}
	}
	end, esc := ScanString(b, i)
	if end < 0 {
		return -1, -1
	}
	key := b[i+1 : end-1]
	if esc {
		var buf [6 * maxFieldLen]byte
		if len(key) > len(buf) {
			return end, -1
		}
		key = appendUnescaped(buf[:0], key)
	}
	return end, lookupField(key)
}

// done checks the last event, e, for errors that do not depend on
// options.min_id_length (which may come later in the body). An event with
// such an error is recorded and dropped from req.Events: the request is
// refused anyway, and dropping keeps the memory of a hostile body of many
// tiny bad events ({},{},...) bounded by the size of its acceptable-looking
// events (each at least `{"event_type":"e","user_id":"u"}`).
func (p *parser) done(e *Event) {
	missType := e.flags&evHasType == 0 && e.invalid&(1<<fEventType) == 0
	missID := e.UserID == nil && e.DeviceID == nil && e.invalid&(1<<fUserID|1<<fDeviceID) == 0
	if e.invalid == 0 && !missType && !missID {
		return
	}
	p.anyErr = true
	for m := e.invalid; m != 0; m &= m - 1 {
		if f := bits.TrailingZeros64(m); p.badAt[f] == 0 {
			p.badAt[f] = e.idx + 1
		}
	}
	if missType && p.missingAt[0] == 0 {
		p.missingAt[0] = e.idx + 1
	}
	if missID && p.missingAt[1] == 0 {
		p.missingAt[1], p.missingAt[2] = e.idx+1, e.idx+1
	}
	if !missID && e.invalid&(1<<fUserID|1<<fDeviceID) == 0 {
		// Well-typed ids: what finalize would do for a kept event.
		d := droppedIDs{idx: e.idx, user: -1, dev: -1}
		if e.DeviceID != nil {
			v := p.tmpValue(e.DeviceID, e.flags&evDevEsc != 0)
			d.dev = utf8.RuneCount(v)
			if allZero(v) {
				p.bad(fDeviceID, e.idx)
				d.dev = -2 // invalid: no min_id_length error for this event
			}
		}
		if e.UserID != nil {
			d.user = utf8.RuneCount(p.tmpValue(e.UserID, e.flags&evUserEsc != 0))
		}
		if d.dev != -2 {
			p.req.dropped = append(p.req.dropped, d)
		}
	}
	p.req.Events = p.req.Events[:len(p.req.Events)-1]
}

// tmpValue returns the value of string content s, unescaped into req.tmp
// when esc (valid until the next call).
func (p *parser) tmpValue(s []byte, esc bool) []byte {
	if !esc {
		return s
	}
	p.req.tmp = appendUnescaped(p.req.tmp[:0], s)
	return p.req.tmp
}

// recordedField scans the value at b[i] of the field f (at most
// lastRecorded) of e, whose object starts at b[start]. Each occurrence
// replaces what an earlier one of the same key recorded.
func (p *parser) recordedField(e *Event, f, i, start int) int {
	b := p.b
	var content []byte // a string's, when the field is a string
	end, esc, ok := 0, false, false
	if b[i] == '"' && fieldKinds[f] == kString { // all these fields but time
		if end, esc = ScanString(b, i); end < 0 {
			return -1
		}
		content = b[i+1 : end-1]
		e.setValid(f, true)
	} else if end, ok = p.typedValue(fieldKinds[f], i); end < 0 {
		return -1
	} else {
		e.setValid(f, ok)
	}
	switch f {
	case fUserID:
		e.UserID, e.flags = nil, e.flags&^evUserEsc
		if len(content) > 0 {
			e.UserID = content
			if esc {
				e.flags |= evUserEsc
			}
		}
	case fDeviceID:
		e.DeviceID, e.flags = nil, e.flags&^evDevEsc
		if len(content) > 0 {
			e.DeviceID = content
			if esc {
				e.flags |= evDevEsc
			}
		}
	case fEventType:
		e.flags &^= evHasType
		if len(content) > 0 {
			e.flags |= evHasType
		}
	case fInsertID:
		e.HasInsertID, e.insNull = b[i] != 'n', 0
		if !e.HasInsertID {
			e.insNull = i - start
		}
	case fTime:
		e.HasTime, e.timeNull = b[i] != 'n', 0
		if !e.HasTime {
			e.timeNull = i - start
		}
	case fIP:
		e.ipOff, e.ipEnd = 0, 0
		if isRemote(content, esc) {
			e.ipOff, e.ipEnd = i-start, end-start
		} else if content != nil {
			e.flags |= evIPGiven
		}
	}
	return end
}

// setValid records whether the value of field f is valid.
func (e *Event) setValid(f int, ok bool) {
	if ok {
		e.invalid &^= 1 << f
	} else {
		e.invalid |= 1 << f
	}
}

// typedValue scans the value at b[i] of an event field and reports whether
// it has the field's kind. null has every kind (a null field is absent).
func (p *parser) typedValue(kind uint8, i int) (end int, ok bool) {
	b := p.b
	switch c := b[i]; {
	case c == '"':
		end, _ = ScanString(b, i)
		return end, kind == kString
	case c == '{':
		end, deepest := p.sk.skipValue(b, i, 3)
		return end, kind == kObject || kind == kPropTree && deepest <= maxPropDepth
	case c == '-' || c-'0' <= 9:
		end, isInt := scanNumber(b, i)
		return end, kind == kNumber || kind == kInt && isInt && end >= 0 && fitsInt64(b[i:end])
	case c == 'n':
		return scanLiteral(b, i), true
	case c == 't' || c == 'f':
		return scanLiteral(b, i), kind == kBool
	default: // an array, or not JSON
		end, _ = p.sk.skipValue(b, i, 3)
		return end, false
	}
}

// propMembers is typedValue for the property object at b[i] == '{' of
// field f (event_properties or user_properties) of e, whose object starts
// at b[start], recording its members (Request.PlanMembers): what
// skipValue accepts, it accepts.
func (p *parser) propMembers(e *Event, f, i, start int) int {
	b := p.b
	from := len(p.req.members)
	deepest := 1
	if i = SkipWS(b, i+1); i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			if i >= len(b) || b[i] != '"' {
				return -1
			}
			m := Member{Key: int32(i - start)}
			if i+2+shortFieldLen <= len(b) {
				// The key's words, as eventKey reads them (the plan looks
				// the key up by them).
				w := b[i+1 : i+2+shortFieldLen]
				lo, hi := binary.LittleEndian.Uint64(w), binary.LittleEndian.Uint64(w[8:])
				n := shortFieldLen
				if s := StringStops(lo); s != 0 {
					n = bits.TrailingZeros64(s) >> 3
				} else if s := StringStops(hi); s != 0 {
					n = 8 + bits.TrailingZeros64(s)>>3
				}
				if w[n] == '"' {
					m.Short, m.Lo, m.Hi = int32(n+1), lo&KeyMasks[n][0], hi&KeyMasks[n][1]
					i += n + 2
				}
			}
			if m.Short == 0 {
				if i, _ = ScanString(b, i); i < 0 {
					return -1
				}
			}
			if i = colonWS(b, i); i < 0 {
				return -1
			}
			// The object is open inside the envelope, events and the event.
			end, d := p.sk.skipValue(b, i, 4)
			if end < 0 {
				return -1
			}
			deepest = max(deepest, d+1)
			m.From, m.To = int32(i-start), int32(end-start)
			p.req.members = append(p.req.members, m)
			if i = SkipWS(b, end); i >= len(b) {
				return -1
			}
			if b[i] == '}' {
				i++
				break
			}
			if b[i] != ',' {
				return -1
			}
			i = SkipWS(b, i+1)
		}
	}
	e.planMembers[f-fEventProps] = [2]int32{int32(from) + 1, int32(len(p.req.members))}
	e.setValid(f, deepest <= maxPropDepth)
	return i
}

// isRemote reports whether the string content s is "$remote".
func isRemote(s []byte, esc bool) bool {
	const remote = "$remote"
	if !esc {
		return string(s) == remote
	}
	var buf [6 * len(remote)]byte
	if len(s) > len(buf) {
		return false
	}
	return string(appendUnescaped(buf[:0], s)) == remote
}

// finalize applies the checks that need the whole body (api_key, events,
// options.min_id_length, which may come after events) and builds the error.
func (p *parser) finalize() *Error {
	req := p.req
	switch {
	case p.optionsBad:
		return newError(msgInvalidJSON)
	case p.apiKeyBad:
		return newError(msgInvalidAPIKey)
	case p.apiKey == nil:
		return newMissingField("api_key")
	case apiKeyTooLong(p.apiKey, p.apiKeyEsc):
		return newError(msgInvalidAPIKey)
	case p.eventsBad:
		return newError(msgInvalidEvent)
	case !p.events || p.n == 0:
		return newMissingField("events")
	case p.badEvent:
		return newError(msgInvalidEvent)
	}

	// Unescaped values are never longer than their escaped form, so one
	// growth up front keeps every slice into scratch valid.
	need := 0
	if p.apiKeyEsc {
		need += len(p.apiKey)
	}
	for i := range req.Events {
		e := &req.Events[i]
		if e.flags&evUserEsc != 0 {
			need += len(e.UserID)
		}
		if e.flags&evDevEsc != 0 {
			need += len(e.DeviceID)
		}
	}
	if cap(req.scratch) < need {
		req.scratch = make([]byte, 0, need)
	}
	req.APIKey = p.apiKey
	if p.apiKeyEsc {
		req.APIKey = p.unescape(p.apiKey)
	}
	if p.optRaw != nil {
		if !p.optOther || !bytes.Equal(p.optRaw, req.optsOf) {
			req.opts = canonicalOptions(req.opts[:0], p.optRaw, req.MinIDLength, !p.optOther)
			req.optsOf = req.optsOf[:0]
			if p.optOther {
				req.optsOf = append(req.optsOf, p.optRaw...)
			}
		}
		if len(req.opts) > 0 {
			req.Options = req.opts
		}
	}

	minLen := req.MinIDLength
	for i := range req.Events {
		e := &req.Events[i]
		if e.flags&evUserEsc != 0 {
			e.UserID = p.unescape(e.UserID)
		}
		if e.flags&evDevEsc != 0 {
			e.DeviceID = p.unescape(e.DeviceID)
		}
		if e.DeviceID != nil && allZero(e.DeviceID) {
			p.bad(fDeviceID, e.idx)
			continue
		}
		if e.DeviceID != nil && shorter(e.DeviceID, minLen) {
			e.DeviceID = nil
			e.flags |= evDevShort
		}
		if e.UserID != nil && shorter(e.UserID, minLen) {
			e.UserID = nil
			e.flags |= evUserShort
		}
		// done() kept only events with an id present, so losing both can
		// only be min_id_length's doing.
		if e.DeviceID == nil && e.UserID == nil {
			if e.flags&evUserShort != 0 {
				p.bad(fUserID, e.idx)
			}
			if e.flags&evDevShort != 0 {
				p.bad(fDeviceID, e.idx)
			}
		}
	}
	for _, d := range req.dropped {
		devShort := d.dev >= 0 && d.dev < minLen
		userShort := d.user >= 0 && d.user < minLen
		if (d.dev < 0 || devShort) && (d.user < 0 || userShort) {
			if userShort {
				p.bad(fUserID, d.idx)
			}
			if devShort {
				p.bad(fDeviceID, d.idx)
			}
		}
	}
	if !p.anyErr {
		return nil
	}
	err := &Error{Status: 400, Msg: msgMissingField}
	for f, at := range p.badAt {
		if at != 0 {
			if err.InvalidFields == nil {
				err.Msg = msgInvalidFields
				err.InvalidFields = make(map[string][]int)
			}
			err.InvalidFields[fieldNames[f]] = []int{at - 1}
		}
	}
	for k, f := range [3]int{fEventType, fUserID, fDeviceID} {
		if at := p.missingAt[k]; at != 0 {
			if err.MissingFields == nil {
				err.MissingFields = make(map[string][]int)
			}
			err.MissingFields[fieldNames[f]] = []int{at - 1}
		}
	}
	return err
}

// bad records that event idx has an invalid field f.
func (p *parser) bad(f, idx int) {
	p.anyErr = true
	if at := p.badAt[f]; at == 0 || at > idx+1 {
		p.badAt[f] = idx + 1
	}
}

// unescape appends the value of the escaped content s to req.scratch (which
// has room for it) and returns it.
func (p *parser) unescape(s []byte) []byte {
	n := len(p.req.scratch)
	p.req.scratch = appendUnescaped(p.req.scratch, s)
	return p.req.scratch[n:len(p.req.scratch):len(p.req.scratch)]
}

// allZero reports whether the device id id is made of '0' and '-' only
// (with at least one '0'), like "00000000-0000-0000-0000-000000000000".
func allZero(id []byte) bool {
	zero := false
	for _, c := range id {
		switch c {
		case '0':
			zero = true
		case '-':
		default:
			return false
		}
	}
	return zero
}

// shorter reports whether id has fewer than n characters (runes; an
// invalid UTF-8 byte counts as one, as it becomes one U+FFFD upstream).
func shorter(id []byte, n int) bool {
	if len(id) < n {
		return true
	}
	if len(id) >= n*utf8.UTFMax {
		return false
	}
	return utf8.RuneCount(id) < n
}

// AppendRewritten appends the event as the relay spools it: insert_id is
// added when absent (taken from ids), time is added as nowMS (the decimal
// text of the acceptance time in ms, formatted once per request) when
// absent, and an ip of "$remote" is replaced by remoteIP. All other bytes
// are copied unchanged.
//
// An absent field is added as the object's first member(s)
// (`{"insert_id":"<id>","time":<nowMS>,...`); a field whose (last) value is
// null has that null replaced in place, so that the upstream, which also
// takes the last of duplicate keys, sees the new value. remoteIP is written
// as a JSON string; when it is empty, "$remote" is left as it is.
func (e *Event) AppendRewritten(dst []byte, ids *IDGen, nowMS, remoteIP []byte) []byte {
	raw := e.Raw
	if len(raw) < 2 {
		return append(dst, raw...)
	}
	dst = append(dst, '{')
	addID := !e.HasInsertID && e.insNull == 0
	addTime := !e.HasTime && e.timeNull == 0
	if addID {
		dst = append(dst, `"insert_id":"`...)
		dst = ids.Append(dst)
		dst = append(dst, '"')
		if addTime {
			dst = append(dst, ',')
		}
	}
	if addTime {
		dst = append(dst, `"time":`...)
		dst = append(dst, nowMS...)
	}
	if (addID || addTime) && e.flags&evNonEmpty != 0 {
		dst = append(dst, ',')
	}

	// In-place replacements, in the order they occur in raw.
	type repl struct{ off, end, kind int }
	var rs [3]repl
	n := 0
	if !e.HasInsertID && e.insNull != 0 {
		rs[n] = repl{e.insNull, e.insNull + len("null"), fInsertID}
		n++
	}
	if !e.HasTime && e.timeNull != 0 {
		rs[n] = repl{e.timeNull, e.timeNull + len("null"), fTime}
		n++
	}
	if e.ipOff != 0 && len(remoteIP) > 0 {
		rs[n] = repl{e.ipOff, e.ipEnd, fIP}
		n++
	}
	for i := 1; i < n; i++ {
		for j := i; j > 0 && rs[j].off < rs[j-1].off; j-- {
			rs[j], rs[j-1] = rs[j-1], rs[j]
		}
	}
	pos := 1
	for _, r := range rs[:n] {
		dst = append(dst, raw[pos:r.off]...)
		switch r.kind {
		case fInsertID:
			dst = append(dst, '"')
			dst = ids.Append(dst)
			dst = append(dst, '"')
		case fTime:
			dst = append(dst, nowMS...)
		case fIP:
			dst = appendJSONString(dst, remoteIP)
		}
		pos = r.end
	}
	return append(dst, raw[pos:]...)
}
