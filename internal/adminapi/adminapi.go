package adminapi

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"go.uber.org/zap"
)

// Config configures a Server.
type Config struct {
	// Ready reports why the relay is not ready (spool closed, delivery not
	// running); nil error means ready. A nil Ready means always ready.
	Ready func() error
	// Gatherer is the registry served on /metrics; nil means
	// prometheus.NewRegistry() (empty).
	Gatherer prometheus.Gatherer
	// AdminToken, when not empty, is required on authenticated routes
	// (HandleAuth and /debug/pprof/). Never logged.
	AdminToken string
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
	prefix  bool
	methods map[string]fasthttp.RequestHandler
}

// Server is the admin listener. Register routes with Handle/HandleAuth before
// Serve.
type Server struct {
	cfg Config
	log *zap.Logger
	srv *fasthttp.Server

	mu       sync.RWMutex
	routes   map[string]*route
	prefixes []string // registered prefix paths, longest first
}

// New returns a server with /healthz, /readyz, /metrics and /debug/pprof/
// registered. log may be nil.
func New(cfg Config, log *zap.Logger) (*Server, error) {
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
	s.srv = &fasthttp.Server{
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
		Logger:                       zapPrintf{log},
	}

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
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	pp := fasthttpadaptor.NewFastHTTPHandler(mux)
	s.HandleAuth(fasthttp.MethodGet, "/debug/pprof/", pp)
	s.HandleAuth(fasthttp.MethodPost, "/debug/pprof/", pp) // pprof's symbol lookup posts
	return s, nil
}

// Handle registers h for method and path. A path ending in "/" matches every
// path under it (the longest registered prefix wins; exact paths beat
// prefixes). Registering the same method and path twice panics, as
// net/http.ServeMux does: it is a programming error.
func (s *Server) Handle(method, path string, h fasthttp.RequestHandler) {
	if !strings.HasPrefix(path, "/") || h == nil || method == "" {
		panic(fmt.Sprintf("adminapi: bad route %s %q", method, path))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.routes[path]
	if r == nil {
		r = &route{prefix: strings.HasSuffix(path, "/"), methods: make(map[string]fasthttp.RequestHandler)}
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

// HandleAuth is Handle with the admin token required (see RequireToken).
func (s *Server) HandleAuth(method, path string, h fasthttp.RequestHandler) {
	s.Handle(method, path, s.RequireToken(h))
}

// RequireToken wraps h so that, when Config.AdminToken is set, a request
// without "Authorization: Bearer <token>" gets 401 and one with another token
// gets 403. With no token configured it returns h unchanged.
func (s *Server) RequireToken(h fasthttp.RequestHandler) fasthttp.RequestHandler {
	if s.cfg.AdminToken == "" {
		return h
	}
	want := []byte(s.cfg.AdminToken)
	return func(ctx *fasthttp.RequestCtx) {
		got, ok := bearer(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
		if !ok {
			ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, `Bearer realm="relay-admin"`)
			textError(ctx, fasthttp.StatusUnauthorized, "admin token required: Authorization: Bearer <token>")
			return
		}
		if subtle.ConstantTimeCompare(got, want) != 1 {
			textError(ctx, fasthttp.StatusForbidden, "wrong admin token")
			return
		}
		h(ctx)
	}
}

// bearer returns the token of an "Authorization: Bearer <token>" value.
func bearer(v []byte) ([]byte, bool) {
	const scheme = "bearer "
	if len(v) <= len(scheme) || !strings.EqualFold(string(v[:len(scheme)]), scheme) {
		return nil, false
	}
	tok := v[len(scheme):]
	for len(tok) > 0 && tok[0] == ' ' {
		tok = tok[1:]
	}
	return tok, len(tok) > 0
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
func (s *Server) Shutdown(ctx context.Context) error {
	if err := s.srv.ShutdownWithContext(ctx); err != nil {
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
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(); err != nil {
			textError(ctx, fasthttp.StatusServiceUnavailable, "not ready: "+err.Error())
			return
		}
	}
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString("ready\n")
}

func textError(ctx *fasthttp.RequestCtx, status int, msg string) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString(msg + "\n")
}

// zapPrintf adapts a zap logger to fasthttp.Logger.
type zapPrintf struct{ log *zap.Logger }

func (z zapPrintf) Printf(format string, args ...any) {
	z.log.Warn("admin listener", zap.String("detail", fmt.Sprintf(format, args...)))
}

// zapPrintln adapts a zap logger to promhttp.Logger.
type zapPrintln struct{ log *zap.Logger }

func (z zapPrintln) Println(v ...any) {
	z.log.Warn("metrics gathering", zap.String("detail", fmt.Sprint(v...)))
}
