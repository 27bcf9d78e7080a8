// Package throttle remembers which keys (device OrderKeys, user keys) the
// upstream asked the relay to leave alone, and until when, and optionally
// paces each key under the upstream's per-device rate so that 429s are rare.
//
// Keys are opaque strings chosen by the caller (the batcher uses an event's
// OrderKey, "d:"+device_id or "u:"+user_id, and "u:"+user_id for users named
// in a 429).
//
// Invariants:
//   - PausedUntil(k) never returns a time earlier than one given to Pause(k)
//     while that time is in the future: a later, shorter pause never
//     shortens an earlier, longer one.
//   - Memory is bounded: a pause is forgotten once it has expired, a pacing
//     bucket once it has refilled; expired entries are swept whenever a map
//     has doubled since the last sweep (amortised O(1) per call), and
//     Config.MaxKeys caps each map (past it, new pacing buckets are not
//     created; pauses are still recorded).
//   - The clock is Config.Now; nothing in the package sleeps or starts a
//     goroutine.
//
// A Throttle is safe for concurrent use (one mutex).
package throttle
