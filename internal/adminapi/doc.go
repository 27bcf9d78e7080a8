// Package adminapi is the relay's admin listener on fasthttp: /healthz,
// /readyz, /metrics, /debug/pprof/, a small router on which the other admin
// routes are registered with their admin token mode, and the relay's own API
// under /relay/v1/ (Relay: dead letters and lanes).
//
// # Routes and the admin token
//
// Handle registers an open route; only /healthz, /readyz and /metrics are
// open. Every other route is registered with its admintoken.Mode: HandleOwn
// (the relay's own routes, /debug/pprof/, /groupidentify, /usermap: the
// token in Authorization), HandleForward (routes forwarded to an upstream
// API: the token in Proxy-Authorization, the caller's own Authorization
// passed through), or Register with adminroute.Route values offered by other
// packages. A later forwarding API only adds its routes with ModeForward.
//
// Invariants:
//   - /healthz answers 200 while the listener serves; it checks nothing else.
//   - /readyz answers 200 only when Config.Ready returns nil, else 503 with
//     the reason as a text body.
//   - When Config.Token is set, a request to a non-open route reaches its
//     handler only with the right token where its mode reads it (401 when
//     absent, 403 when wrong, compared in constant time by admintoken), and
//     with the admin token headers stripped (admintoken.Token.Strip), so a
//     forwarding handler never sends the token upstream.
//   - Neither the token nor request content reaches the log: fasthttp's
//     error messages are produced with SecureErrorLogMessage, and quoted
//     fragments and query strings in them are redacted before logging.
//     /debug/pprof/cmdline redacts secret-looking flag values.
//   - Routes are matched on the exact path, or on a prefix when registered
//     with a trailing slash; the longest match wins. A known path with another
//     method is answered 405 with Allow; an unknown path 404 (before any
//     token check: a 404 reveals no secret).
//
// # /relay/v1
//
// Relay answers JSON and names lanes by spool.Lane.Label, never by api_key;
// error answers never echo request values. Replay appends each selected dead
// letter's record (order key, user id and data unchanged) durably to the
// tail of the lane of its kind and options, under its own api_key or the
// request's corrected one, and deletes the dead letter only after that
// Append returned: a crash between the two leaves both, never neither.
// Replay and purge calls are serialised, so two calls never replay one dead
// letter twice; a filter call stops at the newest dead letter matching when
// it started, so records that die again are not replayed in a loop by it.
// Pause and resume go to the LaneControl of the lane's kind (the batcher for
// events); kinds without one answer 409.
//
// Goroutines: Serve runs the fasthttp server on the caller's goroutine;
// Shutdown stops it and waits for open requests up to its context. Handlers
// run on fasthttp's goroutines; Relay's bulk calls hold Relay.bulk (its only
// lock) across spool calls.
package adminapi
