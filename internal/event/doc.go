// Package event parses, validates and rewrites the upstream's HTTP V2 ingest
// envelope ({"api_key", "events": [...], "options": {...}}).
//
// It is the relay's only parser of event JSON. One pass over the body both
// validates it as strict JSON (RFC 8259) and records, for every event object,
// its exact byte span and the spans of the fields the relay needs
// (user_id, device_id, insert_id, time, ip). Nothing is decoded into maps or
// structs: the relay forwards every event byte-for-byte, apart from the three
// rewrites of Event.AppendRewritten. For a tracking plan's check
// (internal/plan), the walk also notes where each event's event_type,
// event_properties and user_properties keys are (Event.PlanKeys) and, when
// asked (Request.PlanMembers), the span of each member of the two property
// objects (Request.PropMembers), so that the check reads only those.
//
// # JSON
//
// The verdict on JSON validity is exactly encoding/json.Valid's: strings may
// hold invalid UTF-8 and unpaired \u surrogates (both accepted), control
// bytes below 0x20 in strings are refused, and at most 10000 containers may
// be open at once. The scanner is iterative (a bit stack, no recursion), so
// deep nesting costs neither stack nor time beyond one pass. Duplicate keys
// are allowed and the last one counts, as encoding/json and the usual JSON
// libraries do; keys are compared after unescaping ("user\u005fid" is
// user_id). Unescaped values (APIKey, DeviceID, UserID) decode escapes as
// encoding/json does (an unpaired surrogate becomes U+FFFD) but keep raw
// invalid UTF-8 bytes as they are.
//
// # Validation
//
// Validation follows the upstream API (docs/upstream-api.md: Event,
// Request envelope, Errors, Limits): a request the upstream would reject is
// rejected here with the upstream's status and body (see Error and Parse for
// the exact rules and which error wins). Where the document is silent, the
// choices are the ones the simulated upstream (internal/sim, its own
// encoding/json validator) makes too; its agree_test.go and FuzzAgree check
// that both give the same status and body for every request. Besides the
// envelope's rules (whitespace only, api_key, events, options), which
// Parse's doc lists in order:
//   - a null optional field is an absent field; "" as event_type, user_id or
//     device_id is a missing field;
//   - an event with neither user_id nor device_id is missing both (both
//     named, same index);
//   - integers (time, session_id, event_id, quantity) are JSON numbers
//     without fraction or exponent within int64; floats are any JSON number;
//   - property depth (event_properties and user_properties only, the two the
//     Limits table names; group_properties is not limited, since refusing it
//     would lose data the upstream may take) counts the property object as
//     layer 1 and every object or array inside it as one more; more than 40
//     is invalid;
//   - an all-zero device_id ('0' and '-' only) is invalid whatever its length;
//   - min_id_length counts characters (runes after unescaping; each invalid
//     UTF-8 byte is one, as it is one U+FFFD upstream). A short id is
//     removed (Event.DeviceID/UserID nil) but its bytes are forwarded
//     unchanged, since the upstream removes it itself; an event left with
//     neither id is invalid (not missing) in the removed field(s);
//   - a request with both invalid and missing fields is "Invalid field
//     values on some events" (both maps sent);
//   - string length (1024) is not checked: the upstream truncates.
//
// # Invariants
//
//   - Parse never retains body after it returns except through the slices in
//     Request, which alias body (or Request's own scratch space, for escaped
//     ids and api_key); the caller keeps body alive while it uses them, and
//     the next Parse into the same Request overwrites them.
//   - A Request with a nil error holds at least one event, each with a
//     non-empty OrderKey, and Event.Raw of each is one complete JSON object.
//   - Parse does not allocate per event once the Request has grown to size
//     (Requests are meant to be reused); an error allocates its Error.
//   - Events found bad while scanning are not kept, so memory stays bounded
//     by the acceptable-looking events of a body, not by its element count.
//   - AppendRewritten's output is one JSON object equal to Raw plus the added
//     or replaced insert_id, time and ip (when it is the last of duplicate
//     keys that is null or "$remote", it is replaced in place; absent fields
//     are inserted first), and otherwise Raw byte-for-byte.
//   - IDGen ids are unique per generator (a counter) and across generators
//     with overwhelming probability (a 64-bit random prefix).
package event
