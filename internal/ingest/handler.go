package ingest

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// reqState is the reusable memory of one request.
type reqState struct {
	req   event.Request
	batch spool.Batch
	plain []byte // inflated body
	zr    *gzip.Reader
	br    bytes.Reader
	okey  []byte // one order key
	ip    []byte // client address, text
	lk    []byte // lane cache key
	out   []byte // response body
}

// Pooled memory above these sizes is dropped rather than kept.
const (
	maxPooledBuf    = 1 << 20
	maxPooledEvents = 1 << 14
	maxPooledBatch  = 4 << 20
)

func (s *Server) getState() *reqState { return s.states.Get().(*reqState) }

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
	st.br.Reset(nil)
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
			s.log.Error("ingest handler panic", zap.String("path", pathLabels[p]), zap.Bool("answered", answered),
				zap.Any("panic", r), zap.Stack("stack"))
			if !answered {
				ctx.Response.Reset()
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
		if !ctx.IsPost() {
			ctx.Response.Header.Set(fasthttp.HeaderAllow, "POST")
			s.writeError(ctx, fasthttp.StatusMethodNotAllowed, "Method not allowed")
			return
		}
		st := s.getState()
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

	if e := event.Parse(body, &st.req); e != nil {
		reason := rejectReason(e)
		s.m.reject(reason, len(st.req.Events))
		s.logReject(ctx, p, e.Status, reason, len(st.req.Events))
		ctx.SetStatusCode(e.Status)
		ctx.SetContentTypeBytes(jsonContentType)
		st.out = e.AppendJSON(st.out[:0])
		ctx.SetBody(st.out)
		return
	}
	n := len(st.req.Events)

	lane, err := s.lane(st)
	if err != nil {
		s.spoolFailed(ctx, p, err, n, nil)
		return
	}

	now := s.cfg.Now()
	nowMS := now.UnixMilli()
	st.ip = s.clientIP(ctx, st.ip[:0])
	st.batch.Reset()
	// About what the records take: the events, grown by the rewrites, and
	// their order keys and user ids.
	st.batch.Reserve(len(body) + recordSlack*n)
	for i := range st.req.Events {
		ev := &st.req.Events[i]
		st.okey = ev.OrderKey(st.okey[:0])
		// Rewritten straight into the batch: an insert_id, a time and the
		// client's address are what AppendRewritten may add.
		st.batch.AddFunc(st.okey, ev.UserID, len(ev.Raw)+len(st.ip)+rewriteSlack, func(dst []byte) []byte {
			return ev.AppendRewritten(dst, s.ids, nowMS, st.ip)
		})
	}
	if s.testHook != nil {
		s.testHook(ctx)
	}
	if err := s.sp.Append(s.base, lane, &st.batch); err != nil {
		s.spoolFailed(ctx, p, err, n, lane)
		return
	}
	s.m.accepted.Add(float64(n))

	b := append(st.out[:0], `{"code":200,"events_ingested":`...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, `,"payload_size_bytes":`...)
	b = strconv.AppendInt(b, int64(len(raw)), 10)
	b = append(b, `,"server_upload_time":`...)
	b = strconv.AppendInt(b, nowMS, 10)
	b = append(b, '}')
	st.out = b
	ctx.SetContentTypeBytes(jsonContentType)
	ctx.SetBody(b)
}

// rewriteSlack bounds what AppendRewritten adds to an event besides the
// client's address: `"insert_id":"<36>",` and `"time":<ms>,`.
const rewriteSlack = 96

// recordSlack is what a record usually takes beyond its event's bytes in the
// body: an insert_id and a time filled in, the order key and user id, their
// length prefixes.
const recordSlack = 128

