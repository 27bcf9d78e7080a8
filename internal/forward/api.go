package forward

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"strconv"
	"time"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/ratelimit"
	"github.com/svcrelay/relay/internal/upstream"
)

// API is one forwarded upstream API as data: where it lives, how it
// authenticates, how its local answers look, its client-side limits and its
// documented routes. Every API of the package is made by a function of one
// signature, func(APIConfig) API (SCIM, Taxonomy, ...); Forwarder.Routes
// serves them.
type API struct {
	Upstream
	// Errors writes the API's local answers in its own error format; nil
	// means JSONErrors.
	Errors func(w http.ResponseWriter, p *Problem)
	// Accept is sent as Accept when the caller sent none ("" keeps none).
	Accept string
	// Headers, when not nil, are the only request headers forwarded beside
	// Authorization (the API's reference names no others); nil forwards
	// every end-to-end header.
	Headers []string
	// Limits are client-side limits per caller's upstream account
	// (Target.Key), taken in order before the call and given back when
	// its answer is done; an upstream 429 pauses the account on each for
	// its Retry-After (1 s at least).
	Limits []Limit
	// Routes are the documented endpoints; other paths are not forwarded.
	// Each is the admin listener's route as it is registered: Method and
	// Path (an http.ServeMux pattern with {name} wildcards, read in Check
	// with r.PathValue) are the upstream's, the path forwarded is the path
	// routed, and Handler is the route's Endpoint (nil: Endpoint{}).
	// Forwarder.Routes sets Mode and serves the Endpoint.
	Routes []adminroute.Route
}

// Endpoint is what the relay does on a route of an API before forwarding
// it: the Handler of the route in the API's table. It is data; only
// Forwarder.Routes serves it (on its own it answers 500).
type Endpoint struct {
	// Check validates what the upstream documents, before anything is
	// sent; nil: nothing to check. body is the decoded request body when
	// BodyLimit > 0, else nil.
	Check func(r *http.Request, body []byte) *Problem
	// BodyLimit > 0 makes the decoded body (at most BodyLimit bytes, else
	// 413) available to Check.
	BodyLimit int
	// Follow is how many redirects of the upstream's answer the relay
	// follows itself (DSAR outputs); 0: the redirect is passed back.
	Follow int
}

// ServeHTTP answers 500: an Endpoint is served by Forwarder.Routes.
func (Endpoint) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	WriteError(w, http.StatusInternalServerError, "relay: route not served by a forwarder")
}

// APIConfig configures a forwarded API: its upstream base and changes to
// its documented limits, which stay each API's own data.
type APIConfig struct {
	// URL is the upstream base (--analytics-url, --scim-url), read at every
	// request (a reload may change it); nil or "" means none: only projects
	// or organizations with their own base are served.
	URL *baseurl.Ref
	// Limit's fields that are not zero (Name aside) replace those of each
	// documented limit (MaxWait negative: never wait); zero keeps them. An
	// API without documented limits has nothing for it to change.
	// Forwarder.Routes checks the result.
	Limit ratelimit.Config
	// Limiter, when not nil, is the limiter of the API's documented limit
	// (its Config made by Over), shared with the relay's own calls to the
	// API (the tracking plan's reads of the taxonomy API), so that both
	// count against one budget per account.
	Limiter *ratelimit.Limiter
}

// Over returns doc, a documented limit, with the changes of c.Limit.
func (c APIConfig) Over(doc ratelimit.Config) ratelimit.Config {
	o := c.Limit
	doc.Limit, doc.Window, doc.MaxInFlight = cmp.Or(o.Limit, doc.Limit), cmp.Or(o.Window, doc.Window), cmp.Or(o.MaxInFlight, doc.MaxInFlight)
	doc.MaxWait, doc.MaxWaiting = cmp.Or(o.MaxWait, doc.MaxWait), cmp.Or(o.MaxWaiting, doc.MaxWaiting)
	return doc
}

// Limit is one client-side limit of an API.
type Limit struct {
	ratelimit.Config
	// Cost is the cost of a call by its method; nil means 1 for every
	// call, and a cost of 0 means the limit does not apply to the call.
	Cost func(method string) int
	// Says names the limit in the local 429's message ("100 requests per
	// minute per organization").
	Says string
	// Shared, when not nil, is the limiter to count on (APIConfig.Limiter)
	// instead of one of the limit's own.
	Shared *ratelimit.Limiter
}

// cost is the cost of a call of method (see Cost).
func (l Limit) cost(method string) int {
	if l.Cost == nil {
		return 1
	}
	return l.Cost(method)
}

// costOf is a Limit.Cost: n for a call of method, other for the rest.
func costOf(method string, n, other int) func(string) int {
	return func(m string) int {
		if m == method {
			return n
		}
		return other
	}
}

// JSONErrors writes p as {"error": msg, "source": "relay"} plus p.Extra's
// fields.
func JSONErrors(w http.ResponseWriter, p *Problem) {
	var m map[string]any
	if b, err := json.Marshal(p.Extra); err != nil || json.Unmarshal(b, &m) != nil || m == nil {
		WriteError(w, p.Status, p.Msg)
		return
	}
	m["error"], m["source"] = p.Msg, "relay"
	adminroute.WriteJSON(w, p.Status, m)
}

