// Package scim forwards the SCIM 2.0 provisioning API (/scim/1/Users,
// /scim/1/Groups) of ../shared/api/experiments-scim-classifiers.md on the
// admin listener, on the upstream's paths, within the upstream's rate limit.
//
// Every endpoint of the document's table is routed (Routes); other paths
// under /scim/1/Users and /scim/1/Groups are answered 404 locally. The
// upstream is --scim-url, or the scim_url of the project named by
// X-Relay-Project or of its organization. Credentials: the caller's
// Authorization passes through; with X-Relay-Project the organization's
// scim_token is injected as "Bearer <token>".
//
// Local validation (answered at once in the SCIM error format with
// "detail" starting "relay: "): GET /Users itemsPerPage above 100 or not an
// integer, startIndex not an integer >= 1 (400); POST /Users without id and
// userName that are valid emails (400); PUT, PATCH and DELETE /Users/{id}
// with an id that is not a valid email (400); Groups/{id} that is not an
// integer (400); POST /Groups without displayName or with members whose
// value is not an email (400); PATCH /Groups/{id} whose schemas lack the
// PatchOp schema or whose Operations are not add/remove on "members" with
// values [{value: email}] (400).
//
// Client-side limit: at most Config.RateLimit requests per Config.Window per
// organization (the injected organization, or for pass-through calls the
// caller's bearer token, kept as a hash), counted from each call's answer
// (see internal/ratelimit). A call whose turn is further than Config.MaxWait
// gets a local 429 with Retry-After; an upstream 429 is passed back with its
// Retry-After, and holds that organization's further calls back for it
// (clamped to 1 s .. Window): they wait, or get a local 429 when that is
// further than MaxWait.
package scim

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/ratelimit"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// Limits of the document.
const (
	MaxItemsPerPage = 100
	DefaultRate     = 100
	DefaultWindow   = time.Minute
	DefaultMaxWait  = 10 * time.Second
	PatchOpSchema   = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
	ErrorSchema     = "urn:ietf:params:scim:api:messages:2.0:Error"
	rootUsers       = "/scim/1/Users"
	rootGroups      = "/scim/1/Groups"
)

// Config configures the SCIM routes.
type Config struct {
	// URL is --scim-url, the upstream base; "" means none (only projects or
	// organizations with a scim_url can be served).
	URL string
	// RateLimit is the requests allowed per Window per organization; 0
	// means DefaultRate (the document's 100 per minute).
	RateLimit int
	// Window is the rate window; 0 means DefaultWindow.
	Window time.Duration
	// MaxWait is the longest a call waits for its turn before it is
	// answered 429 locally; 0 means DefaultMaxWait, negative means never
	// wait.
	MaxWait time.Duration
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	if c.RateLimit < 0 || c.Window < 0 {
		return fmt.Errorf("scim: negative RateLimit or Window")
	}
	return nil
}

// API forwards the SCIM routes.
type API struct {
	cfg   Config
	creds *credentials.Store
	fwd   *forward.Forwarder
	log   *zap.Logger
	lim   *ratelimit.Limiter
	mux   forward.Mux
}

