package sim

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"unicode/utf8"
)

// Error texts of the upstream (document, Errors).
const (
	ErrTextInvalidPath    = "Invalid request path"
	ErrTextMissingBody    = "Missing request body"
	ErrTextInvalidJSON    = "Invalid JSON request body"
	ErrTextMissingField   = "Request missing required field"
	ErrTextInvalidEvent   = "Invalid event JSON"
	ErrTextInvalidAPIKey  = "Invalid API key"
	ErrTextInvalidFields  = "Invalid field values on some events"
	ErrTextSilenced       = "Some devices are silenced"
	ErrTextTooManyRequest = "Too many requests for some devices and users"
	ErrTextTooLarge       = "Payload too large"
)

// MaxPropertyDepth is the documented object depth limit of
// event_properties and user_properties.
const MaxPropertyDepth = 40

// jsonSpace is JSON's whitespace (RFC 8259): a body of only these is missing.
const jsonSpace = " \t\r\n"

type errBody struct {
	Code          int              `json:"code"`
	Error         string           `json:"error"`
	MissingField  string           `json:"missing_field,omitempty"`
	InvalidFields map[string][]int `json:"events_with_invalid_fields,omitempty"`
	MissingFields map[string][]int `json:"events_with_missing_fields,omitempty"`
}

// evInfo is what the sim needs of one valid event (ids after min_id_length;
// insertID "" when absent or not a string).
type evInfo struct {
	eventType, deviceID, userID, insertID string
}

type envelope struct {
	apiKey   string
	raw      []json.RawMessage
	info     []evInfo
	minIDLen int
}

type fieldKind int

const (
	kString fieldKind = iota + 1
	kNumber
	kInteger
	kBool
	kObject
)

// eventFields are the typed fields of the document's Event table.
var eventFields = map[string]fieldKind{
	"user_id": kString, "device_id": kString, "event_type": kString, "user_agent": kString,
	"time": kInteger, "event_properties": kObject, "user_properties": kObject, "groups": kObject,
	"group_properties": kObject, "$skip_user_properties_sync": kBool,
	"app_version": kString, "platform": kString, "os_name": kString, "os_version": kString,
	"device_brand": kString, "device_manufacturer": kString, "device_model": kString,
	"carrier": kString, "country": kString, "region": kString, "city": kString, "dma": kString,
	"language": kString, "price": kNumber, "quantity": kInteger, "revenue": kNumber,
	"productId": kString, "revenueType": kString, "currency": kString,
	"location_lat": kNumber, "location_lng": kNumber, "ip": kString, "idfa": kString,
	"idfv": kString, "android_app_set_id": kString, "adid": kString, "android_id": kString,
	"event_id": kInteger, "session_id": kInteger, "insert_id": kString, "plan": kObject,
}

// depthLimited are the fields whose nesting is limited to MaxPropertyDepth:
// only the two the Limits table names (group_properties is not limited).
var depthLimited = []string{"event_properties", "user_properties"}

