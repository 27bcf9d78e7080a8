// Package usermap is the admin listener's user mapping routes:
// POST /usermap (validated, spooled, delivered to {alias-url}/usermap, paced
// per organization) and GET /api/2/usermap (ReadAPI: forwarded
// synchronously to {analytics-url}/api/2/usermap by internal/forward).
//
// # POST /usermap
//
// Parameters api_key and mapping are read from the query, else from a form
// body. mapping is one JSON object or an array of them: user_id (string)
// required, global_user_id (string) required unless unmap is true, unmap
// (boolean); other fields are refused. More than 2000 mappings ("at most 2000
// requests/events per batch") is 400; a body plus query of 1,000,000 bytes
// or more ("and 1 MB") is 413. Errors are {"code":N,"error":"..."} naming the
// field and index.
//
// X-Relay-Project: NAME may stand for api_key (forms.APIKey).
//
// Each mapping is a spool record (OrderKey and UserID = user_id) of lane
// {KindUserMap, api_key}; 200 {"code":200,"mappings_accepted":N} follows the
// commit; 503 with Retry-After when the spool refuses.
//
// # Delivery
//
// The lane runner every kind shares (delivery.NewForm, one shard per lane) sends form bodies api_key=K&mapping=[...] (POST,
// application/x-www-form-urlencoded) of at most min(2000, RateLimit)
// mappings and under 1,000,000 bytes; one request in flight per lane keeps
// the order of every user_id (a lane is one api_key; mappings of one user
// under two api_keys are two callers' orders, not one). Every request first
// takes its mapping count from the pacer (a ratelimit.Limiter) of its
// organization: the organization of the api_key's project in the credentials file (a project
// in no organization is its own; an api_key not in the file is its own
// organization). The pacer keeps every 30 s window at or under 1500 mapping
// calls, counted from admission to RateWindow after the answer, so the
// upstream's window never sees more whatever the latency. A 429 waits as
// a 5xx does (delivery.Retry.Wait: the backoff, at least Retry-After
// clamped), at least RateWindow when it has no Retry-After, then resends.
//
// # GET /api/2/usermap
//
// ReadAPI is the route as forward data. user_ids is validated locally (1 to
// 100 non-empty ids, given either as a JSON array of strings or
// comma-separated; the reference says "list" and shows neither) and 400
// otherwise. The request goes to the configured analytics base (or the named
// project's analytics_url) with the query untouched and only these headers:
// Authorization (the caller's own, passed through; or, with X-Relay-Project:
// NAME, Basic api_key:secret_key of that project, 400 if unknown) and
// Accept. The answer is passed back (internal/forward); 502 when the
// upstream cannot be reached.
//
// Metrics: relay_usermap_accepted_total, relay_usermap_rejected_requests_total{reason}
// (POST), relay_usermap_pace_wait_seconds_total and the lane runner's
// relay_usermap_* delivery metrics; reads are relay_forward_*{api="usermap"}.
package usermap
