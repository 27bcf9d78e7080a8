// Package adminapi is the relay's admin listener on fasthttp: /healthz,
// /readyz, /metrics, /debug/pprof/ and a small router on which the other
// admin routes (dead letters, forwarding) are registered with Handle.
//
// Invariants:
//   - /healthz answers 200 while the listener serves; it checks nothing else.
//   - /readyz answers 200 only when Config.Ready returns nil, else 503 with
//     the reason as a text body.
//   - /healthz, /readyz and /metrics never need the admin token; every other
//     route registered through HandleAuth, and /debug/pprof/, needs
//     "Authorization: Bearer <token>" when Config.AdminToken is set (401 when
//     absent, 403 when wrong, compared in constant time). The token is never
//     logged or echoed.
//   - Routes are matched on the exact path, or on a prefix when registered
//     with a trailing slash; the longest match wins. A known path with another
//     method is answered 405 with Allow.
//
// Goroutines: Serve runs the fasthttp server on the caller's goroutine;
// Shutdown stops it and waits for open requests up to its context.
package adminapi
