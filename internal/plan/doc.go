// Package plan enforces each project's tracking plan, read from the
// upstream's own taxonomy API, on the events the relay delivers.
//
// # The plan
//
// A project's plan is what the taxonomy API answers with the project's key
// pair: its event types (GET /event), the shared event properties (GET
// /event-property without event_type: planned on every event type), each
// event type's own properties (GET /event-property?event_type=T: an
// override replaces the shared property of its name on T) and the user
// properties (GET /user-property, "gp:" dropped). Deleted entries are not
// planned. Readings where the document is silent (docs/upstream-api.md,
// "Tracking plan"): a regex must match the whole string value; enum_values
// apply to the value's text whatever the type; null counts as absent (a
// required property that is null is missing); an object value passes only
// type any; event types starting with "$" ($identify, $groupidentify) are
// the SDKs' own and pass, their user properties checked; user property
// operations ($set, $setOnce, $add, $unset, ...) have their members'
// names checked, and the values of $set and $setOnce.
//
// # Modes and the check
//
// Off, Observe, Filter, Block (Mode). The decision is made at delivery,
// when a lane's records are packed into an upstream request
// (Enforcer.Check is internal/delivery's Frame.Check): the
// ingest's 200 still means kept, a new plan applies to the backlog, and a
// resend is checked again. The ingest checks each event where its strict
// parser left it (Vet: the parser records where event_type is and the
// members of the property objects, event.Request.PlanMembers, so that only
// their keys and values are read again) and marks the clean ones with a
// verdict naming the plan (by its content) and the mode; delivery skips
// the check of a record whose verdict is of the plan and mode in force and
// checks every other one in full (verdict.go). FuzzVet holds the ingest's
// verdict to the delivery check's on the record as spooled.
// A quarantined event is a dead letter with reason "plan" whose answer is
// a Quarantine (project, mode, event type, violations): listed, filtered
// and replayed through /relay/v1/deadletters, and a replay is checked
// again. Nothing is dropped silently: Filter's removed properties are
// counted as violations (relay_plan_violations_total).
//
// # Reading, keeping, cost
//
// Run reads every plan at start and every Config.Refresh (SetLive changes
// it and the default mode while running, and reads every plan again at
// once), and at once for a project changed through the relay's forwarded taxonomy API (Watch). A
// read takes one call at a time through the forwarded API's own
// ratelimit.Limiter (the same key, "project:"+name): plan reads and
// operators' calls share the documented cost (4 in flight, 7200 per hour),
// the plan never takes more than 1 in flight, and its reads spend at most
// Config.Share of the period's cost (ErrBudget: the read is postponed). A
// read plan is kept in Config.Dir (checksummed, replaced atomically), so a
// restart without upstream access enforces the last plan. A project never
// read observes, and ReadyInfo says so on /readyz.
//
// # Concurrency
//
// Check runs on the delivery shards' goroutines, Vet on the ingest's: they
// load the plan in force (an atomic pointer; Vet's index of api keys is
// another, made again when the credentials or the default mode change),
// and Check takes a state's mu only to keep a sample.
// A fetch holds its state's fetchMu (one read per project at a time), never
// mu. Lock order: Enforcer.mu, then state.mu; neither is held across a call
// into another package. Run's goroutine is its caller's.
package plan
