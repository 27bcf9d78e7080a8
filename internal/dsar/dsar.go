package dsar

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/export"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/ratelimit"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// Documented figures.
const (
	// PathRequests is the root of the DSAR routes.
	PathRequests = "/api/2/dsar/requests"
	// Budget is the cost allowed per BudgetWindow for all DSAR endpoints.
	Budget       = 14400
	BudgetWindow = time.Hour
	// CostPost and CostGet are the costs of one call.
	CostPost = 8
	CostGet  = 1
	// URLLifetime is how long the urls of a done request stay valid.
	URLLifetime = 48 * time.Hour
	// MaxRedirects bounds the redirects followed for one output.
	MaxRedirects = 3
)

// Job states named by the document (others exist, unnamed).
const (
	StatusDone   = "done"
	StatusFailed = "failed"
)

// ErrBadRequest is returned (wrapped) by Request.Validate.
var ErrBadRequest = errors.New("bad DSAR request")

// Request is the create body.
type Request struct {
	UserID    string `json:"userId,omitempty"`
	SvcID     int64  `json:"svcId,omitempty"`
	StartDate string `json:"startDate"`
	EndDate   string `json:"endDate"`
}

// Validate checks the rules of the package doc.
func (r Request) Validate() error {
	if r.UserID == "" && r.SvcID <= 0 {
		return fmt.Errorf("%w: userId or svcId is required", ErrBadRequest)
	}
	s, err1 := time.Parse(time.DateOnly, r.StartDate)
	e, err2 := time.Parse(time.DateOnly, r.EndDate)
	switch {
	case err1 != nil || err2 != nil:
		return fmt.Errorf("%w: startDate and endDate are required, as YYYY-MM-DD", ErrBadRequest)
	case e.Before(s):
		return fmt.Errorf("%w: endDate %s is before startDate %s", ErrBadRequest, r.EndDate, r.StartDate)
	}
	return nil
}

