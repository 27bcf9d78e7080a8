// Package sim is the relay's simulated upstream: a real HTTP server that
// answers the upstream API's routes by the rules summarised in
// docs/upstream-api.md, and keeps what it ingested in memory to be read back.
//
// The relay's sandbox mode (`relay` without --ingest-url), `relay sim`, its
// tests and bench/ use it. Its validator is written independently of
// internal/event (with encoding/json) on purpose: the relay's own validator
// is checked against it.
//
// This package is the model only. Fault injection (a queue of injected
// failures, latency, taking the Sim down, listeners that refuse) and the
// /sim/ routes that change the Sim (reset, faults, silence, quota) are in
// internal/simtest, which only tests and test helpers import: it plugs
// in through Config.Faults, which the product leaves nil, so the relay
// binary never fails a request on purpose and serves only read-outs under
// /sim/. The settings tests turn while a Sim runs (accepted tokens,
// secrets, limits, silenced devices, rejections) are its Knobs, which
// simtest reaches through the one hook Sim.Knobs; its inspectors read the
// same read-outs black-box tests read.
//
// # Routes
//
// Every upstream request is an Exchange (fault.go), logged in the request
// log, passed to Config.Faults when set (simtest fails it there, or lets
// it through): the ingestion routes through Sim.route (middleware.go: the
// body read, the answer buffered), the others as Direct (the answer
// streamed; mgmtRoute and apiRoute add their authentication). Every
// handler returns its answer and the Exchange writes it, so the status is
// known without wrapping the writer. The route groups (New), one file each:
//
//	/2/httpapi, /batch                          ingestion (httpapi.go; rules below)
//	/groupidentify                              group identify (groupidentify.go)
//	/usermap, GET /api/2/usermap                user mapping and its read (usermap.go)
//	/api/1/experiments...                       experiments management (experiments.go)
//	/scim/1/Users, /scim/1/Groups               SCIM (scim.go)
//	/api/2/channel-classifiers...               channel classifiers (classifiers.go)
//	/api/2/taxonomy/...                         taxonomy (taxonomy.go)
//	/api/1/ai-feedback/ingest                   AI feedback (feedback.go)
//	/api/2/dsar/requests..., /objects/dsar/...  DSAR (dsar.go)
//	/api/2/deletions/users...                   user deletion (deletion.go)
//	/api/2/export                               export (export.go)
//
// The four management APIs (experiments, SCIM, classifiers, taxonomy) share
// authentication and a call log in mgmt.go; the data APIs (feedback, DSAR,
// deletion, export) their authentication in feedback.go.
//
// Read-outs live under /sim/ (see control.go and each group's file) and are
// never subject to faults (JSON; simtest.Control is a Go client for them):
//
//	GET  /sim/healthz, /sim/stats
//	GET  /sim/events?api_key=K&after=SEQ&limit=N   stored events, raw bytes as received
//	GET  /sim/requests?after=SEQ&limit=N           the request log
//	GET  /sim/groupidentify, /sim/usermap, /sim/mgmt/calls, /sim/feedback,
//	     /sim/export/log                           per group (see its file)
//
// The routes that change the Sim are simtest's (see its package doc).
//
// # Order of checks on /2/httpapi
//
//  1. method must be POST, else 400 "Invalid request path"; unknown paths
//     answer 400 "Invalid request path" as well.
//  2. body (after gzip decoding when Content-Encoding: gzip) must be strictly
//     under Config.MaxBodyBytes (default 1,000,000), else 413
//     {"code":413,"error":"Payload too large"}. An undecodable gzip stream is
//     400 "Invalid JSON request body".
//  3. empty body, or JSON whitespace (space, tab, CR, LF) only: 400
//     "Missing request body".
//  4. not a JSON object, or options present, not null and not an object, or
//     options.min_id_length present, not null and not an integer in
//     0..2147483647: 400 "Invalid JSON request body".
//  5. api_key absent, null or "": 400 "Request missing required field",
//     missing_field "api_key". api_key not a string, or not in Config.APIKeys
//     when that is non-empty: 400 "Invalid API key".
//  6. events absent, null or []: 400 "Request missing required field",
//     missing_field "events". events not an array, or an element not an
//     object: 400 "Invalid event JSON". 2000 or more events (the document's
//     "under 2000 events"): 400 "Invalid event JSON" (it names no event; a
//     client bisects).
//  7. per event (JSON null counts as absent for every field):
//     - event_type absent or "": missing "event_type"; not a string: invalid.
//     - user_id / device_id not strings: invalid. A device_id made only of
//     '0' and '-' (with at least one '0') is invalid ("All-zero device IDs
//     are dropped and the request returns an error"). An event with neither
//     id (absent, null or "") is missing both "user_id" and "device_id".
//     Ids shorter than min_id_length (in characters) are removed; an event
//     left with neither id by that removal is invalid in the removed id(s).
//     - time not an integer literal (no fraction, no exponent, not a
//     string) or outside int64: invalid "time" (likewise quantity,
//     event_id, session_id).
//     - event_properties, user_properties, groups, group_properties, plan:
//     objects; event_properties and user_properties (the Limits table's
//     "Object depth") at most 40 layers deep (the object itself is layer 1;
//     objects and arrays both count): invalid otherwise. group_properties
//     is not depth limited (the table does not name it).
//     - string, number, integer and boolean fields of the Event table must
//     have that JSON type.
//     Each field names the index of the first event with that error. If any
//     field is invalid the error is "Invalid field values on some events",
//     else "Request missing required field"; both maps are sent when
//     non-empty. String length (1024) is not enforced: the document states a
//     limit but not a rejection.
//  8. silenced devices and daily quota (see below): 400.
//  9. rate limit: 429.
//  10. otherwise 200 {"code":200,"events_ingested":N,"payload_size_bytes":B,
//     "server_upload_time":MS}, N = events in the request (duplicates
//     included: the upstream ignores them silently), B = decoded body size.
//
// Where the document leaves a choice open, internal/event (the relay's
// validator) makes the same one: agree_test.go runs both on the bodies of
// both packages' tables and FuzzAgree on arbitrary bodies, and requires the
// same status and body (the 2000-event limit excepted: the relay takes any
// number of events and re-batches them).
//
// CountOnly mode replaces steps 3-10 by Config.CountOnly's count of the
// events and a 200; nothing is validated or stored, faults still apply.
//
// A non-200 answer ingests nothing (the exceptions are simtest's failure
// readings: a dropped answer after the ingest, as a real network can lose
// it, and a 5xx that ingested all or half: Exchange.Handle).
//
// # Dedup
//
// An event with an insert_id that was already ingested within DedupWindow for
// the same api_key and device (device_id, or when absent a hash of user_id)
// is counted in Duplicates and not stored again. Remembered ids are bounded
// by Config.DedupMaxKeys (oldest forgotten first, counted in DedupEvicted).
//
// # Rate limit
//
// Rates are per device_id and per user_id (an event without device_id counts
// for its user only, so throttled_devices never names the upstream's hashed
// id), per api_key unless RateAcrossKeys. The rate of a key is the number of
// its events ingested during the last RateWindow (10s) divided by the window
// in seconds. By default (the strict reading) the request's own events of
// the key count too: a request is answered 429 when, for any device or user
// in it, (ingested in the window + its events in the request) / window is
// above EPSThreshold, so a request carrying more than EPSThreshold*RateWindow
// events of one key is refused however long the relay waits; with
// LenientRate only events already ingested count (one large batch is taken).
// A key is also refused while inside its penalty: once named in a 429 it
// stays throttled for ThrottlePenalty (30s, the document's "Pause that user
// or device for 30 seconds"); requests during the penalty do not extend it.
// The reported rate is the measured rate rounded up to an integer.
//
// # Readings
//
// Where the upstream's documentation (summarised in docs/upstream-api.md)
// allows more than one reading, the Sim plays each as a setting; the zero
// value is the strict reading. The numbers label the readings in the
// repo's tests (readings_test.go):
//
//	#1  own events count (strict) or not        Config.LenientRate
//	#1  window 1s, 10s, 30s                     Config.RateWindow
//	#1  per api_key+key, or across projects     Config.RateAcrossKeys
//	#2  429 ingests nothing, or the unnamed     Config.PartialThrottle
//	#2  penalised after falling under the rate  Config.ThrottlePenalty
//	#3  silenced 400 ingests nothing, or others Config.PartialSilence
//	#4  5xx / reset accepted fully, half, none  simtest.Fault.Ingest and
//	                                            simtest.DropAfterIngest
//	#5  1 MB = 1,000,000 or 1,048,576           Config.MaxBodyBytes (both the sent
//	                                            and the gzip-decoded body must be under it)
//	#6  2000 events refused, or taken           Config.MaxEvents (2000, or 2001)
//	#9  daily quota to UTC midnight or 24 h     Config.QuotaRolling
//	#10 invalid API key, permanent or transient Knobs.RefusedKeys
//
// Readings found beyond the list: the penalty is counted from the 429 the
// upstream sends, while a client can only count its pause from the answer
// it receives (so a client pausing exactly ThrottlePenalty never sends
// inside the penalty); a request refused by the penalty does not extend it;
// a user's rate counts the events of every device of that user.
//
// # Silenced devices and daily quota
//
// Knobs.Silenced silences devices. With DailyQuota > 0, a
// device whose ingested events of the current UTC day (by Config.Now) are
// already >= DailyQuota is over quota. A request holding events of such
// devices is answered 400 "Some devices are silenced" with eps_threshold,
// silenced_devices (the silenced ones), silenced_events (indexes of events of
// silenced devices only), exceeded_daily_quota_devices (device -> today's
// count), and throttled_devices / throttled_events when some are throttled
// too. Nothing of it is ingested.
//
// # Memory
//
// Counters (Stats) are always kept. Stored events are bounded by Config.Keep
// (1,000,000), the request log by KeepRequests (100,000), remembered
// insert_ids by DedupMaxKeys (4,194,304 hashes); idle rate keys and quota
// counters of past days are swept every 1024 accepted requests. Long runs
// (sandbox, bench) should lower Keep and KeepRequests.
//
// # Concurrency
//
// Sim.mu guards the store (events, dedup, rates, request log), the Knobs
// and every route group's state: one lock, never held across a call that
// takes it (validKey, Events, AllEvents, Stats take it themselves) nor
// across Config.Faults or a sleep. Handlers run
// on net/http's goroutines; Serve may be called for several listeners.
package sim
