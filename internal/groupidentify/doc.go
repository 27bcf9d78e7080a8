// Package groupidentify is the admin listener's POST /groupidentify: it
// validates group identifications locally, spools them durably and delivers
// them to {ingest-url}/groupidentify, merged across callers per api_key.
//
// # Accepting
//
// The form body (application/x-www-form-urlencoded; the query is read when a
// field is absent from the body) carries api_key and identification: a JSON
// array of objects (one object is also taken) with group_type (string),
// group_value (string) and group_properties (object; keys starting with '$'
// must be one of $set, $setOnce, $add, $append, $unset and hold objects,
// other keys are plain properties). Refused with {"code":400,"error":"..."}
// naming the field and index: missing or empty api_key, identification,
// group_type, group_value or group_properties; invalid JSON; wrong types;
// unknown operations or fields; more than 1024 identifications or 1024 group
// properties (plain keys plus the keys inside each operation) in one request
// (the API reference's Limits: "at most 1024 group identifies, 1024 group
// properties, 1 MB"). A body of 1,000,000 bytes or more, or an identification
// that cannot fit one upstream request, is 413.
//
// X-Relay-Project: NAME may stand for api_key (forms.APIKey).
//
// Each identification becomes one spool record (OrderKey
// group_type+"\x00"+group_value, Data the compacted JSON object) of lane
// {KindGroupIdentify, api_key}; the request is one chunk. 200
// {"code":200,"identifications_accepted":N} is answered only after Append
// returned nil (the chunk is durable); spool.ErrFull / ErrDiskLow / ErrClosed
// give 503 with Retry-After and nothing written.
//
// # Delivery
//
// Run delivers with the lane runner every kind shares (delivery.NewForm:
// one shard per lane; see internal/delivery's invariants): one request in flight
// per lane, records of many chunks merged into requests of
// at most 1024 identifications, 1024 group properties and a body under
// 1,000,000 bytes; retries with backoff until MaxAge, 400 bisected to dead
// letters ("bad_request"), 413 split, an invalid api_key stops the lane.
//
// Metrics: relay_groupidentify_accepted_total,
// relay_groupidentify_rejected_requests_total{reason}, and the lane runner's
// relay_groupidentify_{delivered_total, requests_total{result},
// dead_letters_total{reason}, retries_total, lanes_stopped, lanes}.
package groupidentify