// ParseRequest decodes and validates a create body.
func ParseRequest(body []byte) (Request, error) {
	var raw struct {
		UserID    *string         `json:"userId"`
		SvcID     json.RawMessage `json:"svcId"`
		StartDate *string         `json:"startDate"`
		EndDate   *string         `json:"endDate"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return Request{}, fmt.Errorf("%w: the body is not a JSON object: %v", ErrBadRequest, err)
	}
	var r Request
	if raw.UserID != nil {
		r.UserID = *raw.UserID
	}
	if len(raw.SvcID) > 0 && string(raw.SvcID) != "null" {
		n, err := strconv.ParseInt(string(raw.SvcID), 10, 64)
		if err != nil || n <= 0 {
			return Request{}, fmt.Errorf("%w: svcId must be a positive integer", ErrBadRequest)
		}
		r.SvcID = n
	}
	if raw.StartDate != nil {
		r.StartDate = *raw.StartDate
	}
	if raw.EndDate != nil {
		r.EndDate = *raw.EndDate
	}
	return r, r.Validate()
}

// Created is the create answer.
type Created struct {
	RequestID int64 `json:"requestId"`
}

// Status is the status answer.
type Status struct {
	Status string   `json:"status"`
	URLs   []string `json:"urls"`
}

// Config configures the DSAR routes.
type Config struct {
	// URL is --analytics-url, the upstream base; "" means none (only
	// projects with an analytics_url can be served).
	URL string
	// MaxWait is how long a call waits for the cost budget before a local
	// 429; 0 means ratelimit.DefaultMaxWait, negative never waits.
	MaxWait time.Duration
	// Budget is the cost allowed per BudgetWindow; 0 means Budget (14400),
	// the documented figure (tests lower it).
	Budget int
	// WriteIdleTimeout is the longest the caller may stop reading a
	// streamed output before it is cut (see export.ForwardStreaming); 0
	// means export.DefaultWriteIdleTimeout.
	WriteIdleTimeout time.Duration
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	if c.Budget < 0 || c.WriteIdleTimeout < 0 {
		return fmt.Errorf("dsar: negative Budget or WriteIdleTimeout")
	}
	return nil
}

// API is the DSAR routes. Build it with New.
type API struct {
	cfg    Config
	creds  *credentials.Store
	fwd    *forward.Forwarder
	log    *zap.Logger
	up     forward.Upstream
	budget *ratelimit.Limiter
	mux    *forward.Mux
}

// New returns the DSAR routes. creds (the --credentials file; nil means
// pass-through only), log and reg may be nil.
func New(cfg Config, creds *credentials.Store, fwd *forward.Forwarder, log *zap.Logger, reg prometheus.Registerer) (*API, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if fwd == nil {
		return nil, errors.New("dsar: nil forwarder")
	}
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.Budget == 0 {
		cfg.Budget = Budget
	}
	lim, err := ratelimit.New(ratelimit.Config{Name: "dsar", Limit: cfg.Budget, Window: BudgetWindow, MaxWait: cfg.MaxWait}, reg)
	if err != nil {
		return nil, fmt.Errorf("dsar: %w", err)
	}
	a := &API{cfg: cfg, creds: creds, fwd: fwd, log: log, budget: lim, mux: &forward.Mux{},
		up: forward.Upstream{API: "dsar", Kind: credentials.KindAnalytics, Fallback: cfg.URL,
			Flag: "--analytics-url", Scheme: forward.SchemeOrgBasic}}
	a.mux.Handle(fasthttp.MethodPost, PathRequests, a.create)
	a.mux.Handle(fasthttp.MethodGet, PathRequests+"/{id}", a.status)
	a.mux.Handle(fasthttp.MethodGet, PathRequests+"/{id}/outputs/{output}", a.output)
	return a, nil
}

// Routes returns the DSAR routes in forwarding mode.
func (a *API) Routes() []adminroute.Route { return a.mux.AdminRoutes(PathRequests) }

func (a *API) create(ctx *fasthttp.RequestCtx, _ forward.Params) {
	body, err := forward.DecodedBody(ctx, 1<<20)
	if err != nil {
		forward.WriteError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if _, err := ParseRequest(body); err != nil {
		forward.WriteError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	a.call(ctx, CostPost, false)
}

func (a *API) status(ctx *fasthttp.RequestCtx, _ forward.Params) { a.call(ctx, CostGet, false) }

func (a *API) output(ctx *fasthttp.RequestCtx, _ forward.Params) { a.call(ctx, CostGet, true) }

func (a *API) call(ctx *fasthttp.RequestCtx, cost int, follow bool) {
	res, ferr := forward.Resolve(ctx, a.creds, a.up)
	if ferr != nil {
		ferr.Write(ctx)
		return
	}
	release, err := a.budget.Acquire(ctx, res.Key, cost)
	if err != nil {
		var le *ratelimit.LimitedError
		if errors.As(err, &le) {
			forward.WriteError(ctx, fasthttp.StatusTooManyRequests, "DSAR cost budget of "+strconv.Itoa(a.cfg.Budget)+
				" per hour reached (client-side): "+le.Reason)
			ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, strconv.Itoa(le.RetryAfterSeconds()))
			return
		}
		forward.WriteError(ctx, fasthttp.StatusServiceUnavailable, "request abandoned while waiting for the DSAR cost budget")
		return
	}
	if !follow {
		a.fwd.Forward(ctx, res.Target)
		release()
		return
	}
	status, _ := export.ForwardStreaming(ctx, a.fwd, res.Target, a.cfg.WriteIdleTimeout)
	release()
	a.follow(ctx, res.Target, status)
}

// follow follows the redirects of an output answer (see the package doc).
func (a *API) follow(ctx *fasthttp.RequestCtx, t forward.Target, status int) {
	cur, err := url.Parse(t.Base + string(ctx.URI().RequestURI()))
	if err != nil {
		return
	}
	for hop := 0; hop < MaxRedirects && isRedirect(status); hop++ {
		loc := string(ctx.Response.Header.Peek(fasthttp.HeaderLocation))
		next, err := cur.Parse(loc)
		if loc == "" || err != nil || (next.Scheme != "http" && next.Scheme != "https") || next.Host == "" || next.User != nil {
			return // passed back as it is
		}
		a.log.Debug("dsar: following output redirect", zap.Int("hop", hop+1), zap.String("host", next.Host))
		ctx.Request.Header.SetMethod(fasthttp.MethodGet)
		ctx.Request.SetBody(nil)
		ctx.Request.SetRequestURI(next.EscapedPath() + queryOf(next))
		t.Base = next.Scheme + "://" + next.Host
		status, _ = export.ForwardStreaming(ctx, a.fwd, t, a.cfg.WriteIdleTimeout)
		cur = next
	}
}

func queryOf(u *url.URL) string {
	if u.RawQuery == "" {
		return ""
	}
	return "?" + u.RawQuery
}

func isRedirect(status int) bool {
	switch status {
	case 301, 302, 303, 307, 308:
		return true
	}
	return false
}
