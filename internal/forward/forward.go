package forward

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// Config configures a Forwarder. Zero values mean the documented defaults.
type Config struct {
	// MaxRequestBodyBytes bounds the request body a caller may send through
	// the forwarder; a larger one is answered 413 locally and nothing is
	// sent. 0 means DefaultMaxRequestBodyBytes.
	MaxRequestBodyBytes int
	// DialTimeout bounds connecting to the upstream; 0 means DefaultDialTimeout.
	DialTimeout time.Duration
	// IdleTimeout is the longest the forwarder waits for the next byte from
	// the upstream (the answer's head, or any part of a streamed body) or to
	// write the next part of the request. It is an idle time-out, not a
	// total: a multi-GB answer that keeps flowing is never cut. 0 means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxConnsPerHost bounds the connections to one upstream host; a call
	// waits up to IdleTimeout for a free one. 0 means DefaultMaxConnsPerHost.
	MaxConnsPerHost int
}

// Defaults of Config's zero values.
const (
	DefaultMaxRequestBodyBytes = 32 << 20
	DefaultDialTimeout         = 10 * time.Second
	DefaultIdleTimeout         = 2 * time.Minute
	DefaultMaxConnsPerHost     = 64
)

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	switch {
	case c.MaxRequestBodyBytes < 0:
		return fmt.Errorf("forward: MaxRequestBodyBytes %d < 0", c.MaxRequestBodyBytes)
	case c.DialTimeout < 0:
		return fmt.Errorf("forward: DialTimeout %v < 0", c.DialTimeout)
	case c.IdleTimeout < 0:
		return fmt.Errorf("forward: IdleTimeout %v < 0", c.IdleTimeout)
	case c.MaxConnsPerHost < 0:
		return fmt.Errorf("forward: MaxConnsPerHost %d < 0", c.MaxConnsPerHost)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.MaxRequestBodyBytes == 0 {
		c.MaxRequestBodyBytes = DefaultMaxRequestBodyBytes
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxConnsPerHost == 0 {
		c.MaxConnsPerHost = DefaultMaxConnsPerHost
	}
	return c
}

// Target is where and how one request goes upstream. Build it with Resolve
// (or by hand from configuration): never from the request.
type Target struct {
	// API names the forwarded API in metrics and logs ("scim", "taxonomy").
	API string
	// Base is the upstream base URL from configuration (a --*-url flag or a
	// credentials override): "http(s)://host[:port][/prefix]". The request's
	// path and query are appended to it.
	Base string
	// Authorization, when not empty, is sent as the Authorization header
	// (injected credentials). Empty: the caller's own Authorization header,
	// if any, passes through untouched.
	Authorization string
}

// Errors of Forward; the answer to the caller has been written already.
var (
	// ErrBodyTooLarge is returned when the request body is over
	// Config.MaxRequestBodyBytes (answered 413).
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrBadTarget is returned when the Target's Base is not an absolute
	// http(s) URL (answered 502: a configuration error).
	ErrBadTarget = errors.New("bad upstream base")
	// ErrBadPath is returned when the request path has empty, "." or ".."
	// segments (answered 400).
	ErrBadPath = errors.New("bad request path")
	// ErrUpstream wraps a transport error talking to the upstream (refused,
	// time-out, broken connection; answered 502).
	ErrUpstream = errors.New("upstream unreachable")
)

// Forwarder forwards admin-listener requests to upstream APIs. It is safe
// for concurrent use.
type Forwarder struct {
	cfg    Config
	log    *zap.Logger
	client *fasthttp.Client
	m      metrics
}

type metrics struct {
	requests *prometheus.CounterVec // api, code
	errors   *prometheus.CounterVec // api, reason
	inflight *prometheus.GaugeVec   // api
}

// New returns a Forwarder. log may be nil (no logs); reg may be nil (metrics
// not registered).
func New(cfg Config, log *zap.Logger, reg prometheus.Registerer) (*Forwarder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if log == nil {
		log = zap.NewNop()
	}
	f := &Forwarder{cfg: cfg, log: log}
	f.m = metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relay_forward_requests_total",
			Help: "Requests forwarded to upstream APIs, by API and upstream status (0: no answer).",
		}, []string{"api", "code"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relay_forward_errors_total",
			Help: "Forwarded requests answered locally with an error, by API and reason.",
		}, []string{"api", "reason"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relay_forward_inflight",
			Help: "Forwarded requests waiting for the upstream's answer head.",
		}, []string{"api"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{f.m.requests, f.m.errors, f.m.inflight} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("forward: register metrics: %w", err)
			}
		}
	}
	idle := cfg.IdleTimeout
	dialer := &net.Dialer{Timeout: cfg.DialTimeout}
	f.client = &fasthttp.Client{
		Name:                          "",
		NoDefaultUserAgentHeader:      true,
		DisablePathNormalizing:        true,
		DisableHeaderNamesNormalizing: false,
		StreamResponseBody:            true,
		MaxConnsPerHost:               cfg.MaxConnsPerHost,
		MaxConnWaitTimeout:            idle,
		MaxIdleConnDuration:           30 * time.Second,
		// One attempt: a retried call would count twice against the
		// upstream's rate limits, and a POST must never be sent twice.
		MaxIdemponentCallAttempts: 1,
		Dial: func(addr string) (net.Conn, error) {
			c, err := dialer.Dial("tcp", addr)
			if err != nil {
				return nil, err
			}
			return &idleConn{Conn: c, idle: idle}, nil
		},
	}
	return f, nil
}