// Routes returns the admin-listener routes (admintoken.ModeForward) of the
// APIs: every route of their tables, resolved, checked, limited and
// forwarded. Limits' metrics are registered on the Forwarder's registry.
func (f *Forwarder) Routes(apis ...API) ([]adminroute.Route, error) {
	var out []adminroute.Route
	for _, a := range apis {
		if a.Errors == nil {
			a.Errors = JSONErrors
		}
		lims := make([]*ratelimit.Limiter, len(a.Limits))
		for i, l := range a.Limits {
			for _, rt := range a.Routes {
				if c := l.cost(rt.Method); (l.Limit > 0 && c > l.Limit) || (l.MaxInFlight > 0 && c > l.MaxInFlight) {
					return nil, fmt.Errorf("forward %s: %s %s costs %d, above a bound of limit %s: every such call would be refused",
						a.API, rt.Method, rt.Path, c, l.Name)
				}
			}
			if lims[i] = l.Shared; lims[i] != nil {
				continue
			}
			lim, err := ratelimit.New(l.Config, f.reg)
			if err != nil {
				return nil, fmt.Errorf("forward %s: %w", a.API, err)
			}
			lims[i] = lim
		}
		for _, rt := range a.Routes {
			e, ok := rt.Handler.(Endpoint)
			if !ok && rt.Handler != nil {
				return nil, fmt.Errorf("forward %s: %s %s: the handler of a route is its Endpoint", a.API, rt.Method, rt.Path)
			}
			proxy := f.proxy
			if e.Follow > 0 {
				proxy = f.newProxy(follower(f.transport, e.Follow))
			}
			rt.Mode, rt.Handler = admintoken.ModeForward, &handler{f: f, api: a, lims: lims, route: e, proxy: proxy}
			out = append(out, rt)
		}
	}
	return out, nil
}

// handler serves one route of one API.
type handler struct {
	f     *Forwarder
	api   API
	lims  []*ratelimit.Limiter
	route Endpoint
	proxy *httputil.ReverseProxy
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a := h.api
	var body []byte
	if h.route.BodyLimit > 0 {
		var err error
		if body, err = DecodedBody(r, h.route.BodyLimit); err != nil {
			status := http.StatusBadRequest
			if errors.Is(err, ErrBodyTooLarge) {
				status = http.StatusRequestEntityTooLarge
			}
			h.local(w, "invalid", &Problem{Status: status, Msg: err.Error()})
			return
		}
	}
	if h.route.Check != nil {
		if p := h.route.Check(r, body); p != nil {
			h.local(w, "invalid", p)
			return
		}
	}
	res, p := Resolve(r, h.f.creds.Load(), a.Upstream)
	if p != nil {
		h.local(w, "unresolved", p)
		return
	}
	for i, lim := range h.lims {
		l := a.Limits[i]
		cost := l.cost(r.Method)
		if cost == 0 {
			continue
		}
		release, err := lim.Acquire(r.Context(), res.Key, cost)
		if err != nil {
			var le *ratelimit.LimitedError
			if errors.As(err, &le) {
				w.Header().Set("Retry-After", strconv.Itoa(le.RetryAfterSeconds()))
				h.local(w, "limited", &Problem{Status: http.StatusTooManyRequests, Msg: fmt.Sprintf(
					"client-side limit of %s reached (%s); retry after %d s", l.Says, le.Reason, le.RetryAfterSeconds())})
				return
			}
			h.local(w, "limited", &Problem{Status: http.StatusServiceUnavailable, Msg: "request abandoned while waiting for the client-side limit"})
			return
		}
		defer release()
	}
	if a.Accept != "" && r.Header.Get("Accept") == "" {
		r.Header.Set("Accept", a.Accept)
	}
	if a.Headers != nil {
		keep := http.Header{}
		for _, k := range append([]string{"Authorization", admintoken.HeaderProject}, a.Headers...) {
			if vs := r.Header.Values(k); len(vs) > 0 {
				keep[http.CanonicalHeaderKey(k)] = vs
			}
		}
		r.Header = keep
	}
	if h.f.forward(w, r, res, h.proxy) == http.StatusTooManyRequests {
		d := upstream.RetryAfter(w.Header().Get("Retry-After"), time.Now())
		for _, lim := range h.lims {
			lim.Pause(res.Key, max(d, time.Second))
		}
	}
}

// local answers a problem found before anything was sent, counted in
// relay_forward_errors_total by reason.
func (h *handler) local(w http.ResponseWriter, reason string, p *Problem) {
	h.f.m.errors.WithLabelValues(h.api.API, reason).Inc()
	h.api.Errors(w, p)
}

// follower is a RoundTripper that follows up to n redirects of an answer
// (http.Client's rules: GET after 301/302/303, Authorization dropped on a
// redirect to another host); a redirect it does not follow (too many, not
// http(s), user info in the URL) is passed back as it is.
func follower(rt http.RoundTripper, n int) http.RoundTripper {
	c := &http.Client{Transport: rt, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) > n || (req.URL.Scheme != "http" && req.URL.Scheme != "https") || req.URL.User != nil {
			return http.ErrUseLastResponse
		}
		return nil
	}}
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r.RequestURI = "" // the proxy's own copy of the caller's request
		return c.Do(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
