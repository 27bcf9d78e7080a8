// Package ingest is the relay's ingest listener: the fasthttp server that
// takes the upstream's HTTP V2 envelope on POST /2/httpapi and POST /batch,
// validates it with package event, rewrites each event and appends the
// request to the store as one storage.Request before it answers.
//
// # The store
//
// The Server is given a storage.Appender (cmd/relay chooses it once: the
// local spool behind spool.NewBackend, or the fleet's backend); there is
// one path for both. The handler rewrites the events straight into a
// pooled storage.Batch (the chunk's encoding, no copy of the records) and
// appends it with the lane named by the request's bytes (kind events,
// api_key, canonical options): the local spool finds the lane in its own
// cache without allocating and takes the batch's memory over; the fleet
// copies the records into its messages and gives the request a fresh id.
//
// # Answers
//
//   - 200 {"code":200,"events_ingested":N,"payload_size_bytes":B,"server_upload_time":MS}
//     once the store's Append returned nil: the events are durable (the local
//     spool: as its Config.NoSync defines; the fleet: on a quorum). B is the
//     body size as received (compressed, when the body was gzip), MS the
//     acceptance time in ms.
//   - A request event.Parse rejects gets the upstream's status and body
//     (event.Error.AppendJSON); nothing of it is spooled.
//   - 413 {"code":413,"error":"Payload too large"}: the body, after
//     decompression, is longer than Config.MaxRequestBytes.
//   - 415 {"code":415,"error":"Unsupported Content-Encoding"}: a
//     Content-Encoding other than gzip, x-gzip or identity.
//   - 400 {"code":400,"error":"Invalid gzip request body"}: a gzip body that
//     does not decompress (corrupt, truncated, trailing garbage).
//   - 503 {"code":503,"error":"..."} with Retry-After (Config.RetryAfter,
//     rounded up to whole seconds): the store is full (storage.ErrFull;
//     reason spool_full), its disk is low (spool.ErrDiskLow; disk_low), the
//     lane would be one too many (spool.ErrTooManyLanes; too_many_lanes), or
//     one too many of its api_key (spool.ErrTooManyKeyLanes;
//     too_many_key_lanes: options variants count), it
//     is closed or the server is shutting down (shutting_down), or it failed
//     the append (spool_error, logged). Nothing of the request was stored
//     (after the fleet's storage.ErrUnavailable: perhaps all of it), so a
//     retry cannot duplicate events the upstream does not deduplicate.
//   - 400 {"code":400,"error":"Invalid request path"} for a POST to any other
//     path (as the upstream answers); 404 for other methods on unknown paths;
//     405 with Allow for a wrong method on a known path.
//   - 408, 431 and 400 for requests fasthttp cannot read (time-out, header too
//     large, malformed HTTP).
//   - 400 and a closed connection for framing RFC 9112 makes an error but
//     fasthttp would take: Content-Length with Transfer-Encoding (whatever
//     follows on the connection, e.g. a request smuggled behind a chunked
//     body, is never read), obs-fold header lines, more than one
//     Content-Encoding field (see strict.go).
//   - `Expect: 100-continue` with a Content-Length certainly above the limit
//     (MaxRequestBytes for a plain body, the read limit for a compressed
//     one) gets 413 instead of `100 Continue`, and the connection is closed.
//   - 500 {"code":500,"error":"Internal server error"}
//     when a handler panics (the panic is recovered and logged, the process
//     keeps serving).
//   - GET /healthz answers 200 "ok" while the server serves.
//
// The Content-Type of requests is not checked (the upstream's document does
// not say what it does with a wrong one, and SDKs always send JSON): a
// text/plain body, what navigator.sendBeacon sends, is the same envelope
// under the same rules.
//
// # Browsers and the internet (Config.Open)
//
// Each check is off by default and costs a nil test when off. Server.SetOpen
// replaces them all while serving (a configuration reload): they are one
// immutable snapshot behind an atomic pointer, so a request sees the old
// settings or the new, never a mix, and no lock is taken.
// Server.SetMaxBatchBytes likewise changes the body limit an event must fit
// under alone (413 otherwise).
//
//   - CORS (Open.CORSOrigins): on the ingest paths, OPTIONS with Origin and
//     Access-Control-Request-Method is a preflight: 204 with
//     Access-Control-Allow-Origin (the origin, or * under "*"),
//     -Allow-Methods POST, -Allow-Headers (Content-Type, Content-Encoding,
//     Accept) and -Max-Age 7200 for an allowed origin; 403 {"code":403,
//     "error":"Origin not allowed"} and no CORS header for another. Every
//     answer on the ingest paths carries Vary: Origin, and for an allowed
//     origin Access-Control-Allow-Origin (errors too, so that the SDK can
//     read them); never Access-Control-Allow-Credentials. A POST whose
//     Origin is not allowed is answered 403 and nothing is spooled: a
//     sendBeacon or text/plain fetch is sent without a preflight, so the
//     browser alone would not stop it. Requests without Origin (servers,
//     SDKs outside browsers) are not affected. An OPTIONS that is not a
//     preflight gets 204 with Allow.
//   - The allow-list (Open.AllowedAPIKeys, Server.SetOpen): after
//     validation (an invalid request gets the upstream's 400 whatever its
//     key), a request of another api_key is answered 403 {"code":403,
//     "error":"API key not allowed"}; no lane is made for it.
//   - Per-client rate limit (Open.ClientRateLimit): after validation and the
//     allow-list, a request over its client's rate is answered 429 with
//     Retry-After (whole seconds, at least 1) and {"code":429,"error":"Too
//     many requests for this client","throttled_events":[0..n-1]}, which the
//     official SDKs take as the upstream's 429 and hold the events back for
//     30 s. The client is the address of Rewrites below (IPv6 by its /64);
//     see clientlimit.go for the table and its bound.
//   - Anonymization (Open.AnonymizeIP): the client address written for
//     "$remote" keeps its /24 (IPv4) or /48 (IPv6); every ip member an event
//     gives (duplicates included) is rewritten the same way, and one that is
//     not an address becomes null. Rejection log lines show the peer
//     anonymized.
//
// Refusals of this section are counted in relay_ingest_rejected_requests_total
// with reasons origin_not_allowed, api_key_not_allowed and
// client_rate_limited (and their events in relay_ingest_events_rejected_total).
//
// # Rewrites
//
// Each event is spooled as event.Event.AppendRewritten makes it: insert_id
// added when absent, time added (the acceptance time) when absent, and an ip
// of "$remote" replaced by the client address. The client address is the TCP
// peer, unless the peer lies in Config.TrustedProxies: then the
// X-Forwarded-For entries (all such headers, in order, comma separated) are
// walked from the right, skipping trusted addresses, and the first address
// that is not trusted is the client. When every entry is trusted, the
// leftmost one is the client. An entry that is not an IP address (ports are
// allowed) stops the walk, and the last address reached is used, so a client
// can never choose its address by forging entries left of a trusted proxy's.
//
// # Invariants
//
//   - A 200 is written only after the store's Append returned nil for the
//     whole request; a request is one Append, so it is stored entirely or
//     not at all.
//   - The api_key is never logged; lanes appear in logs by storage.LaneKey.Label.
//   - A request's memory is bounded by a small multiple of
//     Config.MaxRequestBytes (raw body, inflated body, the batch of rewritten
//     events, which is larger than the body by the filled insert_id and time
//     of each event): a gzip body is inflated to at most MaxRequestBytes+1
//     bytes, whatever its compression ratio. At most Config.MaxConnections
//     connections are open at once (over every listener of a Server); beyond
//     it Accept waits for one to close, so new connections wait in the
//     kernel's accept queue. One client address (an IPv6 address by its /64;
//     TrustedProxies and UnboundedPeers not counted) holds at most
//     Config.MaxConnectionsPerClient of them: a connection beyond that is
//     reset at accept, before anything is read.
//   - An accept error that ends when resources free up (EMFILE, ENFILE,
//     ENOBUFS, ENOMEM, ECONNABORTED, time-outs...) never ends Serve: Accept
//     pauses (5ms doubling up to 1s, as net/http) and retries.
//   - fasthttp's own log lines (about connections it could not serve) go
//     out as "ingest connection error" with the peer's address and a fixed
//     class of the error only: fasthttp quotes request heads (header values,
//     query strings holding an api_key) in its messages.
//   - Every line a request can cause (rejections, a spool append that
//     failed, a handler panic) is logged through a sampler (at most a few
//     lines a second per message), and rejections are counted in relay_ingest_requests_total and
//     relay_ingest_rejected_requests_total.
//   - Appends run under the server's own context, not the request's:
//     Shutdown lets them finish until its ctx ends, then cancels them.
//   - Shutdown closes at once the connections on which no request is in the
//     handler (silent new ones, idle keep-alive ones; see linger.go), so
//     a client that sends nothing never holds the stop until its read or
//     idle timeout.
//
// # Goroutines
//
// Serve runs fasthttp's accept loop and worker goroutines; each request is
// handled on its connection's goroutine. The Server starts one goroutine per
// lingering connection (linger.go), which ends when the linger does (within
// lingerTimeout, or at once when Shutdown's ctx ends and closes the
// connection); Shutdown returns only after all of them ended. With
// Config.TLS, the TLS handshake runs on the connection's goroutine at its
// first read, within ReadTimeout.
package ingest
