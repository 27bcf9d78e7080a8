// Package adminapi is the relay's admin listener: an http.Server over an
// http.ServeMux serving /healthz, /readyz, /metrics (promhttp),
// /debug/pprof/ (net/http/pprof), the routes other packages offer as
// adminroute.Route values with their admin token mode, and the relay's own
// API under /relay/v1/ (Relay: dead letters and lanes).
//
// # Routes and the admin token
//
// Handle registers an open route; only /healthz, /readyz and /metrics are
// open. Every other route is registered with Register and its
// admintoken.Mode: ModeOwn (the relay's own routes, /debug/pprof/,
// /groupidentify, /usermap: the token in Authorization) or ModeForward
// (routes forwarded to an upstream API, internal/forward: the token in
// Proxy-Authorization, the caller's own Authorization passed through).
//
// Invariants:
//   - One path: every request's raw path passes adminroute.CheckPath before
//     routing, or is answered 400 {"error","source":"relay"} (no token
//     check, no handler, nothing forwarded). The ServeMux routes the decoded
//     path of what remains; forwarders send that same path.
//   - /healthz answers 200 while the listener serves; it checks nothing else.
//   - /readyz answers 200 only when Config.Ready returns nil, else 503 with
//     the reason as a text body.
//   - When a token is in force (Config.Token, SetToken), a request to a
//     non-open route reaches its handler only with the right token where
//     its mode reads it (401 when absent, 403 when wrong, compared in
//     constant time by admintoken), and with the admin token removed from
//     its headers in whatever scheme it rides (admintoken.Token.Strip), so
//     a forwarding handler never sends it upstream.
//   - Neither the token nor request content reaches the log: net/http's
//     error log goes to zap with quoted fragments and query strings
//     redacted; /debug/pprof/cmdline redacts secret-looking flag values.
//   - No client can flood the log: net/http's lines (failed TLS handshakes,
//     panics) are sampled per message, a few a minute; a /metrics scrape
//     whose scraper went away is counted once in
//     relay_admin_metrics_write_errors_total and logged at most once a
//     minute (promhttp would log every metric family's failed write).
//   - Patterns are http.ServeMux's: the most specific wins; a known path
//     with another method is answered 405 with Allow; an unknown path 404
//     (before any token check: a 404 reveals no secret).
//     relay_admin_requests_total counts by the matched pattern, never by
//     the request's path.
//   - Request bodies are bounded (http.MaxBytesReader) by the route's
//     MaxBody, else by Config.MaxRequestBodySize.
//
// # /relay/v1
//
// Relay answers JSON and names lanes by storage.LaneKey.Label, never by api_key;
// error answers never echo request values. Replay appends each selected dead
// letter's record (order key, user id and data unchanged) durably to the
// tail of the lane of its kind and options, under its own api_key or the
// request's corrected one, and deletes the dead letter only after that
// Append returned: a crash between the two leaves both, never neither.
// Replay and purge calls are serialised, so two calls never replay one dead
// letter twice; a filter call stops at the newest dead letter matching when
// it started, so records that die again are not replayed in a loop by it.
// Pause and resume go to the delivery.LaneControl of the lane's kind (the events pipeline for
// events); kinds without one answer 409.
//
// Goroutines: Serve runs the http.Server on the caller's goroutine (a TLS
// listener serves HTTPS); handlers run on net/http's connection
// goroutines. Shutdown stops accepting, closes idle connections and those
// that have sent nothing yet, and waits for open requests up to its
// context; it owns one goroutine for the duration of the call. Relay's bulk
// calls hold Relay.bulk (its only lock) across spool calls.
package adminapi
