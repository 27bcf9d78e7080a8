package ingest

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"math"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// reqState is the reusable memory of one request.
type reqState struct {
	req   event.Request
	batch storage.Batch
	plain []byte // inflated body
	zr    *gzip.Reader
	br    bytes.Reader
	okey  []byte // one order key
	ip    []byte // client address, text
	out   []byte // response body
	ev    []byte // one rewritten event: to measure it, or for AppendIPsReplaced
	big   []int  // event indexes an error body names (413, 429)
}

// Pooled memory above these sizes is dropped rather than kept.
const (
	maxPooledBuf    = 1 << 20
	maxPooledEvents = 1 << 14
	maxPooledBatch  = 4 << 20
)

func (s *Server) putState(st *reqState) {
	if st.batch.Bytes() > maxPooledBatch || cap(st.req.Events) > maxPooledEvents {
		return // let the GC have it all
	}
	st.batch.Reset()
	if cap(st.plain) > maxPooledBuf {
		st.plain = nil
	}
	if cap(st.out) > maxPooledBuf {
		st.out = nil
	}
	s.states.Put(st)
}

var (
	jsonContentType = []byte("application/json")
	bodyHealthy     = []byte("ok\n")
)

// handle is the fasthttp handler of every request.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	p := classifyPath(ctx.Path())
	answered := false // the answer is final: a later panic must not replace it
	defer func() {
		if r := recover(); r != nil {
			s.rejLog.Error("ingest handler panic", zap.String("path", pathLabels[p]), zap.Bool("answered", answered),
				zap.Any("panic", r), zap.Stack("stack"))
			if !answered {
				ctx.Response.Reset()
				if pol := s.st().corsPol; pol != nil && p <= pathBatch {
					pol.setHeaders(ctx)
				}
				s.m.reject(reasonPanic, 0)
				s.writeError(ctx, fasthttp.StatusInternalServerError, "Internal server error")
			}
		}
		s.m.request(p, ctx.Response.StatusCode())
		s.m.seconds.Observe(time.Since(start).Seconds())
	}()
	switch p {
	case pathHealthz:
		if !ctx.IsGet() && !ctx.IsHead() {
			ctx.Response.Header.Set(fasthttp.HeaderAllow, "GET, HEAD")
			s.writeError(ctx, fasthttp.StatusMethodNotAllowed, "Method not allowed")
			return
		}
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBody(bodyHealthy)
	case pathOther:
		if ctx.IsPost() {
			s.rejectf(ctx, p, fasthttp.StatusBadRequest, "Invalid request path", reasonInvalidRequest, 0)
			return
		}
		s.writeError(ctx, fasthttp.StatusNotFound, "Not found")
	default:
		if pol := s.st().corsPol; pol != nil && s.cors(ctx, p, pol) {
			answered = true
			return
		}
		if !ctx.IsPost() {
			ctx.Response.Header.Set(fasthttp.HeaderAllow, "POST")
			s.writeError(ctx, fasthttp.StatusMethodNotAllowed, "Method not allowed")
			return
		}
		st := s.states.Get().(*reqState)
		s.ingest(ctx, p, st)
		answered = true
		s.putState(st) // skipped on panic: the state may be inconsistent
	}
}

