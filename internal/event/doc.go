// Package event parses, validates and rewrites the upstream's HTTP V2 ingest
// envelope ({"api_key", "events": [...], "options": {...}}).
//
// It is the relay's only parser of event JSON. One pass over the body both
// validates it as strict JSON (RFC 8259) and records, for every event object,
// its exact byte span and the spans of the fields the relay needs
// (user_id, device_id, insert_id, time, ip). Nothing is decoded into maps or
// structs: the relay forwards every event byte-for-byte, apart from the three
// rewrites of Event.AppendRewritten.
//
// Validation follows ../shared/api/ingestion-groups-usermap-export.md (Event,
// Request envelope, Errors, Limits): a request the upstream would reject is
// rejected here with the upstream's status and body (see Error).
//
// Invariants:
//   - Parse never retains body after it returns except through the slices in
//     Request, which alias body; the caller keeps body alive while it uses them.
//   - A Request with a nil error holds at least one event, each with a
//     non-empty OrderKey.
//   - Parse does not allocate per event once the Request has grown to size
//     (Requests are meant to be reused).
package event
