package ingest

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Config configures a Server. The zero value is usable.
type Config struct {
	// MaxRequestBytes bounds a request body after decompression; 0 means
	// DefaultMaxRequestBytes. Larger bodies are answered 413.
	MaxRequestBytes int64
	// MaxBatchBytes is the delivery's upstream body limit (every body is
	// strictly under it); 0 means DefaultMaxBatchBytes. A request holding
	// an event that cannot fit alone in one upstream body (with the
	// envelope, as spooled) is answered 413 naming its index, and nothing
	// of it is spooled: it could only end as a dead letter.
	MaxBatchBytes int
	// TrustedProxies are the peers whose X-Forwarded-For is honoured (see the
	// package documentation); nil means X-Forwarded-For is never trusted.
	TrustedProxies []netip.Prefix
	// RetryAfter is the Retry-After sent with 503 answers, rounded up to whole
	// seconds; 0 means DefaultRetryAfter.
	RetryAfter time.Duration
	// Now is the clock for acceptance times; nil means time.Now.
	Now func() time.Time

	// ReadTimeout bounds reading one whole request (headers and body); 0
	// means DefaultReadTimeout.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing one response; 0 means DefaultWriteTimeout.
	WriteTimeout time.Duration
	// IdleTimeout bounds the wait for the next request on a keep-alive
	// connection; 0 means DefaultIdleTimeout.
	IdleTimeout time.Duration

	// Connections and TLS.

	// MaxConnections bounds the connections held open at once, over every
	// listener given to Serve; 0 means DefaultMaxConnections. Beyond it a
	// new connection waits in the kernel's accept queue until one closes
	// (and is refused by the kernel once that queue is full).
	MaxConnections int
	// TLS, when not nil, serves every listener given to Serve over TLS with
	// this configuration (its GetCertificate may change the certificate at
	// run time, see package tlsreload); nil means plain HTTP.
	TLS *tls.Config
	// Browsers and the open internet (see open.go).
	Open

	// Connections per client.

	// MaxConnectionsPerClient bounds the connections one client address
	// (an IPv6 address by its /64) holds open at once; 0 means no bound.
	// A connection beyond it is closed at accept, before anything is read;
	// peers in TrustedProxies or UnboundedPeers are not bounded.
	// DefaultMaxConnectionsPerClient is the relay's default.
	MaxConnectionsPerClient int
	// UnboundedPeers are peers, besides TrustedProxies, whose connections
	// MaxConnectionsPerClient does not bound (the relay gives loopback: its
	// own host's processes, a local reverse proxy, a load test).
	UnboundedPeers []netip.Prefix
}

// Defaults of Config.
const (
	DefaultMaxRequestBytes = 20_000_000
	DefaultMaxBatchBytes   = 1_000_000
	DefaultRetryAfter      = time.Second
	DefaultReadTimeout     = 60 * time.Second
	DefaultWriteTimeout    = 30 * time.Second
	DefaultIdleTimeout     = 120 * time.Second
	DefaultMaxConnections  = 16384
	// DefaultMaxConnectionsPerClient is the relay's --max-connections-per-client
	// (Config's zero value means no per-client bound).
	DefaultMaxConnectionsPerClient = 256
)

// maxMaxRequestBytes keeps the fasthttp body limit (an int, with slack) and
// the decompression buffer sizes far from overflow.
const maxMaxRequestBytes = 1 << 40

// withDefaults returns c with its zero values replaced by the defaults.
func (c Config) withDefaults() Config {
	if c.MaxBatchBytes <= 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	c.MaxRequestBytes = cmp.Or(c.MaxRequestBytes, DefaultMaxRequestBytes)
	c.RetryAfter = cmp.Or(c.RetryAfter, DefaultRetryAfter)
	if c.Now == nil {
		c.Now = time.Now
	}
	c.ReadTimeout = cmp.Or(c.ReadTimeout, DefaultReadTimeout)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.MaxConnections = cmp.Or(c.MaxConnections, DefaultMaxConnections)
	c.TrustedProxies = normalizePrefixes(c.TrustedProxies)
	c.UnboundedPeers = normalizePrefixes(c.UnboundedPeers)
	return c
}

// normalizePrefixes returns ps masked, with 4-in-6 prefixes as IPv4:
// addresses are compared unmapped.
func normalizePrefixes(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, len(ps))
	for i, p := range ps {
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		out[i] = p.Masked()
	}
	return out
}