// MaxRequestBodyBytes returns the request body bound in effect.
func (f *Forwarder) MaxRequestBodyBytes() int { return f.cfg.MaxRequestBodyBytes }

// idleConn renews its deadline before every read and write: an idle
// time-out that never cuts a transfer that keeps moving.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (c *idleConn) Read(p []byte) (int, error) {
	if err := c.Conn.SetReadDeadline(time.Now().Add(c.idle)); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c *idleConn) Write(p []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.idle)); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// fasthttp clears or sets deadlines itself; ours are renewed per call.
func (c *idleConn) SetDeadline(time.Time) error      { return nil }
func (c *idleConn) SetReadDeadline(time.Time) error  { return nil }
func (c *idleConn) SetWriteDeadline(time.Time) error { return nil }

// hopHeaders are never forwarded in either direction (RFC 9110 7.6.1), nor
// the relay's own and the framing headers that fasthttp sets itself.
var hopHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Host": true, "Content-Length": true, "X-Relay-Project": true,
	// The relay has read the whole body already.
	"Expect": true,
}

// respSkip are response headers the relay's server sets itself.
var respSkip = map[string]bool{"Server": true, "Date": true}

// connectionListed returns the header names listed in Connection (also
// hop-by-hop), canonicalised.
func connectionListed(v []byte) map[string]bool {
	if len(v) == 0 {
		return nil
	}
	m := map[string]bool{}
	for _, n := range strings.Split(string(v), ",") {
		if n = strings.TrimSpace(n); n != "" {
			m[canonical(n)] = true
		}
	}
	return m
}

func canonical(name string) string {
	b := []byte(strings.ToLower(name))
	up := true
	for i, c := range b {
		if up && c >= 'a' && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
		up = c == '-'
	}
	return string(b)
}

// CheckPath reports whether a raw request path is acceptable for
// forwarding: it starts with "/", has no empty segment (but may end in
// "/"), and no segment that is "." or ".." before or after percent
// decoding.
func CheckPath(raw []byte) bool {
	if len(raw) == 0 || raw[0] != '/' {
		return false
	}
	segs := bytes.Split(raw[1:], []byte{'/'})
	for i, s := range segs {
		if len(s) == 0 && i != len(segs)-1 {
			return false
		}
		d, err := unescape(s)
		if err != nil || d == "." || d == ".." {
			return false
		}
	}
	return true
}

// checkBase accepts an absolute http(s) URL with a host and no query.
func checkBase(base string) (string, bool) {
	base = strings.TrimRight(base, "/")
	rest, ok := strings.CutPrefix(base, "http://")
	if !ok {
		rest, ok = strings.CutPrefix(base, "https://")
	}
	if !ok || rest == "" || rest[0] == '/' || strings.ContainsAny(base, "?#@ \t\r\n") {
		return "", false
	}
	return base, true
}

