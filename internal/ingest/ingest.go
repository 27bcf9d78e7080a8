package ingest

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// Config configures a Server.
type Config struct {
	// MaxRequestBytes bounds a request body after decompression; 0 means
	// DefaultMaxRequestBytes.
	MaxRequestBytes int64
	// TrustedProxies are the peers whose X-Forwarded-For is honoured; nil
	// means X-Forwarded-For is never trusted.
	TrustedProxies []netip.Prefix
	// RetryAfter is the Retry-After sent with 503 answers; 0 means 1s.
	RetryAfter time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// DefaultMaxRequestBytes is the default MaxRequestBytes (20 MB).
const DefaultMaxRequestBytes = 20_000_000

// Validate reports a configuration error.
func (c Config) Validate() error {
	if c.MaxRequestBytes < 0 {
		return errors.New("ingest: MaxRequestBytes must not be negative")
	}
	if c.RetryAfter < 0 {
		return errors.New("ingest: RetryAfter must not be negative")
	}
	return nil
}

// Server is the ingest listener.
type Server struct{}

// New returns a Server that spools accepted events into sp.
func New(cfg Config, sp *spool.Spool, ids *event.IDGen, log *zap.Logger, reg prometheus.Registerer) (*Server, error) {
	panic("unimplemented")
}

// Handler returns the request handler (POST /2/httpapi, POST /batch, GET /healthz).
func (s *Server) Handler() fasthttp.RequestHandler { panic("unimplemented") }

// Serve serves ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error { panic("unimplemented") }

// Shutdown stops accepting and waits for in-flight requests, bounded by ctx.
func (s *Server) Shutdown(ctx context.Context) error { panic("unimplemented") }
