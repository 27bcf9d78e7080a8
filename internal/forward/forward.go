package forward

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/credentials"
)

// Config configures a Forwarder. Zero values mean the documented defaults.
type Config struct {
	// MaxRequestBodyBytes bounds the request body a caller may send through
	// the forwarder; a larger one is answered 413 locally. 0 means
	// DefaultMaxRequestBodyBytes.
	MaxRequestBodyBytes int
	// IdleTimeout is the longest the forwarder waits for the next byte from
	// the upstream (the answer's head, or any part of a streamed body), to
	// write the next part of the request upstream, or for the caller to take
	// the next part of the answer. It is an idle time-out, not a total: a
	// multi-GB answer that keeps flowing is never cut. 0 means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
}

// Defaults of Config's zero values.
const (
	DefaultMaxRequestBodyBytes = 32 << 20
	DefaultIdleTimeout         = 2 * time.Minute
)

// The transport's fixed bounds: connecting (and the TLS handshake), and the
// connections to one upstream host (a call waits for a free one).
const (
	dialTimeout     = 10 * time.Second
	maxConnsPerHost = 64
)

// Target is where, how and for whom one request goes upstream. Resolve
// builds it from configuration, never from the request.
type Target struct {
	// API names the forwarded API in metrics and logs ("scim", "taxonomy").
	API string
	// Base is the upstream base URL from configuration (a --*-url flag or a
	// credentials override): "http(s)://host[:port][/prefix]". The routed
	// request path and the query are appended to it.
	Base string
	// Authorization, when not empty, is sent as the Authorization header
	// (injected credentials). Empty: the caller's own Authorization header,
	// if any, passes through untouched.
	Authorization string
	// Key identifies the caller's upstream account for client-side limits:
	// "project:NAME" or "org:NAME" (by the scheme's scope) when known, else
	// "auth:" and a short SHA-256 of the caller's Authorization (the secret
	// itself is never kept), or "anonymous".
	Key string
}

// ErrBodyTooLarge is returned (wrapped) by DecodedBody for a body over its
// limit (answered 413).
var ErrBodyTooLarge = errors.New("request body too large")

// Forwarder forwards admin-listener requests to upstream APIs with one
// httputil.ReverseProxy per redirect policy over one http.Transport. It is
// safe for concurrent use.
type Forwarder struct {
	cfg       Config
	creds     *credentials.Ref
	log       *zap.Logger
	reg       prometheus.Registerer
	transport *http.Transport
	proxy     *httputil.ReverseProxy
	m         metrics
}

type metrics struct {
	requests *prometheus.CounterVec // api, code
	errors   *prometheus.CounterVec // api, reason
	inflight *prometheus.GaugeVec   // api
}

// New returns a Forwarder. creds is the credentials file in force (read at
// every request, so a reload takes effect at once; nil: none). log may be
// nil (no logs); reg may be nil (metrics not registered).
func New(cfg Config, creds *credentials.Ref, log *zap.Logger, reg prometheus.Registerer) (*Forwarder, error) {
	if cfg.MaxRequestBodyBytes < 0 || cfg.IdleTimeout < 0 {
		return nil, fmt.Errorf("forward: MaxRequestBodyBytes %d or IdleTimeout %v < 0", cfg.MaxRequestBodyBytes, cfg.IdleTimeout)
	}
	cfg.MaxRequestBodyBytes = cmp.Or(cfg.MaxRequestBodyBytes, DefaultMaxRequestBodyBytes)
	cfg.IdleTimeout = cmp.Or(cfg.IdleTimeout, DefaultIdleTimeout)
	log = cmp.Or(log, zap.NewNop())
	// Every line here is one a caller can cause (an upstream that is down
	// for everyone's calls, a caller that goes away mid-answer): sampled per
	// message, a few a minute; relay_forward_errors_total counts them all.
	log = log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Minute, 5, 0)
	}))
	f := &Forwarder{cfg: cfg, creds: creds, log: log, reg: reg}
	f.m = metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relay_forward_requests_total",
			Help: "Requests forwarded to upstream APIs, by API and upstream status.",
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
	dialer := &net.Dialer{Timeout: dialTimeout}
	f.transport = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &idleConn{Conn: c, idle: idle}, nil
		},
		MaxConnsPerHost:       maxConnsPerHost,
		MaxIdleConnsPerHost:   maxConnsPerHost,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: idle,
		TLSHandshakeTimeout:   dialTimeout,
		ForceAttemptHTTP2:     true,
		// Bodies are passed as they are (a gzip answer stays gzip).
		DisableCompression: true,
	}
	f.proxy = f.newProxy(f.transport)
	return f, nil
}

// Close closes the upstream connections kept alive.
func (f *Forwarder) Close() { f.transport.CloseIdleConnections() }

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

// targetKey carries a request's *Target from Forward to the proxy's Rewrite.
type targetKey struct{}

// newProxy returns the ReverseProxy of the relay's header rules over rt.
func (f *Forwarder) newProxy(rt http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Transport: rt,
		Rewrite:   rewrite,
		ModifyResponse: func(resp *http.Response) error {
			// The relay's server sets its own.
			resp.Header.Del("Server")
			return nil
		},
		ErrorHandler: f.proxyError,
		// ReverseProxy's own lines: a caller gone mid-answer, a body copy
		// cut short.
		ErrorLog: stdlog.New(adminroute.LogLines{Log: f.log, Msg: "forward: proxy error"}, "", 0),
	}
}

