package adminapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
)

// Config configures a Server.
type Config struct {
	// Ready reports why the relay is not ready (spool closed, delivery not
	// running); nil error means ready. A nil Ready means always ready.
	Ready func() error
	// ReadyInfo returns lines added to /readyz's body whatever its status
	// (e.g. whether the upstream answers); nil adds none.
	ReadyInfo func() string
	// Gatherer is the registry served on /metrics; nil means
	// prometheus.NewRegistry() (empty).
	Gatherer prometheus.Gatherer
	// Token is the admin token required on every route but /healthz,
	// /readyz and /metrics, where the route's admintoken.Mode says; nil
	// means no admin token: every route is open (the token headers are
	// still stripped before a handler sees the request). SetToken replaces
	// it at run time.
	Token *admintoken.Token
	// WriteTimeout bounds writing one response; 0 means DefaultWriteTimeout
	// (long enough for a 30s CPU profile). Forwarded answers renew their
	// own idle deadline instead (internal/forward).
	WriteTimeout time.Duration
	// MaxRequestBodySize bounds request bodies; 0 means DefaultMaxRequestBodySize.
	MaxRequestBodySize int
}

// Defaults of Config, and the bound of reading one request.
const (
	DefaultWriteTimeout       = 5 * time.Minute
	DefaultMaxRequestBodySize = 32 << 20
	readTimeout               = 30 * time.Second
)

// Server is the admin listener: an http.Server over an http.ServeMux.
// Register routes with Handle (open) or Register before Serve.
type Server struct {
	cfg   Config
	log   *zap.Logger
	srv   *http.Server
	mux   *http.ServeMux
	token atomic.Pointer[admintoken.Token]

	requests          *prometheus.CounterVec // relay_admin_requests_total{route,code}
	scrapeWriteErrors prometheus.Counter     // relay_admin_metrics_write_errors_total
	scrapeLog         *zap.Logger            // sampled: a line a minute

	mu       sync.Mutex            // guards fresh
	fresh    map[net.Conn]struct{} // connections that have sent nothing yet
	stopping atomic.Bool           // Shutdown began
}

// New returns a server with /healthz, /readyz, /metrics and /debug/pprof/
// registered. log and reg may be nil. It registers
// relay_admin_requests_total{route,code} (route is the registered pattern,
// "unmatched" when none matched, "refused" for a path CheckPath refused;
// never the request's own path or query).
func New(cfg Config, log *zap.Logger, reg prometheus.Registerer) (*Server, error) {
	if cfg.WriteTimeout < 0 || cfg.MaxRequestBodySize < 0 {
		return nil, errors.New("adminapi: negative timeout or size")
	}
	cfg.WriteTimeout = cmp.Or(cfg.WriteTimeout, DefaultWriteTimeout)
	cfg.MaxRequestBodySize = cmp.Or(cfg.MaxRequestBodySize, DefaultMaxRequestBodySize)
	if cfg.Gatherer == nil {
		cfg.Gatherer = prometheus.NewRegistry()
	}
	log = cmp.Or(log, zap.NewNop())
	s := &Server{cfg: cfg, log: log, mux: http.NewServeMux(), fresh: make(map[net.Conn]struct{})}
	s.token.Store(cfg.Token)
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relay_admin_requests_total",
		Help: "Admin listener requests by registered route and status code (401/403: token refused).",
	}, []string{"route", "code"})
	s.scrapeWriteErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "relay_admin_metrics_write_errors_total",
		Help: "Scrapes of /metrics whose answer could not be written in full (the scraper went away).",
	})
	if reg != nil {
		for _, c := range []prometheus.Collector{s.requests, s.scrapeWriteErrors} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("adminapi metrics: %w", err)
			}
		}
	}
	// Lines a client can cause (a scraper that goes away, a failed TLS
	// handshake, a panic a request provokes) are sampled per message: a
	// flood of them costs a few lines a minute, and the counters say how
	// many there were.
	sampled := func(first int) *zap.Logger {
		return log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			return zapcore.NewSamplerWithOptions(c, time.Minute, first, 0)
		}))
	}
	s.scrapeLog = sampled(1)
	s.srv = &http.Server{
		Handler:           http.HandlerFunc(s.serve),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       readTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ConnState:         s.connState,
		// net/http's own lines (TLS handshake errors, panics) go to the log
		// with quoted fragments and query strings redacted.
		ErrorLog: stdlog.New(adminroute.LogLines{Log: sampled(5), Msg: "admin listener",
			Redact: func(s string) string { return redactQuoted(redactQuery(s)) }}, "", 0),
	}

	s.Handle(http.MethodGet, "/healthz", http.HandlerFunc(s.healthz))
	s.Handle(http.MethodGet, "/readyz", http.HandlerFunc(s.readyz))
	s.Handle(http.MethodGet, "/metrics", s.metrics(cfg.Gatherer))
	s.Register(
		own(http.MethodGet, "/debug/pprof/", pprof.Index),
		own(http.MethodGet, "/debug/pprof/cmdline", cmdline),
		own(http.MethodGet, "/debug/pprof/profile", pprof.Profile),
		own(http.MethodGet, "/debug/pprof/symbol", pprof.Symbol),
		own(http.MethodPost, "/debug/pprof/symbol", pprof.Symbol),
		own(http.MethodGet, "/debug/pprof/trace", pprof.Trace),
	)
	return s, nil
}