// ingest handles a POST of an envelope.
func (s *Server) ingest(ctx *fasthttp.RequestCtx, p pathIdx, st *reqState) {
	if s.closing.Load() {
		s.unavailable(ctx, p, "Service is shutting down", reasonShuttingDown, 0)
		return
	}
	raw := ctx.PostBody()
	s.m.bytes.Observe(float64(len(raw)))

	body := raw
	switch parseEncoding(ctx.Request.Header.ContentEncoding()) {
	case encIdentity:
		if len(raw) > s.maxBody {
			s.rejectf(ctx, p, fasthttp.StatusRequestEntityTooLarge, "Payload too large", reasonTooLarge, 0)
			return
		}
	case encGzip:
		var err error
		st.plain, st.zr, err = gunzipCapped(st.plain, st.zr, &st.br, raw, s.maxBody)
		st.br.Reset(nil)
		switch {
		case errors.Is(err, errTooLarge):
			s.rejectf(ctx, p, fasthttp.StatusRequestEntityTooLarge, "Payload too large", reasonTooLarge, 0)
			return
		case err != nil:
			s.rejectf(ctx, p, fasthttp.StatusBadRequest, "Invalid gzip request body", reasonBadGzip, 0)
			return
		}
		body = st.plain
	default:
		s.rejectf(ctx, p, fasthttp.StatusUnsupportedMediaType, "Unsupported Content-Encoding", reasonUnsupportedEncoding, 0)
		return
	}

	st.req.PlanMembers = s.plan != nil && s.plan.Checking()
	if e := event.Parse(body, &st.req); e != nil {
		st.out = e.AppendJSON(st.out[:0])
		s.reject(ctx, p, e.Status, rejectReason(e), len(st.req.Events), st.out)
		return
	}
	n := len(st.req.Events)
	op := s.st()
	if !op.apiKeyAllowed(st.req.APIKey) {
		s.rejectf(ctx, p, fasthttp.StatusForbidden, "API key not allowed", reasonAPIKeyNotAllowed, n)
		return
	}
	addr := s.requestClient(ctx)
	if op.limiter != nil {
		if ok, wait := op.limiter.allow(addr); !ok {
			s.rateLimited(ctx, p, st, n, wait)
			return
		}
	}
	if op.anonIP {
		addr = anonymizeAddr(addr)
	}
	st.ip = addr.AppendTo(st.ip[:0])
	now := s.cfg.Now()
	nowMS := now.UnixMilli()
	var nowBuf [20]byte
	nowText := strconv.AppendInt(nowBuf[:0], nowMS, 10) // formatted once for all events
	if s.tooLarge(ctx, p, st, nowText) {
		return
	}

	st.batch.Reset()
	var clean func(*event.Request, *event.Event) bool // nil: the plan is off for these events
	if s.plan != nil {
		var verdict uint64
		if verdict, clean = s.plan.Vet(st.req.APIKey); clean != nil {
			st.batch.Vet(verdict)
		}
	}
	// About what the records take: the events, grown by the rewrites, and
	// their order keys and user ids.
	st.batch.Reserve(len(body) + recordSlack*n)
	for i := range st.req.Events {
		ev := &st.req.Events[i]
		st.okey = ev.OrderKey(st.okey[:0])
		// Rewritten straight into the batch: an insert_id, a time and the
		// client's address are what AppendRewritten may add.
		st.batch.AddFunc(st.okey, ev.UserID, len(ev.Raw)+len(st.ip)+rewriteSlack, func(dst []byte) []byte {
			if op.anonIP && ev.HasGivenIP() {
				// The ips the client gave, anonymized too.
				st.ev = ev.AppendRewritten(st.ev[:0], s.ids, nowText, st.ip)
				return event.AppendIPsReplaced(dst, st.ev, appendAnonymizedIP)
			}
			return ev.AppendRewritten(dst, s.ids, nowText, st.ip)
		})
		// Checked against the plan where the parser left it, in the cache.
		if clean != nil && clean(&st.req, ev) {
			st.batch.MarkClean()
		}
	}
	if s.testHook != nil {
		s.testHook(ctx)
	}
	// No request id: the fleet makes a fresh one, the local spool needs none.
	req := storage.Request{Kind: storage.KindEvents, APIKey: st.req.APIKey, Options: st.req.Options, Accepted: now, Batch: &st.batch}
	if err := s.store.Append(s.base, req); err != nil {
		s.spoolFailed(ctx, p, err, &req, n)
		return
	}
	s.m.accepted.Add(float64(n))

	b := append(st.out[:0], `{"code":200,"events_ingested":`...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, `,"payload_size_bytes":`...)
	b = strconv.AppendInt(b, int64(len(raw)), 10)
	b = append(b, `,"server_upload_time":`...)
	b = strconv.AppendInt(b, nowMS, 10)
	st.out = append(b, '}')
	answerJSON(ctx, fasthttp.StatusOK, st.out)
}

