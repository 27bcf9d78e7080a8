// Package taxonomy forwards the taxonomy API (/api/2/taxonomy/...) of
// ../shared/api/taxonomy-feedback-dsar-deletion.md on the admin listener, on
// the upstream's paths, within the upstream's cost budget.
//
// Every endpoint of the document's table is routed (Routes); other paths
// under /api/2/taxonomy are answered 404 locally. The upstream is
// --analytics-url, or the analytics_url of the project named by
// X-Relay-Project (or of the project whose api_key a pass-through Basic
// header carries), else of its organization. Credentials: the caller's
// Authorization passes through; with X-Relay-Project the project's
// "Basic api_key:secret_key" is injected.
//
// Local validation: a create or update whose form body (or query) lacks its
// required field is answered 400 {"success": false, "errors": [{"message"}],
// "source": "relay"} at once: POST category and PUT category/{id}
// (category_name), POST event (event_type), POST event-property
// (event_property), POST user-property (user_property), POST group-property
// (group_type and group_property). A body that is not form encoded is 400.
//
// Client-side limits, per project (the injected project; for pass-through
// the project of the Basic api_key when the credentials file knows it, else
// a hash of the caller's Authorization): cost GET 1, PUT/POST/DELETE 2; at
// most Config.MaxInFlight cost in flight and Config.PeriodCost cost per
// Config.Period, counted from each call's answer (internal/ratelimit). A
// call whose turn is further than Config.MaxWait gets a local 429 with
// Retry-After; an upstream 429 is passed back with its Retry-After, and
// holds that project's further calls back for it (clamped to 1 s .. Period).
package taxonomy

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
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/ratelimit"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// Limits of the document, and the defaults of Config's zero values.
const (
	DefaultMaxInFlight = 4
	DefaultPeriodCost  = 7200
	DefaultPeriod      = time.Hour
	DefaultMaxWait     = 10 * time.Second
	// Root is the path every route is under.
	Root = "/api/2/taxonomy"
)

// Cost is the document's cost of a request of method.
func Cost(method string) int {
	if method == fasthttp.MethodGet {
		return 1
	}
	return 2
}

// Config configures the taxonomy routes.
type Config struct {
	// URL is --analytics-url, the upstream base; "" means none (only
	// projects with an analytics_url can be served).
	URL string
	// MaxInFlight is the cost in flight allowed per project; 0 means
	// DefaultMaxInFlight.
	MaxInFlight int
	// PeriodCost is the cost allowed per Period per project; 0 means
	// DefaultPeriodCost.
	PeriodCost int
	// Period is the window of PeriodCost; 0 means DefaultPeriod.
	Period time.Duration
	// MaxWait is the longest a call waits for its turn before it is
	// answered 429 locally; 0 means DefaultMaxWait, negative means never
	// wait.
	MaxWait time.Duration
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	switch {
	case c.MaxInFlight < 0, c.PeriodCost < 0, c.Period < 0:
		return errors.New("taxonomy: negative MaxInFlight, PeriodCost or Period")
	case c.MaxInFlight == 1:
		return errors.New("taxonomy: MaxInFlight 1 would refuse every PUT, POST and DELETE (cost 2)")
	case c.PeriodCost == 1:
		return errors.New("taxonomy: PeriodCost 1 would refuse every PUT, POST and DELETE (cost 2)")
	}
	return nil
}

// API forwards the taxonomy routes.
type API struct {
	cfg   Config
	creds *credentials.Store
	fwd   *forward.Forwarder
	log   *zap.Logger
	lim   *ratelimit.Limiter
	mux   forward.Mux
}