// own is a route of the relay's own (admintoken.ModeOwn).
func own(method, path string, h http.HandlerFunc) adminroute.Route {
	return adminroute.Route{Method: method, Path: path, Mode: admintoken.ModeOwn, Handler: h}
}

// Handle registers h for method and path (an http.ServeMux pattern path;
// GET also serves HEAD) as an OPEN route, with no admin token check: only
// /healthz, /readyz and /metrics are open by the contract; everything else
// goes through Register. Registering a pattern twice panics, as
// http.ServeMux does: it is a programming error.
func (s *Server) Handle(method, path string, h http.Handler) {
	s.mux.Handle(method+" "+path, s.bounded(0, h))
}

// bounded bounds the request body h reads to limit, or to the listener's
// MaxRequestBodySize when limit is 0. The bound is the route's, not the
// listener's alone: a backfill's input may be far larger than any other
// body.
func (s *Server) bounded(limit int64, h http.Handler) http.Handler {
	limit = cmp.Or(limit, int64(s.cfg.MaxRequestBodySize))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = http.MaxBytesReader(w, r.Body, limit)
		}
		h.ServeHTTP(w, r)
	})
}

// Register registers routes (the relay's own, group identify, user
// mapping, forwarded APIs), each behind the admin token check of its Mode:
// a request reaching a Handler passed the check and has had the admin
// token removed from its headers (admintoken.Token.Strip).
func (s *Server) Register(routes ...adminroute.Route) {
	for _, r := range routes {
		if r.Handler == nil {
			panic(fmt.Sprintf("adminapi: nil handler for %s", r.Pattern()))
		}
		mode, next := r.Mode, r.Handler
		s.mux.Handle(r.Pattern(), s.bounded(r.MaxBody, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			s.token.Load().Require(mode, next).ServeHTTP(w, req)
		})))
	}
}

// SetToken puts t in force for every later request (nil: no admin token),
// e.g. after a reload of the token file.
func (s *Server) SetToken(t *admintoken.Token) { s.token.Store(t) }

// Serve serves on ln (a TLS listener serves HTTPS) until Shutdown; it
// returns nil after Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("admin listener: %w", err)
	}
	return nil
}

// Shutdown stops accepting, closes idle connections and connections that
// have sent nothing yet (net/http alone waits 5 s for those), and waits for
// open requests until ctx ends; then it closes the rest.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopping.Store(true)
	done := make(chan error, 1)
	go func() { done <- s.srv.Shutdown(ctx) }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		s.closeFresh()
		select {
		case err := <-done:
			if err != nil {
				s.srv.Close()
				return fmt.Errorf("admin listener shutdown: %w", err)
			}
			return nil
		case <-tick.C:
		}
	}
}

// connState keeps the connections that have not sent a byte yet.
func (s *Server) connState(c net.Conn, st http.ConnState) {
	s.mu.Lock()
	if st == http.StateNew {
		s.fresh[c] = struct{}{}
	} else {
		delete(s.fresh, c)
	}
	s.mu.Unlock()
	if st == http.StateNew && s.stopping.Load() {
		s.closeFresh()
	}
}

