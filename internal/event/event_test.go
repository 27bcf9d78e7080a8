package event

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// envelope wraps events in a request with a valid api_key.
func envelope(events ...string) string {
	return `{"api_key":"k123","events":[` + strings.Join(events, ",") + `]}`
}

// ev is a valid event with extra members appended.
func ev(extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return `{"event_type":"e","user_id":"user-1"` + extra + `}`
}

func nest(open, close string, n int, inner string) string {
	return strings.Repeat(open, n) + inner + strings.Repeat(close, n)
}

// realisticEvent is a ~490-byte event shaped like an SDK's.
func realisticEvent(i int) string {
	insert := ""
	if i%2 == 0 {
		insert = fmt.Sprintf(`"insert_id":"a1b2c3d4-e5f6-4789-9abc-%012d",`, i)
	}
	return fmt.Sprintf(`{"user_id":"user-%08d@example.com","device_id":"5f1c2d3e-4b5a-6978-8a9b-%012d","event_type":"Checkout Completed",%s"time":1732233600%03d,"platform":"iOS","os_name":"ios","os_version":"17.4.1","device_model":"iPhone15,3","app_version":"4.12.0","ip":"$remote","language":"en-US","session_id":1732233500000,"event_properties":{"cart_value":129.95,"items":3,"currency":"EUR","coupon":null,"categories":["shoes","socks"]},"user_properties":{"plan":"pro","signup_days":412}}`,
		i, i, insert, i%1000)
}

func realisticEvents(n int) []string {
	evs := make([]string, n)
	for i := range evs {
		evs[i] = realisticEvent(i)
	}
	return evs
}

