// Package export forwards the event export API (GET /api/2/export;
// docs/upstream-api.md, "Export") on the admin listener
// and holds the range rules the `relay export` command shares.
//
// # Rules checked locally
//
// start and end are required, each YYYYMMDDTHH (UTC); end's hour is
// included ("a whole day is T00 to T23"); end must not be before start and
// the range must be at most MaxRange (365 days). A request breaking them is
// answered 400 locally with a JSON body {"error", "source": "relay"} and
// nothing is sent upstream. The upstream's own answers (400 for a result
// over 4 GB, 404 for an empty range) pass back untouched.
//
// # Streaming
//
// The archive is streamed from the upstream connection to the caller by
// internal/forward: the relay never holds it (a multi-GB export keeps the
// relay's memory flat; see the memory test in this package). The caller
// has an idle time-out, not a total one (forward.Config.IdleTimeout): a slow
// caller is not cut while it reads, a stalled one is.
//
// # Credentials
//
// The caller's Authorization passes through, or X-Relay-Project names a
// project whose api_key:secret_key the relay injects (HTTP Basic). The
// upstream base is the project's analytics_url override, else
// --analytics-url; never taken from the request.
package export