// Server is the ingest listener. Create it with New.
type Server struct {
	cfg        Config
	maxBody    int // MaxRequestBytes as an int
	readLimit  int // the body limit fasthttp enforces while reading (see New)
	retryAfter string
	store      storage.Appender
	ids        *event.IDGen
	rejLog     *zap.Logger // sampled: rejections and HTTP-level errors
	m          *metrics
	// conns holds a slot per open connection, over all listeners. A slot
	// is taken before accept(2) is called, so beyond the bound new
	// connections wait in the kernel's accept queue (and, once it is
	// full, the kernel refuses them); it is given back when fasthttp
	// reports the connection closed or hijacked (connState).
	conns     chan struct{}
	perClient *clientConns // nil: no per-client bound
	srv       *fasthttp.Server

	// base is the context of appends: cancelled only when Shutdown's
	// context ends before the in-flight requests did.
	base       context.Context
	cancelBase context.CancelFunc
	closing    atomic.Bool // set under mu: Shutdown was called

	// Connections and their lingering: see linger.go.
	mu          sync.Mutex
	lns         []net.Listener           // every listener given to Serve, closed by Shutdown
	tracked     map[net.Conn]bool        // open connections: true from the handler's start to StateIdle
	lingering   map[*lingerConn]struct{} // connections in their linger goroutine
	lingers     sync.WaitGroup           // the linger goroutines
	lingerFor   time.Duration            // a linger's bound: lingerTimeout (tests lengthen it)
	lingerLimit int64                    // the bytes a linger discards (see New)

	states sync.Pool // of *reqState

	testHook func(*fasthttp.RequestCtx) // tests only: called before the append

	opened atomic.Pointer[openState] // CORS, api_key allow-list, client rate limit; never nil once New returns

	// maxBatch is Config.MaxBatchBytes in force (SetMaxBatchBytes).
	maxBatch atomic.Int64

	plan Plan // nil: no verdicts (SetPlan)
}

// Plan tells the events clean against their project's tracking plan as
// they are spooled, so that delivery need not check them a second time
// (internal/plan's Enforcer.Vet; delivery checks every other event).
type Plan interface {
	// Vet returns the verdict of a clean event of a request with apiKey,
	// and what tells one clean as parsed (with Request.PlanMembers); 0
	// and nil when its events are not checked.
	Vet(apiKey []byte) (verdict uint64, clean func(*event.Request, *event.Event) bool)
	// Checking reports whether Vet may check some request's events (the
	// parser then records what it reads: event.Request.PlanMembers).
	Checking() bool
}

// SetPlan makes s mark each event clean against p's plan with its verdict
// (storage.Batch.Vet). Call it before Serve.
func (s *Server) SetPlan(p Plan) { s.plan = p }