// rewrite applies the package doc's rules: Target's Base, then the routed
// path and the caller's query; ReverseProxy itself drops the hop-by-hop and
// X-Forwarded-* headers.
func rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(targetKey{}).(*Target)
	base, _ := url.Parse(strings.TrimRight(t.Base, "/")) // checked by forward
	out := pr.Out
	out.URL = &url.URL{
		Scheme:   base.Scheme,
		Host:     base.Host,
		Path:     base.Path + pr.In.URL.Path,
		RawPath:  base.EscapedPath() + pr.In.URL.EscapedPath(),
		RawQuery: pr.In.URL.RawQuery,
	}
	out.Host = ""
	out.Header.Del("Proxy-Authorization")
	out.Header.Del(admintoken.HeaderProject)
	out.Header.Del("Expect")
	if t.Authorization != "" {
		out.Header.Set("Authorization", t.Authorization)
	}
}

// forward sends r through proxy to t (see rewrite) and streams the answer
// to w. It returns the upstream's status, or 0 when it answered locally
// (WriteError; counted in relay_forward_errors_total by reason).
func (f *Forwarder) forward(w http.ResponseWriter, r *http.Request, t Target, proxy *httputil.ReverseProxy) int {
	t.API = cmp.Or(t.API, "other")
	fail := func(status int, reason string, msg string) int {
		f.m.errors.WithLabelValues(t.API, reason).Inc()
		WriteError(w, status, msg)
		return 0
	}
	if r.ContentLength > int64(f.cfg.MaxRequestBodyBytes) {
		return fail(http.StatusRequestEntityTooLarge, "body_too_large", f.tooLarge())
	}
	if u, ok := baseurl.Parse(t.Base); !ok || u.User != nil {
		return fail(http.StatusBadGateway, "bad_target", "the relay's configured upstream base for this API is not an absolute http(s) URL")
	}
	if !adminroute.CheckPath(adminroute.RawPath(r)) {
		return fail(http.StatusBadRequest, "bad_path",
			"request path refused: it has an empty, '.' or '..' segment, an escaped '/', '\\', '.' or '%', or ';'")
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = http.MaxBytesReader(w, r.Body, int64(f.cfg.MaxRequestBodyBytes))
	}
	rec := &recorder{StatusWriter: adminroute.StatusWriter{ResponseWriter: w}, idle: f.cfg.IdleTimeout, rc: http.NewResponseController(w)}
	rec.renew()
	ctx := context.WithValue(r.Context(), targetKey{}, &t)
	in := f.m.inflight.WithLabelValues(t.API)
	in.Inc()
	proxy.ServeHTTP(rec, r.WithContext(ctx))
	in.Dec()
	if rec.local {
		return 0
	}
	f.m.requests.WithLabelValues(t.API, strconv.Itoa(rec.Status)).Inc()
	return rec.Status
}

func (f *Forwarder) tooLarge() string {
	return fmt.Sprintf("request body larger than the relay's forwarding limit of %d bytes", f.cfg.MaxRequestBodyBytes)
}

// proxyError answers a request the proxy could not complete: 413 when the
// caller's body passed the limit, else 502 (nothing is retried: a retry
// would count twice against the upstream's rate limits).
func (f *Forwarder) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	t := r.Context().Value(targetKey{}).(*Target)
	if rec, ok := w.(*recorder); ok {
		rec.local = true
	}
	reason, status, msg := "body_too_large", http.StatusRequestEntityTooLarge, f.tooLarge()
	if !errors.As(err, new(*http.MaxBytesError)) {
		reason, status, msg = "transport", http.StatusBadGateway, "upstream "+t.API+" unreachable: "+transportText(err)
		f.log.Warn("forward: upstream error", zap.String("api", t.API), zap.String("method", r.Method),
			zap.String("path", r.URL.Path), zap.String("error", transportText(err)))
	}
	f.m.errors.WithLabelValues(t.API, reason).Inc()
	WriteError(w, status, msg)
}

// recorder keeps the status written and renews the caller connection's
// write deadline as the answer flows: the caller may take as long as it
// keeps reading, and one that stops reading for the idle time-out is cut.
type recorder struct {
	adminroute.StatusWriter
	rc      *http.ResponseController
	idle    time.Duration
	renewAt time.Time
	local   bool // answered by proxyError
}

func (w *recorder) renew() {
	if now := time.Now(); !now.Before(w.renewAt) {
		_ = w.rc.SetWriteDeadline(now.Add(w.idle)) // not supported: the server's WriteTimeout stands
		w.renewAt = now.Add(w.idle / 8)
	}
}

func (w *recorder) Write(p []byte) (int, error) {
	w.renew()
	return w.StatusWriter.Write(p)
}

// WriteError answers locally: status and {"error": msg, "source": "relay"}
// (application/json), so that callers can tell the relay's own answers from
// the upstream's.
func WriteError(w http.ResponseWriter, status int, msg string) {
	adminroute.WriteJSON(w, status, struct {
		Error  string `json:"error"`
		Source string `json:"source"`
	}{msg, "relay"})
}

// transportText describes a transport error without any request detail.
func transportText(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "time-out"
	case errors.Is(err, context.Canceled):
		return "the caller went away"
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return "connection refused or failed"
	}
	return "connection closed before the answer"
}