// closeFresh closes the connections that have sent nothing: no request is
// lost, as if the listener had closed a moment before they connected.
func (s *Server) closeFresh() {
	s.mu.Lock()
	var cs []net.Conn
	for c := range s.fresh {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// serve refuses paths adminroute.CheckPath refuses (400, before routing,
// so routing and forwarding see one path), bounds the body, routes, and
// counts the answer by the pattern that served it.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	sw := &adminroute.StatusWriter{ResponseWriter: w}
	label := "refused"
	defer func() {
		s.requests.WithLabelValues(label, strconv.Itoa(cmp.Or(sw.Status, http.StatusOK))).Inc()
	}()
	if !adminroute.CheckPath(adminroute.RawPath(r)) {
		// JSON with "source":"relay", like every local answer on a
		// forwarded path; the reason names no request content.
		sw.Header().Set("Content-Type", "application/json")
		sw.Header().Set("Connection", "close")
		sw.WriteHeader(http.StatusBadRequest)
		io.WriteString(sw, `{"error":"request path refused: it has an empty, '.' or '..' segment, an escaped '/', '\\', '.', '%' or ';', or bytes that are not printable ASCII; nothing was forwarded","source":"relay"}`+"\n")
		return
	}
	s.mux.ServeHTTP(sw, r)
	label = cmp.Or(r.Pattern, "unmatched")
}

// metrics serves g in the Prometheus text format. A scraper that goes away
// mid-answer makes every later write fail, and promhttp would log each
// metric family's failure (70 lines a scrape): the writes fail quietly
// instead, and the scrape is counted once and logged sampled. promhttp's
// own lines (a collector that fails to gather) go to the sampled log under
// one message.
func (s *Server) metrics(g prometheus.Gatherer) http.Handler {
	h := promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:      stdlog.New(adminroute.LogLines{Log: s.scrapeLog, Msg: "metrics scrape: promhttp error"}, "", 0),
		ErrorHandling: promhttp.ContinueOnError,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		qw := &quietWriter{ResponseWriter: w}
		h.ServeHTTP(qw, r)
		if qw.err != nil {
			s.scrapeWriteErrors.Inc()
			s.scrapeLog.Info("metrics scrape: the answer could not be written (the scraper went away); "+
				"counted in relay_admin_metrics_write_errors_total, logged at most once a minute", zap.Error(qw.err))
		}
	})
}

// quietWriter keeps the first write error and reports every write as done,
// writing nothing more after an error.
type quietWriter struct {
	http.ResponseWriter
	err error
}

func (w *quietWriter) Write(p []byte) (int, error) {
	if w.err == nil {
		_, w.err = w.ResponseWriter.Write(p)
	}
	return len(p), nil
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *quietWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "ok\n")
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	info := ""
	if s.cfg.ReadyInfo != nil {
		info = s.cfg.ReadyInfo()
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(); err != nil {
			if info != "" {
				info = strings.TrimSuffix(info, "\n") + "\n"
			}
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "not ready: "+err.Error()+"\n"+info)
			return
		}
	}
	io.WriteString(w, "ready\n"+info)
}

// cmdline is pprof's /debug/pprof/cmdline with the value of --admin-token
// (and of any other flag whose name says token, key or secret) redacted.
func cmdline(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprint(w, strings.Join(RedactArgs(os.Args), "\x00"))
}

// RedactArgs returns args with the values of secret-looking flags
// (--admin-token, and any flag naming a token, key, secret or password)
// replaced by [redacted], in both "--flag value" and "--flag=value" forms.
func RedactArgs(args []string) []string {
	out := slices.Clone(args)
	secret := func(flag string) bool {
		f := strings.ToLower(strings.TrimLeft(flag, "-"))
		return !strings.HasSuffix(f, "-file") && // a path
			slices.ContainsFunc([]string{"token", "key", "secret", "password"}, func(w string) bool { return strings.Contains(f, w) })
	}
	for i := 1; i < len(out); i++ {
		a := out[i]
		if !strings.HasPrefix(a, "-") {
			continue
		}
		if name, _, ok := strings.Cut(a, "="); ok {
			if secret(name) {
				out[i] = name + "=[redacted]"
			}
			continue
		}
		if secret(a) && i+1 < len(out) {
			out[i+1] = "[redacted]"
			i++
		}
	}
	return out
}

var (
	// quoted is a double-quoted fragment, backslash escapes included, up to
	// its closing quote or the end of the line.
	quoted = regexp.MustCompile(`(?s)"((?:[^"\\]|\\.?)*)("?)`)
	// query runs from a '?' to the next white space or quote.
	query = regexp.MustCompile(`\?[^ \t\n"']*`)
)

// redactQuoted replaces the content of every double-quoted fragment of a
// server log line (it may quote request content, e.g. a malformed header
// line with a token, or a handler's panic value) by [redacted],
// except network addresses (digits, dots, colons, brackets, hex letters).
func redactQuoted(s string) string {
	return quoted.ReplaceAllStringFunc(s, func(m string) string {
		sm := quoted.FindStringSubmatch(m)
		if strings.Trim(sm[1], "0123456789abcdefABCDEF.:[]") == "" {
			return m
		}
		return `"[redacted]` + sm[2]
	})
}

// redactQuery cuts query strings out of a server log line (a request's URI
// may carry an api_key, as POST /usermap?api_key=... does).
func redactQuery(s string) string { return query.ReplaceAllString(s, "?[redacted]") }