// validate checks body by the document's rules (see doc.go for the order).
// Either the envelope or the error is nil. validKey, when not nil, says
// which api_keys are valid.
func validate(body []byte, validKey func(string) bool, maxEvents int) (*envelope, *errBody) {
	if body = bytes.Trim(body, jsonSpace); len(body) == 0 {
		return nil, &errBody{Code: 400, Error: ErrTextMissingBody}
	}
	var top map[string]json.RawMessage
	if body[0] != '{' || json.Unmarshal(body, &top) != nil {
		return nil, &errBody{Code: 400, Error: ErrTextInvalidJSON}
	}
	env := &envelope{minIDLen: 5}
	if opts, ok := top["options"]; ok && !isNull(opts) {
		var o map[string]json.RawMessage
		if opts[0] != '{' || json.Unmarshal(opts, &o) != nil {
			return nil, &errBody{Code: 400, Error: ErrTextInvalidJSON}
		}
		if m, ok := o["min_id_length"]; ok && !isNull(m) {
			var n int
			if kindOf(m) != kInteger || json.Unmarshal(m, &n) != nil || n < 0 || n > math.MaxInt32 { // a 32-bit int
				return nil, &errBody{Code: 400, Error: ErrTextInvalidJSON}
			}
			env.minIDLen = n
		}
	}
	key, ok := top["api_key"]
	if !ok || isNull(key) || string(key) == `""` {
		return nil, &errBody{Code: 400, Error: ErrTextMissingField, MissingField: "api_key"}
	}
	if kindOf(key) != kString || json.Unmarshal(key, &env.apiKey) != nil || (validKey != nil && !validKey(env.apiKey)) {
		return nil, &errBody{Code: 400, Error: ErrTextInvalidAPIKey}
	}
	evs, ok := top["events"]
	if !ok || isNull(evs) || (evs[0] == '[' && len(bytes.Trim(evs[1:len(evs)-1], jsonSpace)) == 0) { // [] holds none
		return nil, &errBody{Code: 400, Error: ErrTextMissingField, MissingField: "events"}
	}
	if evs[0] != '[' || json.Unmarshal(evs, &env.raw) != nil || len(env.raw) >= maxEvents {
		return nil, &errBody{Code: 400, Error: ErrTextInvalidEvent}
	}
	var invalid, missing map[string][]int
	mark := func(m *map[string][]int, field string, i int) {
		if *m == nil {
			*m = make(map[string][]int)
		}
		if _, seen := (*m)[field]; !seen {
			(*m)[field] = []int{i}
		}
	}
	env.info = make([]evInfo, len(env.raw))
	for i, raw := range env.raw {
		var ev map[string]json.RawMessage
		if raw[0] != '{' || json.Unmarshal(raw, &ev) != nil {
			return nil, &errBody{Code: 400, Error: ErrTextInvalidEvent}
		}
		info := &env.info[i]
		for name, v := range ev {
			want, known := eventFields[name]
			if !known || isNull(v) {
				continue
			}
			if !hasKind(v, want) {
				mark(&invalid, name, i)
			}
		}
		for _, name := range depthLimited {
			if v, ok := ev[name]; ok && kindOf(v) == kObject && depth(v) > MaxPropertyDepth {
				mark(&invalid, name, i)
			}
		}
		str := func(name string) (string, bool) {
			v, ok := ev[name]
			if !ok || kindOf(v) != kString {
				return "", false
			}
			var s string
			json.Unmarshal(v, &s)
			return s, true
		}
		if et, ok := str("event_type"); ok && et != "" {
			info.eventType = et
		} else if v, ok := ev["event_type"]; !ok || isNull(v) || kindOf(v) == kString {
			mark(&missing, "event_type", i)
		}
		dev, _ := str("device_id")
		uid, _ := str("user_id")
		badID := false
		if v, ok := ev["device_id"]; ok && !isNull(v) && (kindOf(v) != kString || allZero(dev)) {
			mark(&invalid, "device_id", i)
			badID = true
		}
		if v, ok := ev["user_id"]; ok && !isNull(v) && kindOf(v) != kString {
			badID = true
		}
		devShort := dev != "" && !allZero(dev) && utf8.RuneCountInString(dev) < env.minIDLen
		uidShort := uid != "" && utf8.RuneCountInString(uid) < env.minIDLen
		if devShort || allZero(dev) {
			dev = ""
		}
		if uidShort {
			uid = ""
		}
		switch {
		case dev != "" || uid != "" || badID:
		case devShort || uidShort:
			// min_id_length removed what the event had: those are invalid.
			if devShort {
				mark(&invalid, "device_id", i)
			}
			if uidShort {
				mark(&invalid, "user_id", i)
			}
		default:
			mark(&missing, "user_id", i)
			mark(&missing, "device_id", i)
		}
		info.deviceID, info.userID = dev, uid
		info.insertID, _ = str("insert_id")
	}
	if missing != nil || invalid != nil {
		e := &errBody{Code: 400, Error: ErrTextInvalidFields, InvalidFields: invalid, MissingFields: missing}
		if invalid == nil {
			e.Error = ErrTextMissingField
		}
		return nil, e
	}
	return env, nil
}

func isNull(v json.RawMessage) bool { return string(v) == "null" }

// kindOf classifies a valid JSON value by its first byte (numbers as
// kInteger when they have no fraction or exponent). Arrays are 0.
func kindOf(v json.RawMessage) fieldKind {
	switch v[0] {
	case '"':
		return kString
	case '{':
		return kObject
	case 't', 'f':
		return kBool
	case '[', 'n':
		return 0
	}
	if bytes.ContainsAny(v, ".eE") {
		return kNumber
	}
	return kInteger
}

func hasKind(v json.RawMessage, want fieldKind) bool {
	k := kindOf(v)
	if want == kInteger && k == kInteger {
		_, err := strconv.ParseInt(string(v), 10, 64)
		return err == nil // integers must fit in 64 bits (time, session_id: long)
	}
	return k == want || (want == kNumber && k == kInteger)
}

// allZero reports an id made only of '0' and '-' with at least one '0'.
func allZero(s string) bool {
	zero := false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '0':
			zero = true
		case '-':
		default:
			return false
		}
	}
	return zero
}

// depth returns the nesting depth of a valid JSON value (objects and arrays
// count; a scalar is 0, {} is 1).
func depth(v []byte) int {
	d, deepest := 0, 0
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '"': // to the closing quote
			for i++; i < len(v) && v[i] != '"'; i++ {
				if v[i] == '\\' {
					i++
				}
			}
		case '{', '[':
			d++
			deepest = max(deepest, d)
		case '}', ']':
			d--
		}
	}
	return deepest
}

func appendJSON(dst []byte, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own types are marshalled
	}
	return append(dst, b...)
}
