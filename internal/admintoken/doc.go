// Package admintoken checks the admin token of the relay's admin listener,
// as the contract's section "The admin token and upstream credentials" says.
//
// Where the token travels depends on the route (Mode):
//
//   - ModeOwn — the relay's own routes (/relay/v1/..., /debug/pprof/) and
//     /groupidentify and /usermap, whose upstream auth is the api_key in the
//     request: "Authorization: Bearer <token>"; "Proxy-Authorization: Bearer
//     <token>" is accepted too.
//   - ModeForward — routes forwarded to an upstream API: "Proxy-Authorization:
//     Bearer <token>", and the caller's own Authorization is passed to the
//     upstream untouched. When the caller names a project with
//     X-Relay-Project (the relay injects that project's credentials),
//     "Authorization: Bearer <token>" is accepted as well.
//
// /healthz, /readyz and /metrics are exempt: the router does not wrap them
// (this package has no notion of paths).
//
// Invariants:
//   - No admin token presented in a header the mode reads: 401, with a
//     Bearer challenge (WWW-Authenticate when the request's token slot is
//     Authorization, Proxy-Authenticate on forwarding routes). A token presented but
//     wrong: 403. A request is let through when any value of the headers the
//     mode reads carries the right token.
//   - Comparison is in constant time over HMAC-SHA256 sums under a random
//     per-process key, so neither the content nor the length of the token
//     leaks through timing, and the Token never holds the token itself.
//   - Nothing of this package logs; errors never contain the token; a Token
//     formats as a redacted placeholder.
//   - Strip removes, before a request is forwarded, Proxy-Authorization
//     always, Authorization when the mode reads it as the admin token slot
//     (ModeOwn; ModeForward with X-Relay-Project), and every value of any
//     header that carries the admin token in any form: as a word of the
//     value (any auth scheme, Digest's username="...", a cookie, a custom
//     header), percent-encoded, or inside a base64 word (HTTP Basic). A
//     caller's own upstream Authorization on a forwarding route without
//     X-Relay-Project is kept unless it carries the token.
//   - A nil *Token means no admin token is configured: Check lets every
//     request through; Strip still removes the headers above.
package admintoken
