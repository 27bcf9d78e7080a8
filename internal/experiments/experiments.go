// Package experiments forwards the experiment management API
// (/api/1/experiments/...) of ../shared/api/experiments-scim-classifiers.md
// on the admin listener, on the upstream's paths.
//
// Every endpoint of the document's table is routed (Routes); any other path
// under /api/1/experiments is answered 404 locally and never forwarded. The
// upstream is --experiment-url, or the experiment_url of the project named by
// X-Relay-Project (or of its organization). Credentials: the caller's
// Authorization passes through; with X-Relay-Project the organization's
// management_api_key is injected as "Bearer <key>". A request without
// Accept gets "Accept: application/json" (the document asks for it).
//
// Local validation (answered 400 at once, {"error": "...", "source":
// "relay"}): bulk-delete-users and bulk-delete-cohorts bodies must be a JSON
// object whose "users" is an array of at most BulkMax strings; variant
// creation needs a non-empty "key" (also in each variant of an experiment
// creation); inclusion bodies need "inclusions", deployment bodies
// "deployments", as arrays of strings. The upstream has no documented rate
// limit here, so there is no client-side limiter.
package experiments

import (
	"encoding/json"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// BulkMax is the most ids a bulk delete may carry.
const BulkMax = 100

// Root is the path every route of this package is under.
const Root = "/api/1/experiments"

// Config configures the experiment routes.
type Config struct {
	// URL is --experiment-url, the upstream base; "" means none (then only
	// projects or organizations with an experiment_url can be served; the
	// others get 502 with a clear message).
	URL string
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error { return nil }

// API forwards the experiment management routes.
type API struct {
	cfg   Config
	creds *credentials.Store
	fwd   *forward.Forwarder
	log   *zap.Logger
	mux   forward.Mux
}

// New returns the experiment routes. creds may be nil (no credentials
// file: pass-through only); log may be nil; reg is unused (the forwarder
// counts requests) and may be nil.
func New(cfg Config, creds *credentials.Store, fwd *forward.Forwarder, log *zap.Logger, reg prometheus.Registerer) (*API, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if fwd == nil {
		return nil, fmt.Errorf("experiments: nil forwarder")
	}
	if log == nil {
		log = zap.NewNop()
	}
	a := &API{cfg: cfg, creds: creds, fwd: fwd, log: log}
	a.routes()
	return a, nil
}

// Routes returns the admin-listener routes (admintoken.ModeForward).
func (a *API) Routes() []adminroute.Route { return a.mux.AdminRoutes(Root) }

func (a *API) upstream() forward.Upstream {
	return forward.Upstream{API: "experiment", Kind: credentials.KindExperiment, Fallback: a.cfg.URL,
		Flag: "--experiment-url", Scheme: forward.SchemeManagementBearer}
}

type check func(body []byte) string

func (a *API) handle(method, pattern string, c check) {
	a.mux.Handle(method, pattern, func(ctx *fasthttp.RequestCtx, _ forward.Params) {
		r, e := forward.Resolve(ctx, a.creds, a.upstream())
		if e != nil {
			e.Write(ctx)
			return
		}
		if c != nil {
			body, err := forward.DecodedBody(ctx, a.fwd.MaxRequestBodyBytes())
			if err != nil {
				forward.WriteError(ctx, fasthttp.StatusBadRequest, "request body could not be decoded by its Content-Encoding")
				return
			}
			if msg := c(body); msg != "" {
				forward.WriteError(ctx, fasthttp.StatusBadRequest, msg)
				return
			}
		}
		if len(ctx.Request.Header.Peek(fasthttp.HeaderAccept)) == 0 {
			ctx.Request.Header.Set(fasthttp.HeaderAccept, "application/json")
		}
		a.fwd.Forward(ctx, r.Target)
	})
}

func (a *API) routes() {
	const (
		get, post, patch, del = fasthttp.MethodGet, fasthttp.MethodPost, fasthttp.MethodPatch, fasthttp.MethodDelete
		e                     = Root + "/{id}"
		v                     = e + "/variants/{variantKey}"
	)
	a.handle(get, Root, nil)
	a.handle(post, Root, checkCreate)
	a.handle(get, e, nil)
	a.handle(patch, e, checkObject)
	a.handle(get, e+"/versions", nil)
	a.handle(get, e+"/versions/{versionId}", nil)
	a.handle(get, e+"/variants", nil)
	a.handle(post, e+"/variants", checkVariant)
	a.handle(get, v, nil)
	a.handle(patch, v, checkObject)
	a.handle(del, v, nil)
	a.handle(get, v+"/users", nil)
	a.handle(get, v+"/cohorts", nil)
	a.handle(post, v+"/users", checkStrings("inclusions", 0))
	a.handle(post, v+"/cohorts", checkStrings("inclusions", 0))
	a.handle(del, v+"/users/{userIndex}", nil)
	a.handle(del, v+"/users", nil)
	a.handle(del, v+"/bulk-delete-users", checkStrings("users", BulkMax))
	a.handle(del, v+"/bulk-delete-cohorts", checkStrings("users", BulkMax))
	a.handle(get, e+"/deployments", nil)
	a.handle(post, e+"/deployments", checkStrings("deployments", 0))
	a.handle(del, e+"/deployments/{deploymentId}", nil)
}

func object(body []byte) (map[string]json.RawMessage, string) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		return nil, "body must be a JSON object"
	}
	return m, ""
}

func checkObject(body []byte) string {
	_, msg := object(body)
	return msg
}

// checkStrings requires body[field] to be an array of strings, of at most
// most entries when most > 0.
func checkStrings(field string, most int) check {
	return func(body []byte) string {
		m, msg := object(body)
		if msg != "" {
			return msg
		}
		var v []string
		if err := json.Unmarshal(m[field], &v); err != nil || v == nil {
			return fmt.Sprintf("%q must be an array of strings", field)
		}
		if most > 0 && len(v) > most {
			return fmt.Sprintf("%q holds %d entries; at most %d per request", field, len(v), most)
		}
		return ""
	}
}

func variantKey(raw json.RawMessage) string {
	var v struct {
		Key *string `json:"key"`
	}
	if json.Unmarshal(raw, &v) != nil || v.Key == nil || *v.Key == "" {
		return "a variant needs a non-empty string \"key\""
	}
	return ""
}

func checkVariant(body []byte) string {
	if _, msg := object(body); msg != "" {
		return msg
	}
	return variantKey(body)
}

func checkCreate(body []byte) string {
	m, msg := object(body)
	if msg != "" {
		return msg
	}
	raw, ok := m["variants"]
	if !ok || string(raw) == "null" {
		return ""
	}
	var vs []json.RawMessage
	if json.Unmarshal(raw, &vs) != nil {
		return "\"variants\" must be an array of objects"
	}
	for _, v := range vs {
		if msg := variantKey(v); msg != "" {
			return msg
		}
	}
	return ""
}
