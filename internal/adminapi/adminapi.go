package adminapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/graceful"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"go.uber.org/zap"
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
	// still stripped before a handler sees the request).
	Token *admintoken.Token
	// ReadTimeout bounds reading one request; 0 means DefaultReadTimeout.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing one response; 0 means DefaultWriteTimeout
	// (long enough for a 30s CPU profile).
	WriteTimeout time.Duration
	// MaxRequestBodySize bounds request bodies; 0 means DefaultMaxRequestBodySize.
	MaxRequestBodySize int
}

// Defaults of Config.
const (
	DefaultReadTimeout        = 30 * time.Second
	DefaultWriteTimeout       = 5 * time.Minute
	DefaultMaxRequestBodySize = 32 << 20
)

// Validate reports a configuration error.
func (c Config) Validate() error {
	if c.ReadTimeout < 0 || c.WriteTimeout < 0 || c.MaxRequestBodySize < 0 {
		return errors.New("adminapi: negative timeout or size")
	}
	return nil
}

// route is the handlers of one path, by method.
type route struct {
	pattern string // the registered path, the metrics' route label
	prefix  bool
	methods map[string]fasthttp.RequestHandler
}

// Server is the admin listener. Register routes with Handle (open),
// HandleOwn, HandleForward or Register before Serve.
type Server struct {
	cfg Config
	log *zap.Logger
	srv *graceful.Server

	requests *prometheus.CounterVec // relay_admin_requests_total{route,code}

	mu       sync.RWMutex
	routes   map[string]*route
	prefixes []string // registered prefix paths, longest first
}

// New returns a server with /healthz, /readyz, /metrics and /debug/pprof/
// registered. log and reg may be nil. It registers
// relay_admin_requests_total{route,code} (route is the registered path, or
// "unmatched"; never the request's own path or query).
func New(cfg Config, log *zap.Logger, reg prometheus.Registerer) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.MaxRequestBodySize == 0 {
		cfg.MaxRequestBodySize = DefaultMaxRequestBodySize
	}
	if cfg.Gatherer == nil {
		cfg.Gatherer = prometheus.NewRegistry()
	}
	if log == nil {
		log = zap.NewNop()
	}
	s := &Server{cfg: cfg, log: log, routes: make(map[string]*route)}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relay_admin_requests_total",
		Help: "Admin listener requests by registered route and status code (401/403: token refused).",
	}, []string{"route", "code"})
	if reg != nil {
		if err := reg.Register(s.requests); err != nil {
			return nil, fmt.Errorf("adminapi metrics: %w", err)
		}
	}
	// graceful closes, at Shutdown, connections on which no handler runs
	// (fasthttp alone waits for a silent client until its read timeout).
	s.srv = graceful.New(&fasthttp.Server{
		Handler:                      s.serve,
		Name:                         "relay-admin",
		ReadTimeout:                  cfg.ReadTimeout,
		WriteTimeout:                 cfg.WriteTimeout,
		IdleTimeout:                  2 * time.Minute,
		MaxRequestBodySize:           cfg.MaxRequestBodySize,
		NoDefaultDate:                true,
		NoDefaultContentType:         true,
		CloseOnShutdown:              true,
		DisablePreParseMultipartForm: true,
		// Request content (headers with tokens, bodies with api keys) never
		// goes into fasthttp's error messages.
		SecureErrorLogMessage: true,
		Logger:                zapPrintf{log},
	})

	s.Handle(fasthttp.MethodGet, "/healthz", s.healthz)
	s.Handle(fasthttp.MethodHead, "/healthz", s.healthz)
	s.Handle(fasthttp.MethodGet, "/readyz", s.readyz)
	s.Handle(fasthttp.MethodHead, "/readyz", s.readyz)
	metrics := fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{
		ErrorLog:      zapPrintln{log},
		ErrorHandling: promhttp.ContinueOnError,
	}))
	s.Handle(fasthttp.MethodGet, "/metrics", metrics)

	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	pp := fasthttpadaptor.NewFastHTTPHandler(mux)
	s.HandleOwn(fasthttp.MethodGet, "/debug/pprof/", pp)
	s.HandleOwn(fasthttp.MethodPost, "/debug/pprof/", pp) // pprof's symbol lookup posts
	return s, nil
}