// New returns a Server that appends each request's accepted events to
// store (spool.NewBackend of the spool, or the fleet's backend) as one
// storage.Request, filling absent insert_ids from ids. log and reg may be
// nil.
func New(cfg Config, store storage.Appender, ids *event.IDGen, log *zap.Logger, reg prometheus.Registerer) (*Server, error) {
	switch {
	case store == nil:
		return nil, errors.New("ingest: nil store")
	case ids == nil:
		return nil, errors.New("ingest: nil IDGen")
	case cfg.MaxRequestBytes < 0:
		return nil, fmt.Errorf("ingest: MaxRequestBytes %d is negative", cfg.MaxRequestBytes)
	case cfg.MaxRequestBytes > maxMaxRequestBytes || int64(int(cfg.MaxRequestBytes)) != cfg.MaxRequestBytes:
		return nil, fmt.Errorf("ingest: MaxRequestBytes %d is too large", cfg.MaxRequestBytes)
	case cfg.RetryAfter < 0:
		return nil, fmt.Errorf("ingest: RetryAfter %v is negative", cfg.RetryAfter)
	case cfg.ReadTimeout < 0, cfg.WriteTimeout < 0, cfg.IdleTimeout < 0:
		return nil, errors.New("ingest: negative timeout")
	case cfg.MaxConnections < 0:
		return nil, fmt.Errorf("ingest: MaxConnections %d is negative", cfg.MaxConnections)
	case cfg.MaxConnectionsPerClient < 0:
		return nil, fmt.Errorf("ingest: MaxConnectionsPerClient %d is negative", cfg.MaxConnectionsPerClient)
	case cfg.TLS != nil && cfg.TLS.GetCertificate == nil && cfg.TLS.GetConfigForClient == nil && len(cfg.TLS.Certificates) == 0:
		return nil, errors.New("ingest: TLS has no certificate")
	}
	for i, p := range append(slices.Clip(cfg.TrustedProxies), cfg.UnboundedPeers...) {
		if !p.IsValid() {
			return nil, fmt.Errorf("ingest: invalid %s prefix %v", map[bool]string{true: "trusted proxy", false: "unbounded peer"}[i < len(cfg.TrustedProxies)], p)
		}
	}
	log = cmp.Or(log, zap.NewNop())
	cfg = cfg.withDefaults()
	conns := make(chan struct{}, cfg.MaxConnections)
	s := &Server{
		cfg:        cfg,
		maxBody:    int(cfg.MaxRequestBytes),
		retryAfter: strconv.FormatInt(int64(math.Ceil(cfg.RetryAfter.Seconds())), 10),
		store:      store,
		ids:        ids,
		rejLog: log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			// At most 5 lines a second per message, so a flood of bad
			// requests cannot flood the log.
			return zapcore.NewSamplerWithOptions(c, time.Second, 5, 0)
		})),
		conns:     conns,
		perClient: newClientConns(cfg.MaxConnectionsPerClient, append(slices.Clip(cfg.TrustedProxies), cfg.UnboundedPeers...)),
		tracked:   make(map[net.Conn]bool),
		lingering: make(map[*lingerConn]struct{}),
		lingerFor: lingerTimeout,
	}
	// The body limit fasthttp enforces while reading. A gzip body never
	// exceeds its inflated size by more than its headers and 5 bytes per 64
	// KiB stored block, so with this slack a body fasthttp refuses is also
	// too large once inflated. Plain bodies are checked exactly by the
	// handler.
	s.readLimit = s.maxBody + s.maxBody/64 + 64<<10
	// A linger discards at most the body limit, at least fasthttp's default
	// (4 MiB). A client that writes its whole body before it reads the
	// answer gets its 413 if the body is no larger (and arrives within
	// lingerTimeout); one that reads while it writes (Go's http.Transport)
	// stops writing soon after it read the answer.
	s.lingerLimit = int64(max(s.readLimit, fasthttp.DefaultMaxRequestBodySize))
	if err := s.SetOpen(cfg.Open); err != nil { // before the metrics: nothing registered on an error
		return nil, err
	}
	var err error
	if s.m, err = newMetrics(reg, conns); err != nil {
		return nil, fmt.Errorf("ingest: register metrics: %w", err)
	}
	s.maxBatch.Store(int64(cfg.MaxBatchBytes))
	s.base, s.cancelBase = context.WithCancel(context.Background())
	s.states.New = func() any { return new(reqState) }
	s.srv = &fasthttp.Server{
		Handler:            s.strictHandle,
		ErrorHandler:       s.handleReadError,
		ExpectHandler:      s.expect,
		ConnState:          s.connState,
		MaxRequestBodySize: s.readLimit,
		// The connection limit is s.conns (Serve's listeners). A worker
		// reports its connection closed (freeing a slot) just before it
		// becomes free itself, so fasthttp's own limit (503 beyond it) is
		// twice that.
		Concurrency:                  2 * cfg.MaxConnections,
		ReadTimeout:                  cfg.ReadTimeout,
		WriteTimeout:                 cfg.WriteTimeout,
		IdleTimeout:                  cfg.IdleTimeout,
		ReadBufferSize:               8 << 10, // also the largest request header
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		CloseOnShutdown:              true,
		// fasthttp's TCPKeepalive stays off: an accepted connection whose
		// SetKeepAlive fails would end its Serve. net.Listen's connections
		// have TCP keep-alive on already (15s).
		SecureErrorLogMessage: true,
		Logger:                fasthttpLogger{s},
	}
	return s, nil
}

// Serve accepts connections on ln and serves them until Shutdown, over TLS
// when Config.TLS is set. It returns nil after Shutdown, and the listener's
// error if accepting fails otherwise; accept errors that end when resources
// free up (out of file descriptors, ENOBUFS, ECONNABORTED...) are retried
// after a pause (5ms doubling up to 1s) instead. Serve may be called for
// several listeners; together they hold at most Config.MaxConnections
// connections. ln is closed by Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.lns = append(s.lns, ln)
	s.mu.Unlock()
	// TLS goes over the connection limits and the lingering.
	ln = &limitListener{Listener: ln, s: s, done: make(chan struct{})}
	if s.cfg.TLS != nil {
		ln = tls.NewListener(ln, s.cfg.TLS)
	}
	if err := s.srv.Serve(ln); err != nil && !s.closing.Load() {
		return fmt.Errorf("ingest: serve: %w", err)
	}
	return nil
}

// Shutdown stops accepting connections, closes at once the connections on
// which no request is in the handler (new ones that sent nothing yet, idle
// keep-alive ones; see linger.go), answers 503 to requests that reach
// the handler after it started, and waits for in-flight requests to finish
// and their connections to close (lingering ones too). When ctx ends first,
// it cancels the spool appends still running (those requests are answered
// 503), closes the lingering connections and returns ctx's error without
// waiting further. The Server cannot be restarted.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing.Store(true)
	lns := s.lns
	for c, active := range s.tracked {
		if !active {
			closeNow(c)
			delete(s.tracked, c)
		}
	}
	s.mu.Unlock()

	err := s.srv.ShutdownWithContext(ctx)
	if lerr := s.waitLingering(ctx); err == nil {
		err = lerr
	}
	// A Serve that had not reached fasthttp's Serve when it was told to stop
	// finds its listener closed and returns.
	for _, ln := range lns {
		ln.Close()
	}
	s.cancelBase()
	if err != nil {
		return fmt.Errorf("ingest: shutdown: %w", err)
	}
	return nil
}