// New returns the SCIM routes. creds, log and reg may be nil.
func New(cfg Config, creds *credentials.Store, fwd *forward.Forwarder, log *zap.Logger, reg prometheus.Registerer) (*API, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if fwd == nil {
		return nil, errors.New("scim: nil forwarder")
	}
	if cfg.RateLimit == 0 {
		cfg.RateLimit = DefaultRate
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if log == nil {
		log = zap.NewNop()
	}
	lim, err := ratelimit.New(ratelimit.Config{Name: "scim", Limit: cfg.RateLimit, Window: cfg.Window, MaxWait: cfg.MaxWait}, reg)
	if err != nil {
		return nil, fmt.Errorf("scim: %w", err)
	}
	a := &API{cfg: cfg, creds: creds, fwd: fwd, log: log, lim: lim}
	a.routes()
	return a, nil
}

// Routes returns the admin-listener routes (admintoken.ModeForward).
func (a *API) Routes() []adminroute.Route {
	return append(a.mux.AdminRoutes(rootUsers), a.mux.AdminRoutes(rootGroups)...)
}

// scimError answers locally in the SCIM error format.
func scimError(ctx *fasthttp.RequestCtx, status int, scimType, detail string) {
	b := map[string]any{"schemas": []string{ErrorSchema}, "status": strconv.Itoa(status), "detail": "relay: " + detail, "source": "relay"}
	if scimType != "" {
		b["scimType"] = scimType
	}
	body, _ := json.Marshal(b)
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/scim+json")
	ctx.SetBody(body)
}

// problem is a local validation failure.
type problem struct{ scimType, detail string }

type check func(ctx *fasthttp.RequestCtx, p forward.Params, body []byte) *problem

func (a *API) handle(method, pattern string, c check) {
	up := forward.Upstream{API: "scim", Kind: credentials.KindSCIM, Fallback: a.cfg.URL, Flag: "--scim-url",
		Scheme: forward.SchemeSCIMBearer}
	a.mux.Handle(method, pattern, func(ctx *fasthttp.RequestCtx, p forward.Params) {
		r, e := forward.Resolve(ctx, a.creds, up)
		if e != nil {
			scimError(ctx, e.Status, "", e.Msg)
			return
		}
		if c != nil {
			body, err := forward.DecodedBody(ctx, a.fwd.MaxRequestBodyBytes())
			if err != nil {
				scimError(ctx, fasthttp.StatusBadRequest, "invalidSyntax", "request body could not be decoded by its Content-Encoding")
				return
			}
			if pr := c(ctx, p, body); pr != nil {
				scimError(ctx, fasthttp.StatusBadRequest, pr.scimType, pr.detail)
				return
			}
		}
		release, err := a.lim.Acquire(ctx, r.Key, 1)
		if err != nil {
			var le *ratelimit.LimitedError
			if errors.As(err, &le) {
				scimError(ctx, fasthttp.StatusTooManyRequests, "", fmt.Sprintf(
					"client-side limit of %d requests per %v per organization reached; retry after %d s",
					a.cfg.RateLimit, a.cfg.Window, le.RetryAfterSeconds()))
				ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, strconv.Itoa(le.RetryAfterSeconds()))
				return
			}
			scimError(ctx, fasthttp.StatusServiceUnavailable, "", "relay shutting down")
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
	const get, post, put, patch, del = fasthttp.MethodGet, fasthttp.MethodPost, fasthttp.MethodPut,
		fasthttp.MethodPatch, fasthttp.MethodDelete
	a.handle(get, rootUsers, checkPage)
	a.handle(get, rootUsers+"/{id}", nil)
	a.handle(post, rootUsers, checkUser)
	a.handle(put, rootUsers+"/{id}", checkUserID)
	a.handle(patch, rootUsers+"/{id}", checkUserID)
	a.handle(del, rootUsers+"/{id}", checkUserID)
	a.handle(get, rootGroups, checkPage)
	a.handle(get, rootGroups+"/{id}", checkGroupID)
	a.handle(post, rootGroups, checkGroup)
	a.handle(patch, rootGroups+"/{id}", checkPatch)
	a.handle(del, rootGroups+"/{id}", checkGroupID)
}

// ValidEmail is the relay's email check: one '@', a non-empty local part, a
// domain of at least two non-empty dot-separated labels, at most 254 bytes,
// no white space, control characters or <>,;.
func ValidEmail(s string) bool {
	local, domain, ok := strings.Cut(s, "@")
	if !ok || local == "" || domain == "" || strings.Contains(domain, "@") || len(s) > 254 {
		return false
	}
	for _, c := range s {
		if c <= ' ' || c == 0x7f || strings.ContainsRune("<>,;", c) {
			return false
		}
	}
	labels := strings.Split(domain, ".")
	if len(labels) < 2 {
		return false
	}
	for _, l := range labels {
		if l == "" {
			return false
		}
	}
	return true
}

func checkPage(ctx *fasthttp.RequestCtx, _ forward.Params, _ []byte) *problem {
	args := ctx.QueryArgs()
	if v := args.Peek("startIndex"); v != nil {
		if n, err := strconv.Atoi(string(v)); err != nil || n < 1 {
			return &problem{"invalidValue", "startIndex must be an integer >= 1"}
		}
	}
	if v := args.Peek("itemsPerPage"); v != nil {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 0 {
			return &problem{"invalidValue", "itemsPerPage must be a non-negative integer"}
		}
		if n > MaxItemsPerPage {
			return &problem{"invalidValue", fmt.Sprintf("itemsPerPage %d is above the maximum of %d", n, MaxItemsPerPage)}
		}
	}
	return nil
}

func checkUserID(_ *fasthttp.RequestCtx, p forward.Params, _ []byte) *problem {
	if !ValidEmail(p["id"]) {
		return &problem{"invalidValue", "the user id in the path must be a valid email"}
	}
	return nil
}

func checkUser(_ *fasthttp.RequestCtx, _ forward.Params, body []byte) *problem {
	var u struct {
		ID       *string `json:"id"`
		UserName *string `json:"userName"`
	}
	if err := json.Unmarshal(body, &u); err != nil {
		return &problem{"invalidSyntax", "body must be a SCIM User JSON object"}
	}
	if u.ID == nil || u.UserName == nil || !ValidEmail(*u.ID) || !ValidEmail(*u.UserName) {
		return &problem{"invalidValue", "id and userName must be valid emails"}
	}
	return nil
}

func checkGroupID(_ *fasthttp.RequestCtx, p forward.Params, _ []byte) *problem {
	if _, err := strconv.Atoi(p["id"]); err != nil {
		return &problem{"invalidValue", "the group id in the path must be an integer"}
	}
	return nil
}

type member struct {
	Value *string `json:"value"`
}

func checkMembers(raw json.RawMessage) bool {
	var ms []member
	if json.Unmarshal(raw, &ms) != nil || ms == nil {
		return false
	}
	for _, m := range ms {
		if m.Value == nil || !ValidEmail(*m.Value) {
			return false
		}
	}
	return true
}

func checkGroup(_ *fasthttp.RequestCtx, _ forward.Params, body []byte) *problem {
	var g struct {
		DisplayName *string         `json:"displayName"`
		Members     json.RawMessage `json:"members"`
	}
	if err := json.Unmarshal(body, &g); err != nil {
		return &problem{"invalidSyntax", "body must be a SCIM Group JSON object"}
	}
	if g.DisplayName == nil || *g.DisplayName == "" {
		return &problem{"invalidValue", "displayName is required"}
	}
	if len(g.Members) > 0 && string(g.Members) != "null" && !checkMembers(g.Members) {
		return &problem{"invalidValue", "members must be objects whose value is a valid email"}
	}
	return nil
}

func checkPatch(ctx *fasthttp.RequestCtx, p forward.Params, raw []byte) *problem {
	if pr := checkGroupID(ctx, p, nil); pr != nil {
		return pr
	}
	var body struct {
		Schemas    []string `json:"schemas"`
		Operations []struct {
			Op    *string         `json:"op"`
			Path  *string         `json:"path"`
			Value json.RawMessage `json:"value"`
		} `json:"Operations"`
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		return &problem{"invalidSyntax", "body must be a PatchOp JSON object"}
	}
	found := false
	for _, s := range body.Schemas {
		found = found || s == PatchOpSchema
	}
	if !found {
		return &problem{"invalidSyntax", "schemas must contain " + PatchOpSchema}
	}
	if len(body.Operations) == 0 {
		return &problem{"invalidSyntax", "Operations must be a non-empty array"}
	}
	for i, op := range body.Operations {
		if op.Op == nil || (!strings.EqualFold(*op.Op, "add") && !strings.EqualFold(*op.Op, "remove")) {
			return &problem{"invalidSyntax", fmt.Sprintf("Operations[%d].op must be add or remove", i)}
		}
		add := strings.EqualFold(*op.Op, "add")
		switch {
		case op.Path != nil && *op.Path == "members":
			if (add || len(op.Value) > 0) && !checkMembers(op.Value) {
				return &problem{"invalidValue", fmt.Sprintf("Operations[%d].value must be objects whose value is a valid email", i)}
			}
		case !add && op.Path != nil && strings.HasPrefix(*op.Path, "members[") && strings.HasSuffix(*op.Path, "]"):
			// remove with a filter path: its exact shape is not documented.
		default:
			return &problem{"invalidPath", fmt.Sprintf("Operations[%d].path must be members", i)}
		}
	}
	return nil
}
