// Package ratelimit holds the relay's client-side limiters for the upstream
// APIs it forwards to, so that the upstream's own 429 becomes rare: the SCIM
// request rate (100 requests per minute per organization: cost 1, Limit 100,
// Window 1 min) and the taxonomy cost budget (GET 1, others 2; at most 4
// cost in flight and 7200 cost per hour per project); and the user mapping
// rate per organization (internal/usermap, whose calls wait however long).
//
// # The rule
//
// A Limiter keeps, per key, the calls it admitted in admission order. A call
// counts as in flight from admission until its release (the upstream's
// answer head arrived), and against the window from admission until Window
// after its release. Counting from the release, not from the admission,
// makes the bound hold at the upstream whatever the network delay: the
// upstream saw each call before its answer came back, so no Window-long
// span at the upstream ever holds more than Limit cost.
//
// A call may start when every call ahead of it has started (FIFO per key),
// the in-flight cost plus its own is at most MaxInFlight, and the window's
// cost plus its own is at most Limit. A call that cannot start at once is
// refused at once when its estimated turn is further than MaxWait (calls
// ahead taken to end now, or at their own estimated start), else it waits,
// and is refused at MaxWait if its turn has still not come. A refusal is a
// *LimitedError with a Retry-After estimate of at least one second.
//
// Pause(key, d) holds a key's calls back for d (at most Window): callers
// use it when the upstream answered 429 with a Retry-After.
//
// State is in memory: a restarted relay starts with empty windows.
// Keys with no counted call and no pause are forgotten (swept every
// 1024 calls). Lock order: Limiter.mu only.
package ratelimit