// New returns the taxonomy routes. creds, log and reg may be nil.
func New(cfg Config, creds *credentials.Store, fwd *forward.Forwarder, log *zap.Logger, reg prometheus.Registerer) (*API, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if fwd == nil {
		return nil, errors.New("taxonomy: nil forwarder")
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.PeriodCost == 0 {
		cfg.PeriodCost = DefaultPeriodCost
	}
	if cfg.Period == 0 {
		cfg.Period = DefaultPeriod
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if log == nil {
		log = zap.NewNop()
	}
	lim, err := ratelimit.New(ratelimit.Config{Name: "taxonomy", Limit: cfg.PeriodCost, Window: cfg.Period,
		MaxInFlight: cfg.MaxInFlight, MaxWait: cfg.MaxWait}, reg)
	if err != nil {
		return nil, fmt.Errorf("taxonomy: %w", err)
	}
	a := &API{cfg: cfg, creds: creds, fwd: fwd, log: log, lim: lim}
	a.routes()
	return a, nil
}

// Routes returns the admin-listener routes (admintoken.ModeForward).
func (a *API) Routes() []adminroute.Route { return a.mux.AdminRoutes(Root) }

// fail answers locally in the taxonomy's error format.
func fail(ctx *fasthttp.RequestCtx, status int, msg string) {
	body, _ := json.Marshal(map[string]any{"success": false, "errors": []any{map[string]string{"message": "relay: " + msg}}, "source": "relay"})
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

func (a *API) handle(method, pattern string, required ...string) {
	up := forward.Upstream{API: "taxonomy", Kind: credentials.KindAnalytics, Fallback: a.cfg.URL,
		Flag: "--analytics-url", Scheme: forward.SchemeProjectBasic}
	a.mux.Handle(method, pattern, func(ctx *fasthttp.RequestCtx, _ forward.Params) {
		r, e := forward.Resolve(ctx, a.creds, up)
		if e != nil {
			fail(ctx, e.Status, e.Msg)
			return
		}
		if len(required) > 0 {
			body, err := forward.DecodedBody(ctx, a.fwd.MaxRequestBodyBytes())
			if err != nil {
				fail(ctx, fasthttp.StatusBadRequest, "request body could not be decoded by its Content-Encoding")
				return
			}
			form, err := url.ParseQuery(string(body))
			if err != nil {
				fail(ctx, fasthttp.StatusBadRequest, "body is not form encoded (application/x-www-form-urlencoded)")
				return
			}
			for _, f := range required {
				if form.Get(f) == "" && len(ctx.QueryArgs().Peek(f)) == 0 {
					fail(ctx, fasthttp.StatusBadRequest, "missing required field: "+f)
					return
				}
			}
		}
		release, err := a.lim.Acquire(ctx, r.Key, Cost(method))
		if err != nil {
			var le *ratelimit.LimitedError
			if errors.As(err, &le) {
				fail(ctx, fasthttp.StatusTooManyRequests, fmt.Sprintf(
					"client-side cost budget (%d in flight, %d per %v per project) reached; retry after %d s",
					a.cfg.MaxInFlight, a.cfg.PeriodCost, a.cfg.Period, le.RetryAfterSeconds()))
				ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, strconv.Itoa(le.RetryAfterSeconds()))
				return
			}
			fail(ctx, fasthttp.StatusServiceUnavailable, "relay shutting down")
			return
		}
		status, _ := a.fwd.Forward(ctx, r.Target)
		release()
		if status == fasthttp.StatusTooManyRequests {
			// The upstream refused: hold this account's calls back for its
			// Retry-After (at least a second, at most the window).
			d, _ := forward.RetryAfter(&ctx.Response.Header, time.Now())
			a.lim.Pause(r.Key, max(d, time.Second))
		}
	})
}

func (a *API) routes() {
	const get, post, put, del = fasthttp.MethodGet, fasthttp.MethodPost, fasthttp.MethodPut, fasthttp.MethodDelete
	const c, e, ep, up, gp = Root + "/category", Root + "/event", Root + "/event-property", Root + "/user-property", Root + "/group-property"
	a.handle(post, c, "category_name")
	a.handle(get, c)
	a.handle(get, c+"/{category_name}")
	a.handle(put, c+"/{category_id}", "category_name")
	a.handle(del, c+"/{category_id}")
	a.handle(post, e, "event_type")
	a.handle(get, e)
	a.handle(get, e+"/{event_type}")
	a.handle(put, e+"/{event_type}")
	a.handle(del, e+"/{event_type}")
	a.handle(post, e+"/{event_type}/restore")
	a.handle(post, ep, "event_property")
	a.handle(get, ep)
	a.handle(put, ep+"/{event_property}")
	a.handle(del, ep+"/{event_property}")
	a.handle(post, ep+"/{event_property}/restore")
	a.handle(post, up, "user_property")
	a.handle(get, up)
	a.handle(get, up+"/{user_property}")
	a.handle(put, up+"/{user_property}")
	a.handle(del, up+"/{user_property}")
	a.handle(post, up+"/{user_property}/restore")
	a.handle(post, gp, "group_type", "group_property")
	a.handle(get, gp)
}