// Forward sends the request in ctx to t.Base + the request's raw path and
// query, and writes the upstream's answer to ctx: status, end-to-end headers
// and the body, streamed (the upstream connection stays open until the
// relay's server has copied the body to the caller; nothing of it is held in
// memory). The method, raw path, query string and body are sent untouched;
// hop-by-hop headers, Host, Proxy-Authorization and X-Relay-Project are
// removed; Authorization is t.Authorization when set, else the caller's.
//
// It returns the upstream's status, or 0 when the answer was written locally
// (then err is one of the package's sentinels, wrapped): 413 body too large,
// 400 bad path, 502 bad target or upstream transport error, each with a
// JSON body {"error": "...", "source": "relay"}. Call Forward at most once
// per request, as the handler's last step.
func (f *Forwarder) Forward(ctx *fasthttp.RequestCtx, t Target) (int, error) {
	api := t.API
	if api == "" {
		api = "other"
	}
	fail := func(status int, reason string, err error, msg string) (int, error) {
		f.m.errors.WithLabelValues(api, reason).Inc()
		WriteError(ctx, status, msg)
		return 0, err
	}
	if len(ctx.Request.Body()) > f.cfg.MaxRequestBodyBytes {
		return fail(fasthttp.StatusRequestEntityTooLarge, "body_too_large", ErrBodyTooLarge,
			fmt.Sprintf("request body larger than the relay's forwarding limit of %d bytes", f.cfg.MaxRequestBodyBytes))
	}
	base, ok := checkBase(t.Base)
	if !ok {
		return fail(fasthttp.StatusBadGateway, "bad_target", ErrBadTarget,
			"the relay's configured upstream base for this API is not an absolute http(s) URL")
	}
	path := ctx.URI().PathOriginal()
	if !CheckPath(path) {
		return fail(fasthttp.StatusBadRequest, "bad_path", ErrBadPath,
			"request path has empty, '.' or '..' segments")
	}

	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	release := func() {
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	}
	uri := make([]byte, 0, len(base)+len(path)+1+len(ctx.URI().QueryString()))
	uri = append(uri, base...)
	uri = append(uri, path...)
	if q := ctx.URI().QueryString(); len(q) > 0 {
		uri = append(append(uri, '?'), q...)
	}
	req.SetRequestURIBytes(uri)
	req.URI().DisablePathNormalizing = true
	req.Header.SetMethodBytes(ctx.Method())
	in := &ctx.Request.Header
	listed := connectionListed(in.Peek(fasthttp.HeaderConnection))
	for k, v := range in.All() {
		name := canonical(string(k))
		if hopHeaders[name] || listed[name] {
			continue
		}
		if name == fasthttp.HeaderAuthorization && t.Authorization != "" {
			continue
		}
		req.Header.AddBytesKV(k, v)
	}
	if t.Authorization != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, t.Authorization)
	}
	if body := ctx.Request.Body(); len(body) > 0 {
		req.SetBodyRaw(body)
	}

	f.m.inflight.WithLabelValues(api).Inc()
	err := f.client.Do(req, resp)
	f.m.inflight.WithLabelValues(api).Dec()
	if err != nil {
		release()
		reason := "transport"
		msg := "upstream " + t.API + " unreachable: " + transportText(err)
		f.log.Warn("forward: upstream error", zap.String("api", api), zap.String("method", string(ctx.Method())),
			zap.ByteString("path", path), zap.String("error", transportText(err)))
		return fail(fasthttp.StatusBadGateway, reason, fmt.Errorf("%w: %w", ErrUpstream, err), msg)
	}
	status := resp.StatusCode()
	f.m.requests.WithLabelValues(api, strconv.Itoa(status)).Inc()

	out := &ctx.Response
	out.Reset()
	out.SetStatusCode(status)
	rlisted := connectionListed(resp.Header.Peek(fasthttp.HeaderConnection))
	for k, v := range resp.Header.All() {
		name := canonical(string(k))
		if hopHeaders[name] || rlisted[name] || respSkip[name] {
			continue
		}
		out.Header.AddBytesKV(k, v)
	}
	if len(resp.Header.ContentType()) == 0 {
		out.Header.SetNoDefaultContentType(true)
	}
	size := resp.Header.ContentLength()
	if size < 0 {
		size = -1 // chunked or until close: the caller gets it chunked
	}
	if body := resp.BodyStream(); body != nil {
		ctx.SetBodyStream(&upstreamBody{r: body, release: release, resp: resp}, size)
	} else {
		// No body stream (e.g. HEAD, 204, 304): copy what there is.
		out.SetBody(resp.Body())
		release()
	}
	return status, nil
}

// upstreamBody is the streamed answer body; the relay's server closes it
// once the body is copied to the caller (or the caller went away), which
// frees the upstream connection and the pooled request and response.
type upstreamBody struct {
	r       io.Reader
	resp    *fasthttp.Response
	release func()
	once    sync.Once
}

func (b *upstreamBody) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *upstreamBody) Close() error {
	var err error
	b.once.Do(func() {
		err = b.resp.CloseBodyStream()
		b.release()
	})
	return err
}

// transportText describes a transport error without any request detail.
func transportText(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrTimeout), errors.As(err, &ne) && ne.Timeout():
		return "time-out"
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return "no free connection"
	case errors.Is(err, fasthttp.ErrConnectionClosed):
		return "connection closed before the answer"
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return "connection refused or failed"
	}
	return "transport error"
}
