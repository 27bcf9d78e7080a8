// Package forward forwards requests of the admin listener to the upstream
// management APIs (experiments, SCIM, classifiers, taxonomy, DSAR, deletion,
// feedback, export) on the same paths as upstream.
//
// A route package resolves where a request goes with Resolve (base and
// credentials from configuration), validates what it can locally, and ends
// its handler with Forwarder.Forward. Mux routes the documented paths of
// one API and answers everything else 404 locally.
//
// # Invariants
//
//   - No open proxy: the upstream is Target.Base, which comes from the
//     configuration (a --*-url flag, or a per-project / per-organization
//     override of the credentials file). The request's Host header, an
//     absolute request URI and the path never choose the host: the raw path
//     and query are appended to the base as they are.
//   - The method, raw path, query string and body are sent untouched.
//     Hop-by-hop headers (and those listed in Connection), Host,
//     Proxy-Authorization and X-Relay-Project are never forwarded.
//     Authorization is the caller's, untouched (pass-through), unless
//     X-Relay-Project names a project: then Resolve injects that project's
//     or its organization's credentials in the route's Scheme.
//   - Answers are passed back with their status, end-to-end headers
//     (Content-Type, Content-Encoding, Retry-After, Location,
//     Content-Disposition, ETag, WWW-Authenticate, ...) and body. The body
//     is streamed from the upstream connection to the caller: a multi-GB
//     answer is never held in memory. An upstream 429 reaches the caller
//     with its Retry-After.
//   - Request bodies above Config.MaxRequestBodyBytes are answered 413
//     locally. The upstream connection has an idle time-out
//     (Config.IdleTimeout, renewed on every read and write), not a total one.
//     Transport errors are answered 502 with a JSON body; nothing is retried
//     (a retry would count twice against the upstream's rate limits).
//   - Local answers (Error, WriteError) are JSON {"error": "...", "source":
//     "relay"}. Neither logs, metrics nor local answers ever hold an
//     Authorization value, a token or a key: logs name the API, method and
//     path only; Resolved.Key keeps a short hash of a caller's
//     Authorization, never the value.
//
// # Goroutines
//
// Forward runs on the caller's (the server's) goroutine; after the handler
// returns, the relay's fasthttp server reads the streamed body and closes
// it, which releases the upstream connection.
package forward
