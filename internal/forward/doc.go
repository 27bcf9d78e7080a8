// Package forward forwards requests of the admin listener to the upstream
// management APIs (experiments, SCIM, classifiers, taxonomy, DSAR, deletion,
// feedback, export, user mapping reads) on the same paths as upstream.
//
// Each API is data (API), in a file of its own (scim.go, taxonomy.go, ...)
// with its validators and the rules the operator commands share
// (internal/operator: the export ranges, the DSAR and deletion requests, the
// feedback items and chunks): its Upstream (base flag, credentials kind,
// auth Scheme), its error format, its client-side Limits and its Routes.
// Every API is made by a function of one signature, func(APIConfig) API.
// A route is the admin listener's own adminroute.Route (method and
// http.ServeMux path pattern, the upstream's), whose Handler is the route's
// Endpoint (local Check, body limit, redirects followed): the route and the
// path it forwards are one value. Forwarder.Routes serves the Endpoints.
// Only the documented routes are forwarded: the admin listener answers any
// other path 404 or 405. Each API's file names its base flag and the
// credentials Resolve injects for X-Relay-Project; without it the caller's
// Authorization passes through.
//
// A request on a route goes: decoded body (when the route checks it) →
// Check → Resolve (base and credentials from configuration) → Limits →
// httputil.ReverseProxy with the relay's header rules (rewrite).
//
// # Invariants
//
//   - No open proxy: the upstream is Target.Base, which comes from the
//     configuration (a --*-url flag, or a per-project / per-organization
//     override of the credentials file). The request's Host header, an
//     absolute request URI and the path never choose the host.
//   - One path: the path sent is the path that was routed (URL.Path, as
//     URL.EscapedPath), appended to the base; a path adminroute.CheckPath
//     refuses (encoded '/', '\', '.', '%', ';', dot segments, "//",
//     invalid UTF-8) is answered 400 and never sent.
//   - The method, path, query string and body are sent untouched.
//     Hop-by-hop headers (and those listed in Connection), X-Forwarded-*,
//     Proxy-Authorization, X-Relay-Project and Expect are never forwarded.
//     Authorization is the caller's (the admin listener has removed every
//     header value carrying the admin token, whatever the header or its
//     scheme: admintoken.Token.Strip), unless X-Relay-Project
//     names a project: then Resolve injects that project's or its
//     organization's credentials in the API's Scheme.
//   - Answers are passed back with their status, end-to-end headers and
//     body, streamed: a multi-GB answer is never held in memory. An upstream
//     429 reaches the caller with its Retry-After.
//   - Request bodies above Config.MaxRequestBodyBytes are answered 413
//     locally. The upstream connection and the caller's have idle time-outs
//     (Config.IdleTimeout, renewed on every read and write), not total ones.
//     Transport errors are answered 502; nothing is retried (a retry would
//     count twice against the upstream's rate limits).
//   - Log lines a caller can cause (an unreachable upstream, a caller gone
//     mid-answer) are sampled per message, a few a minute;
//     relay_forward_errors_total counts every one.
//   - Local answers carry "source":"relay" (JSONErrors, or the API's own
//     format). Neither logs, metrics nor local answers ever hold an
//     Authorization value, a token or a key: logs name the API, method and
//     path only; Target.Key keeps a short hash of a caller's
//     Authorization, never the value.
//   - Credentials are read from a credentials.Ref at every request: a
//     reload takes effect for the next request.
//
// # Goroutines
//
// Handlers run on the admin listener's goroutines; the ReverseProxy copies
// the answer on the handler's goroutine. The Forwarder starts none of its
// own beyond the http.Transport's connection goroutines (Close drops the
// idle ones).
package forward