// tooLarge answers 413 and returns true when an event of st.req cannot fit
// alone in one upstream request under MaxBatchBytes with its envelope, as it
// would be spooled (rewritten): delivery could only dead-letter it. The
// body is the upstream's 413 naming the indexes in events_too_large.
func (s *Server) tooLarge(ctx *fasthttp.RequestCtx, p pathIdx, st *reqState, nowMS []byte) bool {
	// A bound of the envelope first: marshalling the api_key (what the
	// exact figure takes) costs allocations on every request, and is only
	// needed when an event is near the limit.
	maxBatch := int(s.maxBatch.Load())
	limit := maxBatch - event.MaxEnvelopeOverhead(len(st.req.APIKey), st.req.Options)
	exact := false
	st.big = st.big[:0]
	for i := range st.req.Events {
		ev := &st.req.Events[i]
		if len(ev.Raw)+maxIPText+rewriteSlack < limit {
			continue // fits whatever the rewrite adds
		}
		if !exact {
			limit = maxBatch - event.EnvelopeOverhead(string(st.req.APIKey), st.req.Options)
			exact = true
			if len(ev.Raw)+maxIPText+rewriteSlack < limit {
				continue
			}
		}
		// Near the limit: measure the rewritten event exactly (the
		// insert_id drawn here is thrown away; its length is fixed).
		st.ev = ev.AppendRewritten(st.ev[:0], s.ids, nowMS, st.ip)
		if len(st.ev) >= limit {
			st.big = append(st.big, i)
		}
	}
	if cap(st.ev) > maxPooledBuf {
		st.ev = nil
	}
	if len(st.big) == 0 {
		return false
	}
	st.out = append(event.AppendIndexes(append(st.out[:0], `{"code":413,"error":"Payload too large","events_too_large":`...), st.big), '}')
	s.reject(ctx, p, fasthttp.StatusRequestEntityTooLarge, reasonTooLarge, len(st.req.Events), st.out)
	return true
}

// maxIPText bounds the quoted text of a client address AppendRewritten may
// write.
const maxIPText = 64

// rewriteSlack bounds what AppendRewritten adds to an event besides the
// client's address: `"insert_id":"<36>",` and `"time":<ms>,`.
const rewriteSlack = 96

// recordSlack is what a record usually takes beyond its event's bytes in the
// body: an insert_id and a time filled in, the order key and user id, their
// length prefixes.
const recordSlack = 128

// requestClient returns the request's client address (see the package
// documentation), without a zone.
func (s *Server) requestClient(ctx *fasthttp.RequestCtx) netip.Addr {
	var xff [][]byte
	if len(s.cfg.TrustedProxies) > 0 {
		xff = ctx.Request.Header.PeekAll(fasthttp.HeaderXForwardedFor)
	}
	return clientAddr(peerAddr(ctx), xff, s.cfg.TrustedProxies).WithZone("")
}

// peerAddr is the TCP peer's address; the unspecified IPv4 address when
// there is none.
func peerAddr(ctx *fasthttp.RequestCtx) netip.Addr {
	var peer netip.Addr
	if ta, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		peer, _ = netip.AddrFromSlice(ta.IP)
	}
	if !peer.IsValid() {
		peer = netip.IPv4Unspecified()
	}
	return peer
}

// rateLimited answers a request over its client's rate: 429 with
// Retry-After (wait rounded up to whole seconds) and, as the upstream's 429
// does, throttled_events naming every event of the request, which makes
// the official SDKs hold them back (30 s) instead of retrying at once.
func (s *Server) rateLimited(ctx *fasthttp.RequestCtx, p pathIdx, st *reqState, n int, wait time.Duration) {
	secs := max(int64(math.Ceil(wait.Seconds())), 1)
	var buf [20]byte
	ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, string(strconv.AppendInt(buf[:0], secs, 10)))
	st.big = st.big[:0]
	for i := range n {
		st.big = append(st.big, i)
	}
	st.out = append(event.AppendIndexes(append(st.out[:0], `{"code":429,"error":"Too many requests for this client","throttled_events":`...), st.big), '}')
	s.reject(ctx, p, fasthttp.StatusTooManyRequests, reasonClientRateLimit, n, st.out)
}

// spoolFailed answers a request the store did not take: 503 with
// Retry-After in every case (the client retries; nothing of the request was
// stored, or, after storage.ErrUnavailable, possibly all of it, which the
// upstream deduplicates by insert_id).
func (s *Server) spoolFailed(ctx *fasthttp.RequestCtx, p pathIdx, err error, req *storage.Request, n int) {
	switch {
	case errors.Is(err, spool.ErrDiskLow): // before ErrFull, which the store wraps it in
		s.unavailable(ctx, p, "Disk space low, retry later", reasonDiskLow, n)
	case errors.Is(err, storage.ErrFull), errors.Is(err, spool.ErrFull):
		s.unavailable(ctx, p, "Spool full, retry later", reasonSpoolFull, n)
	case errors.Is(err, spool.ErrTooManyKeyLanes): // --max-lanes-per-key, before ErrTooManyLanes, which it wraps
		s.unavailable(ctx, p, "Too many lanes for this api_key (options variants), retry later", reasonTooManyKeyLanes, n)
	case errors.Is(err, spool.ErrTooManyLanes): // --max-lanes
		s.unavailable(ctx, p, "Too many lanes, retry later", reasonTooManyLanes, n)
	case errors.Is(err, spool.ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, storage.ErrLost), s.closing.Load():
		s.unavailable(ctx, p, "Service is shutting down", reasonShuttingDown, n)
	default:
		s.unavailable(ctx, p, "Service unavailable", reasonSpoolError, n)
		s.rejLog.Error("spool append failed", zap.String("lane", req.Lane().Label()), zap.Int("events", n), zap.Error(err))
	}
}

