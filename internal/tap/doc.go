// Package tap shows an operator live events of a running relay, as `vector
// tap` does: a Hub is offered the events where they pass a point of the
// pipeline (accepted at ingest, delivered upstream, dead-lettered), and
// every attached Tap that wants one gets a copy, streamed as JSON lines by
// Handler (GET /relay/v1/tap).
//
// # Cost
//
// Without a tap attached at its point, the hook on a hot path is one atomic
// load (Hub.Active): a tap of ingest costs delivery nothing, and the other
// way round. With taps attached, an offered event is matched against each
// tap's filter (api_key hash, device, a byte search for the event type,
// sampling) and copied only when it matches; the delivered point parses the
// request body sent again to find its events.
//
// # Never in the way
//
// A tap's buffer is bounded (Config.Buffer events); an event offered while
// it is full is dropped and counted (relay_tap_dropped_events_total, and a
// {"dropped":N} line to the tap's client): publishing never blocks, so a
// slow reader never slows ingest or delivery. At most Config.MaxTaps taps
// are attached at once (Attach returns ErrTooMany, the handler answers
// 429). A tap ends by itself after its event limit or its duration.
//
// # Secrets
//
// A line names the api_key by KeyHash only; the events themselves carry no
// api_key (it is the envelope's). With Mask, the values of the property
// objects (event_properties, user_properties, groups, group_properties)
// are replaced by "***".
//
// # Goroutines and locks
//
// Pick and Send run on their caller's goroutine (an ingest request, a delivery
// shard). Each Handler call owns its tap and reads it until the end; Close
// ends every tap (the admin listener's stop). Hub.mu guards attaching and
// detaching only; Pick reads the attached taps from an atomic snapshot
// and takes no lock.
package tap
