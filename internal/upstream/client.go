package upstream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/valyala/fasthttp"

	"github.com/svcrelay/relay/internal/storage"
)

// Config configures a Client.
type Config struct {
	// Timeout bounds one request from dial to the last byte of the answer;
	// zero means DefaultTimeout.
	Timeout time.Duration
}

// DefaultTimeout is Config.Timeout's default.
const DefaultTimeout = 30 * time.Second

// The client's fixed bounds: connecting, the connections to one host (room
// for the delivery's shards, each with at most one request in flight),
// keep-alive idleness and an answer's body.
const (
	dialTimeout         = 5 * time.Second
	maxConnsPerHost     = 64
	maxIdleConnDuration = 30 * time.Second
	maxResponseBytes    = 1 << 20
)

// Validate reports a configuration error.
func (c Config) Validate() error {
	if c.Timeout < 0 {
		return errors.New("upstream: negative time-out")
	}
	return nil
}

// Request is one POST to the upstream.
type Request struct {
	// URL is the full address, e.g. ingest-url + "/2/httpapi".
	URL string
	// ContentType is sent as Content-Type; "" means application/json.
	ContentType string
	// Body is the uncompressed body. Do sends it without copying: the caller
	// keeps it unchanged until Do returns and, when Do returned because ctx
	// ended (the request abandoned, still being sent), for good.
	Body []byte
	// Gzip compresses Body and sends Content-Encoding: gzip.
	Gzip bool
	// Kind labels the request's metrics (kind="events", "groupidentify",
	// "usermap"); "" means "other".
	Kind string
}

// Client posts requests to the upstream and classifies the answers.
type Client struct {
	cfg      Config
	hc       *fasthttp.Client
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	// last is the outcome of the latest request to end, for
	// /readyz's word on the upstream; nil before the first.
	last atomic.Pointer[Outcome]
	// gzBufs holds compressed bodies' buffers (*[]byte) for reuse: a
	// fresh one per gzipped request was ~40-400 KB of garbage each.
	gzBufs sync.Pool
}

// maxPooledGzip bounds the compressed-body buffers kept for reuse.
const maxPooledGzip = 4 << 20

// Outcome is how the latest upstream request ended (Client.Last).
type Outcome struct {
	At time.Time
	// Reached is true when an HTTP answer arrived (any status): the
	// upstream is reachable, whatever it thought of the request.
	Reached bool
	// Status is relay_upstream_requests_total's status label: the HTTP
	// status, or "timeout"/"error" when no answer arrived.
	Status string
}

// Last returns the outcome of the latest upstream request to end, and false
// when none has ended yet.
func (c *Client) Last() (Outcome, bool) {
	if o := c.last.Load(); o != nil {
		return *o, true
	}
	return Outcome{}, false
}

// New returns a client. reg may be nil. It registers
// relay_upstream_requests_total{kind,status} and
// relay_upstream_request_seconds{kind}.
func New(cfg Config, reg prometheus.Registerer) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	c := &Client{
		cfg: cfg,
		hc: &fasthttp.Client{
			Name:                      "svc-relay",
			MaxConnsPerHost:           maxConnsPerHost,
			MaxIdleConnDuration:       maxIdleConnDuration,
			ReadTimeout:               cfg.Timeout,
			WriteTimeout:              cfg.Timeout,
			MaxConnWaitTimeout:        cfg.Timeout,
			MaxResponseBodySize:       maxResponseBytes,
			DisablePathNormalizing:    true,
			MaxIdemponentCallAttempts: 1,
			Dial: func(addr string) (net.Conn, error) {
				return fasthttp.DialTimeout(addr, dialTimeout)
			},
		},
		requests: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "relay_upstream_requests_total",
			Help: "Upstream requests by lane kind and answer status (HTTP status, or timeout/error when none arrived).",
		}, []string{"kind", "status"}),
		latency: promauto.With(reg).NewHistogramVec(prometheus.HistogramOpts{
			Name:    "relay_upstream_request_seconds",
			Help:    "Upstream request latency by lane kind, including failed requests.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"kind"}),
	}
	return c, nil
}

// errLeaseEnded answers a request not sent: ctx's lease (storage.Leased)
// ran out before it could be.
var errLeaseEnded = errors.New("upstream: not sent: the partition's lease ran out")

// Do posts req and classifies the answer. It returns when the answer
// arrives, the request times out (Config.Timeout), or ctx ends; in the last
// case the request is abandoned and the Result is Retryable with ctx's error.
func (c *Client) Do(ctx context.Context, req *Request) Result {
	if err := ctx.Err(); err != nil {
		return Classify(0, nil, "", err)
	}
	freq := fasthttp.AcquireRequest()
	freq.SetRequestURI(req.URL)
	freq.Header.SetMethod(fasthttp.MethodPost)
	freq.Header.SetContentType(cmp.Or(req.ContentType, "application/json"))
	var zb *[]byte // the compressed body's buffer, back to gzBufs once sent
	if req.Gzip {
		freq.Header.Set(fasthttp.HeaderContentEncoding, "gzip")
		// The fastest level: half the CPU of the default (6) for ~20% more
		// compressed bytes, still ~6x fewer than the body's
		// (BenchmarkGzipBody; bench/RESULTS.md, twelfth session).
		zb, _ = c.gzBufs.Get().(*[]byte)
		if zb == nil {
			zb = new([]byte)
		}
		*zb = fasthttp.AppendGzipBytesLevel((*zb)[:0], req.Body, fasthttp.CompressBestSpeed)
		freq.SetBodyRaw(*zb)
	} else {
		freq.SetBodyRaw(req.Body) // no copy: see Request.Body
	}
	deadline := time.Now().Add(c.cfg.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	done := make(chan Result, 1)
	start := time.Now()
	go func() {
		resp := fasthttp.AcquireResponse()
		// The sender checked its lease before the body's compression and
		// this goroutine's start; a process stopped past its lease in
		// between would send on resuming. Asked again as late as it can be.
		err := errLeaseEnded
		if storage.Leased(ctx) {
			err = c.hc.DoDeadline(freq, resp, deadline)
		}
		var r Result
		if err != nil {
			r = Classify(0, nil, "", err)
		} else {
			r = Classify(resp.StatusCode(), resp.Body(), string(resp.Header.Peek(fasthttp.HeaderRetryAfter)), nil)
		}
		took := time.Since(start)
		fasthttp.ReleaseResponse(resp)
		fasthttp.ReleaseRequest(freq)
		// DoDeadline is synchronous: it returned, so nothing reads the
		// compressed body any more (even when Do gave up waiting for it).
		if zb != nil && cap(*zb) <= maxPooledGzip {
			c.gzBufs.Put(zb)
		}
		kind := cmp.Or(req.Kind, "other")
		c.requests.WithLabelValues(kind, r.StatusLabel()).Inc()
		c.latency.WithLabelValues(kind).Observe(took.Seconds())
		c.last.Store(&Outcome{At: time.Now(), Reached: r.Status != 0, Status: r.StatusLabel()})
		done <- r
	}()
	select {
	case r := <-done:
		return r
	case <-ctx.Done():
		return Classify(0, nil, "", fmt.Errorf("request abandoned: %w", ctx.Err()))
	}
}
