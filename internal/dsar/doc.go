// Package dsar forwards the data subject access request API (summarized in
// docs/upstream-api.md, "Data subject access requests") on the admin listener
// and holds the request rules the `relay dsar` command shares.
//
// # Routes (same paths as upstream, {analytics_url})
//
//	POST /api/2/dsar/requests                        create (cost 8)
//	GET  /api/2/dsar/requests/{id}                   status (cost 1)
//	GET  /api/2/dsar/requests/{id}/outputs/{output}  a gzipped file (cost 1)
//
// Other methods and paths under /api/2/dsar/requests are answered 404 or
// 405 locally by the admin listener. The routes are data: API.
//
// # Rules checked locally
//
//   - The create body must be a JSON object with a non-empty string userId
//     or a positive integer svcId, and startDate and endDate of the form
//     YYYY-MM-DD with startDate not after endDate; else 400 {"error",
//     "source": "relay"} and nothing is sent.
//   - Cost budget: all DSAR calls of one organization (or, for
//     pass-through, of one Authorization) share Budget (14400) per hour, POST
//     costing 8 and GET 1 (internal/ratelimit). A call that would exceed it
//     waits up to forward.APIConfig.Limit.MaxWait (10 s) for its turn,
//     else is answered 429 locally with Retry-After.
//
// # Outputs
//
// An output answered with a redirect (301, 302, 303, 307, 308 with a
// Location) is followed by the relay, at most MaxRedirects times, with the
// same credentials (the caller's Authorization, or the injected organization
// key pair) on the same host and none on another (http.Client's rule), as
// the document requires of a client that does not follow the redirect
// itself; the final answer is streamed to the caller and never held in
// memory, under an idle time-out, not a total one (internal/forward). Only
// http and https locations are followed; a redirect that cannot be followed
// is passed back as it is.
//
// The "urls" of a status answer name the upstream host: a caller going
// through the relay requests their path on the relay instead.
package dsar