// unavailable answers 503 with Retry-After.
func (s *Server) unavailable(ctx *fasthttp.RequestCtx, p pathIdx, msg, reason string, n int) {
	ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, s.retryAfter)
	s.rejectf(ctx, p, fasthttp.StatusServiceUnavailable, msg, reason, n)
}

// rejectf counts, logs (sampled) and answers a rejection with the upstream's
// error body shape.
func (s *Server) rejectf(ctx *fasthttp.RequestCtx, p pathIdx, status int, msg, reason string, n int) {
	s.m.reject(reason, n)
	s.logReject(ctx, p, status, reason, n)
	s.writeError(ctx, status, msg)
}

// reject counts, logs (sampled) and answers a rejection of a request of n
// events with the JSON body b.
func (s *Server) reject(ctx *fasthttp.RequestCtx, p pathIdx, status int, reason string, n int, b []byte) {
	s.m.reject(reason, n)
	s.logReject(ctx, p, status, reason, n)
	answerJSON(ctx, status, b)
}

// writeError answers {"code":status,"error":msg}; msg needs no escaping.
func (s *Server) writeError(ctx *fasthttp.RequestCtx, status int, msg string) {
	var buf [128]byte
	b := append(buf[:0], `{"code":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"error":"`...)
	b = append(b, msg...)
	answerJSON(ctx, status, append(b, `"}`...))
}

// answerJSON answers status with the JSON body b (copied).
func answerJSON(ctx *fasthttp.RequestCtx, status int, b []byte) {
	ctx.SetStatusCode(status)
	ctx.SetContentTypeBytes(jsonContentType)
	ctx.SetBody(b)
}

func (s *Server) logReject(ctx *fasthttp.RequestCtx, p pathIdx, status int, reason string, n int) {
	if ce := s.rejLog.Check(zapcore.InfoLevel, "ingest request rejected"); ce != nil {
		ce.Write(
			zap.String("path", pathLabels[p]),
			zap.Int("status", status),
			zap.String("reason", reason),
			zap.Int("events", n),
			s.remoteField(ctx),
		)
	}
}

// handleReadError answers requests fasthttp could not read.
func (s *Server) handleReadError(ctx *fasthttp.RequestCtx, err error) {
	p, status, msg, reason := pathOther, fasthttp.StatusBadRequest, "Malformed HTTP request", reasonBadHTTP
	switch errorClass(err) {
	case classBodyTooLarge:
		p = classifyPath(ctx.Path())
		status, msg, reason = fasthttp.StatusRequestEntityTooLarge, "Payload too large", reasonTooLarge
	case classHeaderTooLarge:
		status, msg = fasthttp.StatusRequestHeaderFieldsTooLarge, "Request header too large"
	case classTimeout:
		status, msg, reason = fasthttp.StatusRequestTimeout, "Request timeout", reasonTimeout
	}
	s.rejectf(ctx, p, status, msg, reason, 0)
	s.m.request(p, status)
}

// rejectReason is the reason label of an event.Error.
func rejectReason(e *event.Error) string {
	switch {
	case len(e.InvalidFields) > 0:
		return reasonInvalidFields
	case len(e.MissingFields) > 0:
		return reasonMissingFields
	case e.MissingField != "":
		return reasonMissingField
	case e.Status == fasthttp.StatusRequestEntityTooLarge:
		return reasonTooLarge
	}
	switch e.Msg {
	case "Invalid JSON request body":
		return reasonInvalidJSON
	case "Invalid event JSON":
		return reasonInvalidEventJSON
	case "Missing request body":
		return reasonMissingBody
	case "Invalid API key":
		return reasonInvalidAPIKey
	}
	return reasonInvalidRequest
}

// remoteField is the log field of the request's peer; anonymized under
// AnonymizeIP (the port is dropped then too).
func (s *Server) remoteField(ctx *fasthttp.RequestCtx) zap.Field {
	if s.st().anonIP {
		return zap.Stringer("remote", anonymizeAddr(peerAddr(ctx)))
	}
	return zap.Stringer("remote", ctx.RemoteAddr())
}
