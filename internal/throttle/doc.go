// Package throttle remembers which keys (device OrderKeys, user keys) the
// upstream asked the relay to leave alone, and until when, and paces each
// key the upstream refused so that its backlog drains under the upstream's
// per-key rate whatever reading of the rate rule the upstream follows.
//
// Keys are opaque strings chosen by the caller (delivery uses an event's
// OrderKey, "d:"+device_id or "u:"+user_id, and "u:"+user_id for users named
// in a 429).
//
// # Pacing
//
// A key named in a 429 (Refused) is paused, then paced: a token bucket
// refilled at PaceShare (0.9) times the answer's eps_threshold (30 when
// absent) events per second, whose size is the key's per-request cap. The
// first cap is half the key's share of the refused request (at most
// eps_threshold, at least 1); each further refusal (one that comes after
// the pause ended, not one more answer to a request sent before it) halves
// it again, down to 1, and the cap never grows back to the share a further
// refusal refused. Each admitted request (Admitted) counts towards growing the cap
// by one event (after as many admitted requests as the cap). So in any
// window of W seconds a paced key is sent at most cap + 0.9*eps*W events:
// under the strict reading (the request's own events count in the average)
// a cap of 0.1*eps*W is never refused, and the halving reaches it after a
// few refusals, each with a smaller share than the one before. A paced key
// always gets its cap's worth per refill: its backlog drains at 0.9*eps
// whenever the upstream admits anything. A key is forgotten PaceForget after
// its last use. With Config.PaceAll (a backfill) every key is paced from its
// first Take, with a cap of DefaultEPS that never grows, as if refused once.
//
// Invariants:
//   - PausedUntil(k) never returns a time earlier than one given to Pause(k)
//     while that time is in the future: a later, shorter pause never
//     shortens an earlier, longer one.
//   - Gen changes with every pause recorded, so a caller can check a batch
//     built earlier again just before it is sent.
//   - Memory is bounded: a pause is forgotten once it has expired, a paced
//     key PaceForget after its last use; expired entries are swept whenever
//     a map has doubled since the last sweep (amortised O(1) per call), and
//     Config.MaxKeys caps the paced keys (past it, new keys are not paced;
//     pauses are still recorded).
//   - The clock is Config.Now; nothing in the package sleeps or starts a
//     goroutine.
//
// A Throttle is safe for concurrent use (one mutex, never held across a
// call out of the package).
package throttle
