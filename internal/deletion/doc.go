// Package deletion forwards the user deletion API (first version;
// docs/upstream-api.md, "User deletion") on the admin listener and
// holds the rules the `relay delete-users` command shares.
//
// # Routes (same paths as upstream, {analytics_url})
//
//	POST   /api/2/deletions/users                     schedule deletions
//	GET    /api/2/deletions/users?start_day&end_day   list jobs
//	DELETE /api/2/deletions/users/{svc_id}/{day}      remove an id from a job
//
// # Rules checked locally
//
//   - POST: the body is a JSON object; svc_ids and user_ids, when present,
//     are arrays; together they hold 1 to MaxIDs (100) ids. Else 400
//     {"error", "source": "relay"} and nothing is sent.
//   - GET: start_day and end_day are required, YYYY-MM-DD, end_day not
//     before start_day and at most six months (MaxQueryMonths) after it.
//   - DELETE: svc_id is a positive integer and day is YYYY-MM-DD.
//   - Limits per project (the project named by X-Relay-Project or found by
//     the caller's api key; else per Authorization): at most 1 POST per
//     second and MaxParallel (8) requests of this API in flight
//     (internal/ratelimit). A call waits up to
//     forward.APIConfig.Limit.MaxWait (10 s) for its turn, else is answered
//     429 locally with Retry-After.
package deletion