// The document is the upstream API (summarized in docs/upstream-api.md)
// ("the doc" below). want is the error body, "" for an accepted request.
var parseCases = []struct {
	name string
	body string
	want string
}{
	// Errors: `error` is one of: ..., `Missing request body`, ...
	{"empty body", ``, `{"code":400,"error":"Missing request body"}`},
	// our choice (the sim's): JSON whitespace only is no body either
	{"whitespace only", " \t\r\n ", `{"code":400,"error":"Missing request body"}`},

	// Errors: `error` is one of: ..., `Invalid JSON request body`, ...
	{"vertical tab is not JSON whitespace", "\v", `{"code":400,"error":"Invalid JSON request body"}`},
	{"form feed before object", "\f" + envelope(ev("")), `{"code":400,"error":"Invalid JSON request body"}`},
	{"truncated", `{"api_key":"k","events":[{}]`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"trailing garbage", envelope(ev("")) + ` x`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"trailing comma", `{"api_key":"k","events":[{"event_type":"e","user_id":"user-1",}]}`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"array body", `[]`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"string body", `"x"`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"single quotes", `{'api_key':'k'}`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"leading zero number", envelope(ev(`"x":01`)), `{"code":400,"error":"Invalid JSON request body"}`},
	{"bad escape", envelope(ev(`"x":"\q"`)), `{"code":400,"error":"Invalid JSON request body"}`},
	{"control byte in string", envelope(ev("\"x\":\"a\tb\"")), `{"code":400,"error":"Invalid JSON request body"}`},
	{"bad literal", envelope(ev(`"x":tru`)), `{"code":400,"error":"Invalid JSON request body"}`},
	// invalid JSON wins over every field rule, even one found earlier
	{"field error then bad JSON", `{"api_key":"k","events":[{"event_type":5}],"x":}`, `{"code":400,"error":"Invalid JSON request body"}`},
	// encoding/json's nesting limit (10000 open containers) is the relay's
	{"nesting 10000 ok", envelope(ev(`"x":` + nest("[", "]", 10000-3, ""))), ``},
	{"nesting 10001 refused", envelope(ev(`"x":` + nest("[", "]", 10001-3, ""))), `{"code":400,"error":"Invalid JSON request body"}`},
	// json.Valid accepts invalid UTF-8 and lone surrogates; so do we
	{"invalid utf8 kept", envelope(ev("\"x\":\"\xff\xfe\"")), ``},
	{"lone surrogate", envelope(ev(`"x":"\ud800"`)), ``},
	// the string scanner reads 16 bytes at a time: stops on either side of
	// its word boundaries, and strings cut off by the end of the body
	{"escape across word boundary", envelope(`{"event_type":"e","user_id":"abcdefghijklmn\"\u00e9op` + strings.Repeat("q", 16) + `\\"}`), ``},
	{"unicode escape across word boundary", envelope(`{"event_type":"e","user_id":"abcdefghijklm\u00e9\u00e9"}`), ``},
	{"control byte at word end", envelope(ev("\"x\":\"abcdefghijklmno\x1f\"")), `{"code":400,"error":"Invalid JSON request body"}`},
	{"control byte after word", envelope(ev("\"x\":\"abcdefghijklmnop\x00\"")), `{"code":400,"error":"Invalid JSON request body"}`},
	{"quote at word end", envelope(ev(`"abcdefghijklmn":"abcdefghijklmno"`)), ``},
	{"body ends in long string", `{"api_key":"k","events":[{"event_type":"e","user_id":"user-1abcdefghijklmnopqrstuvwxyz`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"body ends in short string", `{"api_key":"k","events":[{"event_type":"e","user_id":"us`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"body ends after backslash", `{"api_key":"k","events":[{"event_type":"e","user_id":"user-1\`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"body ends in unicode escape", `{"api_key":"k","events":[{"event_type":"e","user_id":"user-1\u00e`, `{"code":400,"error":"Invalid JSON request body"}`},

	// Request envelope: options: object, Optional. `min_id_length` (integer).
	// Our choice: a wrongly typed options or min_id_length is an invalid body.
	{"options not object", `{"api_key":"k","events":[` + ev("") + `],"options":[]}`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"min_id_length float", `{"api_key":"k","events":[` + ev("") + `],"options":{"min_id_length":1.5}}`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"min_id_length negative", `{"api_key":"k","events":[` + ev("") + `],"options":{"min_id_length":-1}}`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"min_id_length string", `{"api_key":"k","events":[` + ev("") + `],"options":{"min_id_length":"5"}}`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"min_id_length huge", `{"api_key":"k","events":[` + ev("") + `],"options":{"min_id_length":2147483648}}`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"options null", `{"api_key":"k","events":[` + ev("") + `],"options":null}`, ``},
	// every character escaped (78 bytes): found by internal/sim's TestAgree
	{"min_id_length fully escaped", `{"api_key":"k","events":[` + ev("") + `],"options":{"\u006d\u0069\u006e\u005f\u0069\u0064\u005f\u006c\u0065\u006e\u0067\u0074\u0068":"5"}}`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"options keys fully escaped", `{"\u0061\u0070\u0069\u005f\u006b\u0065\u0079":"k","\u0065\u0076\u0065\u006e\u0074\u0073":[` + ev("") + `],"\u006f\u0070\u0074\u0069\u006f\u006e\u0073":{"\u006d\u0069\u006e\u005f\u0069\u0064\u005f\u006c\u0065\u006e\u0067\u0074\u0068":7}}`, `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"user_id":[0]}}`},
	{"min_id_length null", `{"api_key":"k","events":[` + ev("") + `],"options":{"min_id_length":null}}`, ``},

	// Request envelope: api_key | string | Required.
	{"api_key missing", `{"events":[` + ev("") + `]}`, `{"code":400,"error":"Request missing required field","missing_field":"api_key"}`},
	{"api_key empty", `{"api_key":"","events":[` + ev("") + `]}`, `{"code":400,"error":"Request missing required field","missing_field":"api_key"}`},
	{"api_key null", `{"api_key":null,"events":[` + ev("") + `]}`, `{"code":400,"error":"Request missing required field","missing_field":"api_key"}`},
	{"api_key before events", `{}`, `{"code":400,"error":"Request missing required field","missing_field":"api_key"}`},
	{"api_key last wins", `{"api_key":"","api_key":"k","events":[` + ev("") + `]}`, ``},
	// Errors: `error` is one of: ..., `Invalid API key`, ... (our choice, the
	// sim's: a present api_key of the wrong type is invalid, not missing)
	{"api_key number", `{"api_key":5,"events":[` + ev("") + `]}`, `{"code":400,"error":"Invalid API key"}`},
	{"api_key object", `{"events":[` + ev("") + `],"api_key":{"k":"v"}}`, `{"code":400,"error":"Invalid API key"}`},
	{"api_key bool before bad events", `{"api_key":true,"events":5}`, `{"code":400,"error":"Invalid API key"}`},
	{"api_key bad then good", `{"api_key":[],"api_key":"k","events":[` + ev("") + `]}`, ``},
	{"api_key good then bad", `{"api_key":"k","api_key":1,"events":[` + ev("") + `]}`, `{"code":400,"error":"Invalid API key"}`},
	{"options bad before api_key bad", `{"api_key":1,"events":[` + ev("") + `],"options":1}`, `{"code":400,"error":"Invalid JSON request body"}`},

	// Request envelope: events | array of Event | Required.
	{"events missing", `{"api_key":"k"}`, `{"code":400,"error":"Request missing required field","missing_field":"events"}`},
	{"events null", `{"api_key":"k","events":null}`, `{"code":400,"error":"Request missing required field","missing_field":"events"}`},
	// our choice: an empty array carries no event, so it is missing
	{"events empty", `{"api_key":"k","events":[]}`, `{"code":400,"error":"Request missing required field","missing_field":"events"}`},
	{"events empty with spaces", `{"api_key":"k","events":[ ]}`, `{"code":400,"error":"Request missing required field","missing_field":"events"}`},
	// our choice (the sim's): events of another type is invalid, not missing
	{"events object", `{"api_key":"k","events":{}}`, `{"code":400,"error":"Invalid event JSON"}`},
	{"events string", `{"api_key":"k","events":"[]"}`, `{"code":400,"error":"Invalid event JSON"}`},
	{"events bad then good", `{"api_key":"k","events":1,"events":[` + ev("") + `]}`, ``},
	{"events good then bad", `{"api_key":"k","events":[` + ev("") + `],"events":1}`, `{"code":400,"error":"Invalid event JSON"}`},
	{"events bad then null", `{"api_key":"k","events":1,"events":null}`, `{"code":400,"error":"Request missing required field","missing_field":"events"}`},

	// Errors: `error` is one of: ..., `Invalid event JSON`, ...
	{"event not object", envelope(`1`), `{"code":400,"error":"Invalid event JSON"}`},
	{"event array", envelope(ev(""), `[]`), `{"code":400,"error":"Invalid event JSON"}`},
	{"event null", envelope(ev(""), `null`), `{"code":400,"error":"Invalid event JSON"}`},

	// Event: `event_type` is required.
	// Errors: events_with_missing_fields ... the index of the first event with an error.
	{"event_type missing", envelope(ev(""), `{"user_id":"user-1"}`, `{"user_id":"user-1"}`), `{"code":400,"error":"Request missing required field","events_with_missing_fields":{"event_type":[1]}}`},
	{"event_type empty", envelope(`{"event_type":"","user_id":"user-1"}`), `{"code":400,"error":"Request missing required field","events_with_missing_fields":{"event_type":[0]}}`},
	{"event_type null", envelope(`{"event_type":null,"user_id":"user-1"}`), `{"code":400,"error":"Request missing required field","events_with_missing_fields":{"event_type":[0]}}`},
	{"event_type number", envelope(`{"event_type":5,"user_id":"user-1"}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"event_type":[0]}}`},
	{"escaped key", envelope(`{"event\u005ftype":"e","user_id":"user-1"}`), ``},

	// Event: One of `user_id` or `device_id` is required.
	{"no id", envelope(ev(""), `{"event_type":"e"}`), `{"code":400,"error":"Request missing required field","events_with_missing_fields":{"device_id":[1],"user_id":[1]}}`},
	{"null ids", envelope(`{"event_type":"e","user_id":null,"device_id":null}`), `{"code":400,"error":"Request missing required field","events_with_missing_fields":{"device_id":[0],"user_id":[0]}}`},
	{"empty ids", envelope(`{"event_type":"e","user_id":"","device_id":""}`), `{"code":400,"error":"Request missing required field","events_with_missing_fields":{"device_id":[0],"user_id":[0]}}`},
	{"device only", envelope(`{"event_type":"e","device_id":"dev-1"}`), ``},
	{"empty object", envelope(`{}`), `{"code":400,"error":"Request missing required field","events_with_missing_fields":{"device_id":[0],"event_type":[0],"user_id":[0]}}`},

	// user_id | string; device_id | string.
	{"user_id number", envelope(`{"event_type":"e","user_id":12345}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"user_id":[0]}}`},
	{"device_id object", envelope(`{"event_type":"e","user_id":"user-1","device_id":{}}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"device_id":[0]}}`},

	// time: Milliseconds since epoch. Any other format (for example ISO) returns 400.
	{"time float", envelope(ev(`"time":1.5`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"time":[0]}}`},
	{"time exponent", envelope(ev(`"time":1e12`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"time":[0]}}`},
	{"time ISO", envelope(ev(""), ev(`"time":"2024-01-01T00:00:00Z"`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"time":[1]}}`},
	{"time digit string", envelope(ev(`"time":"1732233600000"`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"time":[0]}}`},
	{"time overflow", envelope(ev(`"time":9223372036854775808`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"time":[0]}}`},
	{"time int64 max", envelope(ev(`"time":9223372036854775807`)), ``},
	{"time negative", envelope(ev(`"time":-5`)), ``},
	{"time ms", envelope(ev(`"time":1732233600000`)), ``},
	{"time null is absent", envelope(ev(`"time":null`)), ``},
	{"time last wins", envelope(ev(`"time":"x","time":1`)), ``},
	{"first index per field", envelope(ev(""), ev(`"time":1.5`), ev(`"time":"x"`), `{"user_id":"user-1"}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"time":[1]},"events_with_missing_fields":{"event_type":[3]}}`},

	// Types of the Event table.
	{"event_properties array", envelope(ev(`"event_properties":[]`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"event_properties":[0]}}`},
	{"user_properties string", envelope(ev(`"user_properties":"x"`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"user_properties":[0]}}`},
	{"groups number", envelope(ev(`"groups":1`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"groups":[0]}}`},
	{"group_properties bool", envelope(ev(`"group_properties":true`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"group_properties":[0]}}`},
	{"plan array", envelope(ev(`"plan":["x"]`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"plan":[0]}}`},
	{"skip sync string", envelope(ev(`"$skip_user_properties_sync":"true"`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"$skip_user_properties_sync":[0]}}`},
	{"skip sync bool", envelope(ev(`"$skip_user_properties_sync":false`)), ``},
	{"session_id float", envelope(ev(`"session_id":1.0`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"session_id":[0]}}`},
	{"session_id -1", envelope(ev(`"session_id":-1`)), ``},
	{"event_id string", envelope(ev(`"event_id":"1"`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"event_id":[0]}}`},
	{"quantity float", envelope(ev(`"quantity":2.5`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"quantity":[0]}}`},
	{"price string", envelope(ev(`"price":"9.99"`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"price":[0]}}`},
	{"price negative float", envelope(ev(`"price":-9.99,"revenue":-1e2,"location_lat":52.5,"location_lng":13`)), ``},
	{"location_lng string", envelope(ev(`"location_lng":"13.4"`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"location_lng":[0]}}`},
	{"string field number", envelope(ev(`"platform":5`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"platform":[0]}}`},
	{"insert_id number", envelope(ev(`"insert_id":5`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"insert_id":[0]}}`},
	{"ip array", envelope(ev(`"ip":["1.2.3.4"]`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"ip":[0]}}`},
	{"several invalid", envelope(ev(`"price":"1","platform":2`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"platform":[0],"price":[0]}}`},
	// a value is classified by its first byte: every kind against the others
	{"string field true", envelope(ev(`"platform":true`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"platform":[0]}}`},
	{"string field object", envelope(ev(`"os_name":{"a":"b"}`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"os_name":[0]}}`},
	{"price bool", envelope(ev(`"price":false`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"price":[0]}}`},
	{"price array", envelope(ev(`"price":[1]`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"price":[0]}}`},
	{"groups array", envelope(ev(`"groups":[]`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"groups":[0]}}`},
	{"skip sync number", envelope(ev(`"$skip_user_properties_sync":1`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"$skip_user_properties_sync":[0]}}`},
	{"skip sync true", envelope(ev(`"$skip_user_properties_sync":true`)), ``},
	{"session_id -0", envelope(ev(`"session_id":-0`)), ``},
	{"session_id exponent", envelope(ev(`"session_id":1E3`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"session_id":[0]}}`},
	{"event_id int64 min", envelope(ev(`"event_id":-9223372036854775808`)), ``},
	{"event_id below int64", envelope(ev(`"event_id":-9223372036854775809`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"event_id":[0]}}`},
	{"time object", envelope(ev(`"time":{}`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"time":[0]}}`},
	{"insert_id true", envelope(ev(`"insert_id":true`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"insert_id":[0]}}`},
	{"ip null", envelope(ev(`"ip":null`)), ``},
	{"invalid then valid", envelope(ev(`"price":"1","price":1,"platform":[],"platform":"p"`)), ``},
	{"valid then invalid", envelope(ev(`"price":1,"price":"1"`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"price":[0]}}`},
	// and a bad literal or number in a typed field is bad JSON, whatever the kind
	{"bad literal in bool field", envelope(ev(`"$skip_user_properties_sync":tru`)), `{"code":400,"error":"Invalid JSON request body"}`},
	{"bad null in string field", envelope(ev(`"platform":nul`)), `{"code":400,"error":"Invalid JSON request body"}`},
	{"bad null in time", envelope(ev(`"time":nil`)), `{"code":400,"error":"Invalid JSON request body"}`},
	{"lone minus in int field", envelope(ev(`"quantity":-`)), `{"code":400,"error":"Invalid JSON request body"}`},
	{"bad fraction in string field", envelope(ev(`"city":1.`)), `{"code":400,"error":"Invalid JSON request body"}`},
	{"bad byte in object field", envelope(ev(`"plan":x`)), `{"code":400,"error":"Invalid JSON request body"}`},
	// duplicates of the recorded fields: the last one counts, whatever the
	// types of the earlier ones
	{"user_id number then string", envelope(`{"event_type":"e","user_id":5,"user_id":"user-1"}`), ``},
	{"user_id string then null", envelope(`{"event_type":"e","user_id":"user-1","user_id":null}`), `{"code":400,"error":"Request missing required field","events_with_missing_fields":{"device_id":[0],"user_id":[0]}}`},
	{"user_id string then empty", envelope(`{"event_type":"e","user_id":"user-1","user_id":""}`), `{"code":400,"error":"Request missing required field","events_with_missing_fields":{"device_id":[0],"user_id":[0]}}`},
	{"user_id escaped then short", envelope(`{"event_type":"e","user_id":"us\u0065r-1","user_id":"abc"}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"user_id":[0]}}`},
	{"device_id escaped then plain", envelope(`{"event_type":"e","device_id":"\u0030000","device_id":"dev-12"}`), ``},
	{"device_id string then object", envelope(`{"event_type":"e","user_id":"user-1","device_id":"dev-12","device_id":{}}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"device_id":[0]}}`},
	{"event_type string then empty", envelope(`{"event_type":"e","event_type":"","user_id":"user-1"}`), `{"code":400,"error":"Request missing required field","events_with_missing_fields":{"event_type":[0]}}`},
	{"event_type number then string", envelope(`{"event_type":1,"event_type":"e","user_id":"user-1"}`), ``},
	{"insert_id null then string", envelope(ev(`"insert_id":null,"insert_id":"x"`)), ``},
	{"insert_id string then number", envelope(ev(`"insert_id":"x","insert_id":1`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"insert_id":[0]}}`},
	{"time string then int", envelope(ev(`"time":"x","time":5`)), ``},
	{"ip number then remote", envelope(ev(`"ip":1,"ip":"$remote"`)), ``},
	// our choice: null on an optional field is the field absent
	{"nulls are absent", envelope(ev(`"platform":null,"event_properties":null,"price":null,"groups":null,"$skip_user_properties_sync":null`)), ``},
	// unknown fields are allowed and untouched
	{"unknown fields", envelope(ev(`"foo":[1,{"a":2}],"Time":"x","event_properties":{"time":"x"}`)), ``},

	// Limits: String length: 1024 characters (the upstream truncates: no error).
	{"long string", envelope(ev(`"platform":"` + strings.Repeat("x", 5000) + `"`)), ``},

	// Limits: Object depth: event_properties, user_properties: 40 layers.
	{"event_properties depth 40", envelope(ev(`"event_properties":` + nest(`{"a":`, `}`, 39, `{}`))), ``},
	{"event_properties depth 41", envelope(ev(`"event_properties":` + nest(`{"a":`, `}`, 40, `{}`))), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"event_properties":[0]}}`},
	{"user_properties depth 41 with arrays", envelope(ev(`"user_properties":{"a":` + nest(`[`, `]`, 40, `1`) + `}`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"user_properties":[0]}}`},
	// our choice (the sim's): the limit names only these two; group_properties
	// is not limited (refusing it would lose data the upstream may take)
	{"group_properties depth 41", envelope(ev(`"group_properties":` + nest(`{"a":`, `}`, 40, `{}`))), ``},
	{"group_properties depth 100", envelope(ev(`"group_properties":` + nest(`{"a":[`, `]}`, 50, `{}`))), ``},
	{"groups depth not limited", envelope(ev(`"groups":` + nest(`{"a":`, `}`, 50, `{}`))), ``},

	// Minimum ID length: user_id, device_id: 5 (override with `min_id_length`).
	// If an event has a user_id or device_id shorter than the minimum, the ID value is
	// removed from the event; if the event then has neither, it can be rejected with 400.
	{"user_id short", envelope(`{"event_type":"e","user_id":"abcd"}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"user_id":[0]}}`},
	{"both short", envelope(`{"event_type":"e","user_id":"abcd","device_id":"dev"}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"device_id":[0],"user_id":[0]}}`},
	{"device short user ok", envelope(`{"event_type":"e","user_id":"abcde","device_id":"dev"}`), ``},
	{"user_id 5 chars", envelope(`{"event_type":"e","user_id":"abcde"}`), ``},
	{"runes not bytes short", envelope(`{"event_type":"e","user_id":"éééé"}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"user_id":[0]}}`},
	{"runes not bytes ok", envelope(`{"event_type":"e","user_id":"ééééé"}`), ``},
	{"escaped runes", envelope(`{"event_type":"e","user_id":"\u00e9\u00e9\ud83d\ude00\u00e9"}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"user_id":[0]}}`},
	{"min_id_length 3", `{"api_key":"k","events":[{"event_type":"e","user_id":"abc"}],"options":{"min_id_length":3}}`, ``},
	{"min_id_length after events", `{"api_key":"k","events":[{"event_type":"e","user_id":"abcdef"}],"options":{"min_id_length":7}}`, `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"user_id":[0]}}`},
	{"min_id_length 0", `{"options":{"min_id_length":0},"api_key":"k","events":[{"event_type":"e","device_id":"d"}]}`, ``},

	// the first index per field merges errors found while scanning with
	// those found after min_id_length is known
	{"short id before bad type", envelope(`{"event_type":"e","user_id":"abc"}`, `{"event_type":"e","user_id":5}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"user_id":[0]}}`},
	{"missing type and short id", envelope(`{"user_id":"0"}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"user_id":[0]},"events_with_missing_fields":{"event_type":[0]}}`},
	{"short device and empty user", envelope(`{"event_type":"e","user_id":"","device_id":"abc"}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"device_id":[0]}}`},
	{"short user and bad device", envelope(`{"event_type":"e","user_id":"abc","device_id":7}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"device_id":[0]}}`},
	{"short user and all-zero device", envelope(`{"event_type":"e","user_id":"abc","device_id":"000000"}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"device_id":[0]}}`},
	{"no id and short id", envelope(`{"event_type":"e"}`, `{"event_type":"e","user_id":"abc"}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"user_id":[1]},"events_with_missing_fields":{"device_id":[0],"user_id":[0]}}`},
	{"missing type and all-zero device", envelope(`{"device_id":"\u0030000","user_id":"ab"}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"device_id":[0]},"events_with_missing_fields":{"event_type":[0]}}`},
	{"bad type before short id", envelope(`{"event_type":"e","user_id":5}`, `{"event_type":"e","user_id":"abc"}`, `{"event_type":"e","device_id":"abc"}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"device_id":[2],"user_id":[0]}}`},

	// device_id: All-zero device IDs are dropped and the request returns an error.
	{"all-zero uuid", envelope(ev(""), ev(`"device_id":"00000000-0000-0000-0000-000000000000"`)), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"device_id":[1]}}`},
	{"all-zero short", envelope(`{"event_type":"e","user_id":"user-1","device_id":"0000"}`), `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"device_id":[0]}}`},
	{"zeros inside ok", envelope(`{"event_type":"e","device_id":"00000000-0000-0000-0000-000000000001"}`), ``},

	// Minimal ingestion request: `api_key` plus `events` holding objects with
	// `event_type` and `user_id` or `device_id`.
	{"minimal", `{"api_key":"k","events":[{"event_type":"e","user_id":"user-1"}]}`, ``},
	{"realistic", envelope(realisticEvents(10)...), ``},
	// compact JSON takes fast paths around ':' and ','; whitespace anywhere
	// takes the general ones
	{"realistic indented", indent(envelope(realisticEvents(3)...), "\t"), ``},
	{"realistic spaced", indent(envelope(realisticEvents(3)...), " \r"), ``},
	{"space before colon", envelope(`{"event_type" :"e","user_id":"user-1","event_properties":{"a" :1}}`), ``},
	{"space after colon", envelope(`{"event_type": "e","user_id":"user-1","event_properties":{"a": [ 1 ]}}`), ``},
	{"space after comma", envelope(`{"event_type":"e", "user_id":"user-1","event_properties":{"a":1, "b":2}}`), ``},
	{"space before comma", envelope(`{"event_type":"e" ,"user_id":"user-1","event_properties":{"a":1 ,"b":2}}`), ``},
	{"comma then number in event", envelope(`{"event_type":"e","user_id":"user-1",5}`), `{"code":400,"error":"Invalid JSON request body"}`},
	{"comma then close in properties", envelope(ev(`"event_properties":{"a":1,}`)), `{"code":400,"error":"Invalid JSON request body"}`},
	{"colon then end of body", `{"api_key":"k","events":[{"event_type":`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"key then end of body", `{"api_key":"k","events":[{"event_type"`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"comma then end of body", `{"api_key":"k","events":[{"event_type":"e",`, `{"code":400,"error":"Invalid JSON request body"}`},
	{"double colon", envelope(`{"event_type"::"e","user_id":"user-1"}`), `{"code":400,"error":"Invalid JSON request body"}`},
}

// indent pretty-prints the JSON document s, indenting with ind.
func indent(s, ind string) string {
	var b bytes.Buffer
	if err := json.Indent(&b, []byte(s), "", ind); err != nil {
		panic(err)
	}
	return b.String()
}

func TestParse(t *testing.T) {
	var req Request // reused on purpose
	for _, tc := range parseCases {
		t.Run(tc.name, func(t *testing.T) {
			err := Parse([]byte(tc.body), &req)
			got := ""
			if err != nil {
				if err.Status != 400 {
					t.Errorf("status %d", err.Status)
				}
				got = string(err.AppendJSON(nil))
			}
			if got != tc.want {
				t.Errorf("Parse:\n got %s\nwant %s", got, tc.want)
			}
			// The oracle agrees on every case too.
			checkParse(t, []byte(tc.body), &req)
		})
	}
}

func TestParseRequestFields(t *testing.T) {
	body := `{"api_key":"k\"\u00e9y","options":{"min_id_length":3,"x":[1]},"events":[` +
		`{"event_type":"a","device_id":"dev\u002d1","user_id":"us","insert_id":"i","time":5},` +
		`{"event_type":"b","user_id":"user\ud83d\ude00"}]}`
	req := Request{Events: make([]Event, 5)}
	if err := Parse([]byte(body), &req); err != nil {
		t.Fatal(errJSON(err))
	}
	if string(req.APIKey) != "k\"éy" {
		t.Errorf("APIKey %q", req.APIKey)
	}
	if string(req.Options) != `{"min_id_length":3,"x":[1]}` || req.MinIDLength != 3 {
		t.Errorf("Options %q MinIDLength %d", req.Options, req.MinIDLength)
	}
	if len(req.Events) != 2 {
		t.Fatalf("%d events", len(req.Events))
	}
	e0, e1 := &req.Events[0], &req.Events[1]
	if string(e0.Raw) != `{"event_type":"a","device_id":"dev\u002d1","user_id":"us","insert_id":"i","time":5}` {
		t.Errorf("Raw %s", e0.Raw)
	}
	if string(e0.DeviceID) != "dev-1" || e0.UserID != nil || !e0.HasInsertID || !e0.HasTime {
		t.Errorf("event 0: %q %q %v %v", e0.DeviceID, e0.UserID, e0.HasInsertID, e0.HasTime)
	}
	if string(e0.OrderKey(nil)) != "d:dev-1" {
		t.Errorf("OrderKey %q", e0.OrderKey(nil))
	}
	if string(e1.UserID) != "user😀" || e1.DeviceID != nil || e1.HasInsertID || e1.HasTime {
		t.Errorf("event 1: %q %q %v %v", e1.DeviceID, e1.UserID, e1.HasInsertID, e1.HasTime)
	}
	if string(e1.OrderKey([]byte("x"))) != "xu:user😀" {
		t.Errorf("OrderKey %q", e1.OrderKey(nil))
	}

	// Reuse: nothing of the first request survives.
	if err := Parse([]byte(`{"api_key":"k2","events":[{"event_type":"c","user_id":"abcde"}]}`), &req); err != nil {
		t.Fatal(errJSON(err))
	}
	if string(req.APIKey) != "k2" || req.Options != nil || req.MinIDLength != DefaultMinIDLength || len(req.Events) != 1 {
		t.Errorf("after reuse: %q %q %d %d", req.APIKey, req.Options, req.MinIDLength, len(req.Events))
	}
	if e := &req.Events[0]; e.DeviceID != nil || string(e.UserID) != "abcde" || e.HasTime || e.HasInsertID {
		t.Errorf("after reuse: %+v", e)
	}
	// A failed Parse leaves no events behind.
	if err := Parse([]byte(`{"api_key":"k2","events":[{"event_type":"c","user_id":"abcde"}],`), &req); err == nil || len(req.Events) != 0 {
		t.Errorf("err %v, %d events", err, len(req.Events))
	}
}

// A hostile body of many tiny bad events must not cost an Event each.
func TestParseBadEventsNotKept(t *testing.T) {
	body := []byte(`{"api_key":"k","events":[` + strings.Repeat(`{},`, 100000) + `{"event_type":"e","user_id":"user-1"}]}`)
	var req Request
	err := Parse(body, &req)
	if err == nil || len(err.MissingFields) != 3 {
		t.Fatalf("got %s", errJSON(err))
	}
	if cap(req.Events) > 16 {
		t.Errorf("%d Events allocated for 1 acceptable-looking event", cap(req.Events))
	}
}

func testIDGen() *IDGen {
	g := &IDGen{}
	copy(g.prefix[:], "0123456789abcdef")
	return g
}

func TestAppendRewritten(t *testing.T) {
	cases := []struct {
		name, event, want string
	}{
		// an absent insert_id is filled; a present one is never changed
		{"adds insert_id and time", `{"event_type":"e","user_id":"user-1"}`,
			`{"insert_id":"0123456789abcdef1","time":1700000000000,"event_type":"e","user_id":"user-1"}`},
		{"keeps insert_id and time", `{"event_type":"e","user_id":"user-1","insert_id":"x","time":5}`,
			`{"event_type":"e","user_id":"user-1","insert_id":"x","time":5}`},
		{"adds time only", `{"insert_id":"x", "event_type":"e","user_id":"user-1"}`,
			`{"time":1700000000000,"insert_id":"x", "event_type":"e","user_id":"user-1"}`},
		// a null (the last duplicate counts) is replaced where it stands
		{"null replaced in place", `{ "time" : null ,"event_type":"e","insert_id":null,"user_id":"user-1"}`,
			`{ "time" : 1700000000000 ,"event_type":"e","insert_id":"0123456789abcdef1","user_id":"user-1"}`},
		{"last null duplicate", `{"insert_id":"a","time":1,"insert_id":null,"time":null,"event_type":"e","user_id":"user-1"}`,
			`{"insert_id":"a","time":1,"insert_id":"0123456789abcdef1","time":1700000000000,"event_type":"e","user_id":"user-1"}`},
		// ip: `$remote` uses the address of the upload request
		{"ip remote", `{"insert_id":"x","time":1,"ip":"$remote","event_type":"e","user_id":"user-1"}`,
			`{"insert_id":"x","time":1,"ip":"192.0.2.7","event_type":"e","user_id":"user-1"}`},
		{"ip remote escaped", `{"insert_id":"x","time":1,"ip":"\u0024remote","event_type":"e","user_id":"user-1"}`,
			`{"insert_id":"x","time":1,"ip":"192.0.2.7","event_type":"e","user_id":"user-1"}`},
		{"ip kept", `{"insert_id":"x","time":1,"ip":"10.1.1.1","event_type":"e","user_id":"user-1"}`,
			`{"insert_id":"x","time":1,"ip":"10.1.1.1","event_type":"e","user_id":"user-1"}`},
		// of duplicate ips, only a last "$remote" is replaced
		{"ip remote then other", `{"insert_id":"x","time":1,"ip":"$remote","ip":"10.1.1.1","event_type":"e","user_id":"user-1"}`,
			`{"insert_id":"x","time":1,"ip":"$remote","ip":"10.1.1.1","event_type":"e","user_id":"user-1"}`},
		{"ip other then remote", `{"insert_id":"x","time":1,"ip":"10.1.1.1","ip":"$remote","event_type":"e","user_id":"user-1"}`,
			`{"insert_id":"x","time":1,"ip":"10.1.1.1","ip":"192.0.2.7","event_type":"e","user_id":"user-1"}`},
		{"ip remote then null", `{"insert_id":"x","time":1,"ip":"$remote","ip":null,"event_type":"e","user_id":"user-1"}`,
			`{"insert_id":"x","time":1,"ip":"$remote","ip":null,"event_type":"e","user_id":"user-1"}`},
		// a string insert_id after a null one is kept; time likewise
		{"insert_id null then string", `{"insert_id":null,"insert_id":"x","time":null,"time":7,"event_type":"e","user_id":"user-1"}`,
			`{"insert_id":null,"insert_id":"x","time":null,"time":7,"event_type":"e","user_id":"user-1"}`},
		{"all three", `{"ip":"$remote","event_type":"e","time":null,"user_id":"user-1","event_properties":{"ip":"$remote"}}`,
			`{"insert_id":"0123456789abcdef1","ip":"192.0.2.7","event_type":"e","time":1700000000000,"user_id":"user-1","event_properties":{"ip":"$remote"}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var req Request
			if err := Parse([]byte(envelope(tc.event)), &req); err != nil {
				t.Fatal(errJSON(err))
			}
			got := req.Events[0].AppendRewritten([]byte("prefix:"), testIDGen(), []byte("1700000000000"), []byte("192.0.2.7"))
			if string(got) != "prefix:"+tc.want {
				t.Errorf("got  %s\nwant prefix:%s", got, tc.want)
			}
		})
	}
}

func TestAppendRewrittenEscapesRemoteIP(t *testing.T) {
	var req Request
	if err := Parse([]byte(envelope(ev(`"ip":"$remote","insert_id":"x","time":1`))), &req); err != nil {
		t.Fatal(errJSON(err))
	}
	got := req.Events[0].AppendRewritten(nil, testIDGen(), []byte("1"), []byte("a\"\\\x01\xff"))
	want := `{"event_type":"e","user_id":"user-1","ip":"a\"\\\u0001` + "\ufffd" + `","insert_id":"x","time":1}`
	if string(got) != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
	// No address known: "$remote" is left for the upstream.
	got = req.Events[0].AppendRewritten(nil, testIDGen(), []byte("1"), nil)
	if !bytes.Equal(got, req.Events[0].Raw) {
		t.Errorf("got %s", got)
	}
}

func TestErrorAppendJSON(t *testing.T) {
	e := &Error{Status: 400, Msg: `Invalid "x"`, MissingField: "events",
		InvalidFields: map[string][]int{"time": {3}, "device_id": {1}, "$skip_user_properties_sync": {0}},
		MissingFields: map[string][]int{"user_id": {2}, "event_type": {0, 4}}}
	want := `{"code":400,"error":"Invalid \"x\"","missing_field":"events","events_with_invalid_fields":{"$skip_user_properties_sync":[0],"device_id":[1],"time":[3]},"events_with_missing_fields":{"event_type":[0,4],"user_id":[2]}}`
	for range 5 { // map order must not leak
		if got := string(e.AppendJSON(nil)); got != want {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
	}
	if e.Error() != `Invalid "x"` {
		t.Errorf("Error() = %q", e.Error())
	}
}

func TestParseZeroAllocs(t *testing.T) {
	body := []byte(envelope(realisticEvents(100)...))
	// escaped ids and api_key take the scratch path
	esc := []byte(`{"api_key":"k\u0031","events":[` + strings.Repeat(`{"event_type":"e","user_id":"us\u00e9r-1","device_id":"d\u0065v-123"},`, 50) + ev("") + `]}`)
	var req Request
	for _, b := range [][]byte{body, esc} {
		if err := Parse(b, &req); err != nil {
			t.Fatal(errJSON(err))
		}
		if n := testing.AllocsPerRun(20, func() { Parse(b, &req) }); n != 0 {
			t.Errorf("Parse: %v allocs per run", n)
		}
	}
	if err := Parse(body, &req); err != nil {
		t.Fatal(errJSON(err))
	}
	ids, now, ip := NewIDGen(), []byte("1700000000000"), []byte("192.0.2.7")
	dst := make([]byte, 0, 64<<10)
	if n := testing.AllocsPerRun(20, func() {
		dst = dst[:0]
		for i := range req.Events {
			dst = req.Events[i].AppendRewritten(dst, ids, now, ip)
			dst = req.Events[i].OrderKey(dst)
		}
	}); n != 0 {
		t.Errorf("AppendRewritten: %v allocs per run", n)
	}
}