// lane returns the spool lane of st.req, from the cache when it can.
func (s *Server) lane(st *reqState) (*spool.Lane, error) {
	// The key is length-prefixed, so that no api_key/options split of one
	// byte string can collide with another.
	st.lk = strconv.AppendInt(st.lk[:0], int64(len(st.req.APIKey)), 10)
	st.lk = append(st.lk, ':')
	st.lk = append(st.lk, st.req.APIKey...)
	st.lk = append(st.lk, st.req.Options...)

	s.lanesMu.RLock()
	l := s.lanes[string(st.lk)]
	s.lanesMu.RUnlock()
	if l != nil && !l.IsRetired() {
		return l, nil
	}
	if l != nil { // retired (empty and idle): forget it, take the live one
		s.lanesMu.Lock()
		if s.lanes[string(st.lk)] == l {
			delete(s.lanes, string(st.lk))
		}
		s.lanesMu.Unlock()
	}
	l, err := s.sp.Lane(s.base, spool.LaneKey{
		Kind:    spool.KindEvents,
		APIKey:  string(st.req.APIKey),
		Options: string(st.req.Options),
	})
	if err != nil {
		return nil, err
	}
	s.lanesMu.Lock()
	if len(s.lanes) < maxLaneCache {
		s.lanes[string(st.lk)] = l
	}
	s.lanesMu.Unlock()
	return l, nil
}

// clientIP appends the text form of the request's client address to dst.
func (s *Server) clientIP(ctx *fasthttp.RequestCtx, dst []byte) []byte {
	var peer netip.Addr
	if ta, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		peer, _ = netip.AddrFromSlice(ta.IP)
	}
	if !peer.IsValid() {
		peer = netip.IPv4Unspecified()
	}
	var xff [][]byte
	if len(s.cfg.TrustedProxies) > 0 {
		xff = ctx.Request.Header.PeekAll(fasthttp.HeaderXForwardedFor)
	}
	return clientAddr(peer, xff, s.cfg.TrustedProxies).WithZone("").AppendTo(dst)
}

// spoolFailed answers a request whose events could not be spooled.
func (s *Server) spoolFailed(ctx *fasthttp.RequestCtx, p pathIdx, err error, n int, lane *spool.Lane) {
	switch {
	case errors.Is(err, spool.ErrFull):
		s.unavailable(ctx, p, "Spool full, retry later", reasonSpoolFull, n)
	case errors.Is(err, spool.ErrDiskLow):
		s.unavailable(ctx, p, "Disk space low, retry later", reasonDiskLow, n)
	case errors.Is(err, spool.ErrTooManyLanes): // --max-lanes (issue 19)
		s.unavailable(ctx, p, "Too many lanes, retry later", reasonTooManyLanes, n)
	case errors.Is(err, spool.ErrClosed), errors.Is(err, context.Canceled):
		s.unavailable(ctx, p, "Service is shutting down", reasonShuttingDown, n)
	default:
		// A failed commit wrote nothing: 503, so that the client retries.
		s.unavailable(ctx, p, "Service unavailable", reasonSpoolError, n)
		var label string
		if lane != nil {
			label = lane.Label()
		}
		s.log.Error("spool append failed", zap.String("lane", label), zap.Int("events", n), zap.Error(err))
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

// writeError answers {"code":status,"error":msg}; msg needs no escaping.
func (s *Server) writeError(ctx *fasthttp.RequestCtx, status int, msg string) {
	ctx.SetStatusCode(status)
	ctx.SetContentTypeBytes(jsonContentType)
	var buf [128]byte
	b := append(buf[:0], `{"code":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"error":"`...)
	b = append(b, msg...)
	b = append(b, `"}`...)
	ctx.SetBody(b)
}

func (s *Server) logReject(ctx *fasthttp.RequestCtx, p pathIdx, status int, reason string, n int) {
	if ce := s.rejLog.Check(zapcore.InfoLevel, "ingest request rejected"); ce != nil {
		ce.Write(
			zap.String("path", pathLabels[p]),
			zap.Int("status", status),
			zap.String("reason", reason),
			zap.Int("events", n),
			zap.Stringer("remote", ctx.RemoteAddr()),
		)
	}
}

// handleReadError answers requests fasthttp could not read.
func (s *Server) handleReadError(ctx *fasthttp.RequestCtx, err error) {
	p := pathOther
	var (
		status int
		msg    string
		reason string
	)
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		p = classifyPath(ctx.Path())
		status, msg, reason = fasthttp.StatusRequestEntityTooLarge, "Payload too large", reasonTooLarge
	case errors.As(err, &small):
		status, msg, reason = fasthttp.StatusRequestHeaderFieldsTooLarge, "Request header too large", reasonBadHTTP
	case errors.As(err, &ne) && ne.Timeout():
		status, msg, reason = fasthttp.StatusRequestTimeout, "Request timeout", reasonTimeout
	default:
		status, msg, reason = fasthttp.StatusBadRequest, "Malformed HTTP request", reasonBadHTTP
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