// Handle registers h for method and path. A path ending in "/" matches every
// path under it (the longest registered prefix wins; exact paths beat
// prefixes). Handle registers an OPEN route, with no admin token check: only
// /healthz, /readyz and /metrics are open by the contract; everything else
// goes through HandleOwn, HandleForward or Register. Registering the same method and path twice panics, as
// net/http.ServeMux does: it is a programming error.
func (s *Server) Handle(method, path string, h fasthttp.RequestHandler) {
	if !strings.HasPrefix(path, "/") || h == nil || method == "" {
		panic(fmt.Sprintf("adminapi: bad route %s %q", method, path))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.routes[path]
	if r == nil {
		r = &route{pattern: path, prefix: strings.HasSuffix(path, "/"), methods: make(map[string]fasthttp.RequestHandler)}
		s.routes[path] = r
		if r.prefix {
			s.prefixes = append(s.prefixes, path)
			sort.Slice(s.prefixes, func(i, j int) bool { return len(s.prefixes[i]) > len(s.prefixes[j]) })
		}
	}
	if _, dup := r.methods[method]; dup {
		panic(fmt.Sprintf("adminapi: route %s %s registered twice", method, path))
	}
	r.methods[method] = h
}

// HandleOwn registers h for one of the relay's own routes (/relay/v1/...,
// /debug/pprof/, /groupidentify, /usermap): the admin token is read from
// Authorization (or Proxy-Authorization); see admintoken.ModeOwn.
func (s *Server) HandleOwn(method, path string, h fasthttp.RequestHandler) {
	s.HandleMode(method, path, admintoken.ModeOwn, h)
}

// HandleForward registers h for a route forwarded to an upstream API: the
// admin token is read from Proxy-Authorization (or from Authorization when
// the request names a project with X-Relay-Project), and a caller's own
// Authorization reaches h untouched; see admintoken.ModeForward.
func (s *Server) HandleForward(method, path string, h fasthttp.RequestHandler) {
	s.HandleMode(method, path, admintoken.ModeForward, h)
}

// HandleMode registers h behind the admin token check of mode. A request
// reaching h passed the check and has had the admin token headers stripped
// (admintoken.Token.Strip), so h can forward the rest of its headers.
func (s *Server) HandleMode(method, path string, mode admintoken.Mode, h fasthttp.RequestHandler) {
	if h == nil {
		panic(fmt.Sprintf("adminapi: nil handler for %s %q", method, path))
	}
	s.Handle(method, path, s.cfg.Token.Require(mode, h))
}

// Register registers routes offered by another package (group identify,
// user mapping, forwarded APIs), each behind the token check of its Mode.
func (s *Server) Register(routes ...adminroute.Route) {
	for _, r := range routes {
		s.HandleMode(r.Method, r.Path, r.Mode, r.Handler)
	}
}

// Handler returns the router (for tests and for serving on another listener).
func (s *Server) Handler() fasthttp.RequestHandler { return s.serve }

// Serve serves on ln until Shutdown; it returns nil after Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.srv.Serve(ln); err != nil {
		return fmt.Errorf("admin listener: %w", err)
	}
	return nil
}

// Shutdown stops accepting and waits for open requests until ctx ends.
// Connections on which no handler runs (new ones that sent nothing yet, idle
// keep-alive ones) are closed at once (see package graceful), so a client
// that connected and sent nothing does not hold the stop.
func (s *Server) Shutdown(ctx context.Context) error {
	if err := s.srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("admin listener shutdown: %w", err)
	}
	return nil
}

func (s *Server) serve(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
	s.mu.RLock()
	r := s.routes[path]
	if r == nil {
		for _, p := range s.prefixes {
			if strings.HasPrefix(path, p) {
				r = s.routes[p]
				break
			}
		}
	}
	var h fasthttp.RequestHandler
	var allow []string
	if r != nil {
		h = r.methods[string(ctx.Method())]
		if h == nil {
			for m := range r.methods {
				allow = append(allow, m)
			}
		}
	}
	s.mu.RUnlock()
	label := "unmatched"
	if r != nil {
		label = r.pattern
	}
	defer func() {
		s.requests.WithLabelValues(label, strconv.Itoa(ctx.Response.StatusCode())).Inc()
	}()
	switch {
	case r == nil:
		textError(ctx, fasthttp.StatusNotFound, "not found")
	case h == nil:
		slices.Sort(allow)
		ctx.Response.Header.Set(fasthttp.HeaderAllow, strings.Join(allow, ", "))
		textError(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed")
	default:
		h(ctx)
	}
}

func (s *Server) healthz(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString("ok\n")
}

func (s *Server) readyz(ctx *fasthttp.RequestCtx) {
	info := ""
	if s.cfg.ReadyInfo != nil {
		info = s.cfg.ReadyInfo()
	}
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(); err != nil {
			msg := "not ready: " + err.Error()
			if info != "" {
				msg += "\n" + strings.TrimSuffix(info, "\n")
			}
			textError(ctx, fasthttp.StatusServiceUnavailable, msg)
			return
		}
	}
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString("ready\n" + info)
}

func textError(ctx *fasthttp.RequestCtx, status int, msg string) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString(msg + "\n")
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
		if strings.HasSuffix(f, "-file") {
			return false // a path
		}
		for _, w := range []string{"token", "key", "secret", "password"} {
			if strings.Contains(f, w) {
				return true
			}
		}
		return false
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

// zapPrintf adapts a zap logger to fasthttp.Logger.
type zapPrintf struct{ log *zap.Logger }

func (z zapPrintf) Printf(format string, args ...any) {
	z.log.Warn("admin listener", zap.String("detail", redactQuoted(redactQuery(fmt.Sprintf(format, args...)))))
}

// redactQuoted replaces the content of every double-quoted fragment of a
// fasthttp log line (it quotes request content, e.g. a malformed header
// line with a token, whatever SecureErrorLogMessage says) by [redacted],
// except network addresses (digits, dots, colons, brackets, hex letters).
func redactQuoted(s string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(s, '"')
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i+1])
		s = s[i+1:]
		j := 0
		for j < len(s) && s[j] != '"' {
			if s[j] == '\\' {
				j++
			}
			j++
		}
		inner := s[:min(j, len(s))]
		if strings.Trim(inner, "0123456789abcdefABCDEF.:[]") == "" {
			b.WriteString(inner)
		} else {
			b.WriteString("[redacted]")
		}
		if j >= len(s) {
			return b.String()
		}
		b.WriteByte('"')
		s = s[j+1:]
	}
}

// redactQuery cuts query strings out of a fasthttp log line (a request's URI
// may carry an api_key, as POST /usermap?api_key=... does): from each '?'
// to the next white space or quote.
func redactQuery(s string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(s, '?')
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i])
		b.WriteString("?[redacted]")
		s = s[i+1:]
		j := strings.IndexAny(s, " \t\n\"'")
		if j < 0 {
			return b.String()
		}
		s = s[j:]
	}
}

// zapPrintln adapts a zap logger to promhttp.Logger.
type zapPrintln struct{ log *zap.Logger }

func (z zapPrintln) Println(v ...any) {
	z.log.Warn("metrics gathering", zap.String("detail", fmt.Sprint(v...)))
}
