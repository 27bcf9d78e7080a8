// The taxonomy API (docs/upstream-api.md, "Taxonomy"): base
// --analytics-url, the project's key pair as Basic. Local answers are in
// the taxonomy error format. One cost budget per project (GET 1, others 2;
// in flight and per period), shared with the tracking plan's own reads
// (APIConfig.Limiter).

package forward

import (
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/ratelimit"
)

// Limits of the taxonomy document.
const (
	taxonomyMaxInFlight = 4
	taxonomyPeriodCost  = 7200
	taxonomyPeriod      = time.Hour
	// taxonomyRoot is the path every route is under.
	taxonomyRoot = "/api/2/taxonomy"
)

// TaxonomyCost is the document's cost of a request of method.
var TaxonomyCost = costOf(http.MethodGet, 1, 2)

// TaxonomyLimit is the taxonomy API's documented limit with cfg's changes:
// the Config of a limiter to share (APIConfig.Limiter).
func TaxonomyLimit(cfg APIConfig) ratelimit.Config {
	return cfg.Over(ratelimit.Config{Name: "taxonomy", Limit: taxonomyPeriodCost, Window: taxonomyPeriod, MaxInFlight: taxonomyMaxInFlight})
}

// Taxonomy returns the taxonomy API described above; cfg changes its base
// and cost budget.
func Taxonomy(cfg APIConfig) API {
	lim := TaxonomyLimit(cfg)
	const get, post, put, del = http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete
	const c, e, ep, up, gp = taxonomyRoot + "/category", taxonomyRoot + "/event", taxonomyRoot + "/event-property",
		taxonomyRoot + "/user-property", taxonomyRoot + "/group-property"
	// requires: the form body (or the query) must hold every field.
	requires := func(fields ...string) Endpoint {
		return Endpoint{Check: taxonomyRequires(fields), BodyLimit: DefaultMaxRequestBodyBytes}
	}
	return API{
		Upstream: Upstream{API: "taxonomy", Kind: credentials.KindAnalytics, Fallback: cfg.URL,
			Scheme: SchemeProjectBasic},
		Errors: taxonomyError,
		Limits: []Limit{{
			Config: lim,
			Shared: cfg.Limiter,
			Cost:   TaxonomyCost,
			Says:   fmt.Sprintf("a cost of %d in flight and %d per %v per project", lim.MaxInFlight, lim.Limit, lim.Window),
		}},
		Routes: []adminroute.Route{
			{Method: post, Path: c, Handler: requires("category_name")},
			{Method: get, Path: c},
			{Method: get, Path: c + "/{category_name}"},
			{Method: put, Path: c + "/{category_id}", Handler: requires("category_name")},
			{Method: del, Path: c + "/{category_id}"},
			{Method: post, Path: e, Handler: requires("event_type")},
			{Method: get, Path: e},
			{Method: get, Path: e + "/{event_type}"},
			{Method: put, Path: e + "/{event_type}"},
			{Method: del, Path: e + "/{event_type}"},
			{Method: post, Path: e + "/{event_type}/restore"},
			{Method: post, Path: ep, Handler: requires("event_property")},
			{Method: get, Path: ep},
			{Method: put, Path: ep + "/{event_property}"},
			{Method: del, Path: ep + "/{event_property}"},
			{Method: post, Path: ep + "/{event_property}/restore"},
			{Method: post, Path: up, Handler: requires("user_property")},
			{Method: get, Path: up},
			{Method: get, Path: up + "/{user_property}"},
			{Method: put, Path: up + "/{user_property}"},
			{Method: del, Path: up + "/{user_property}"},
			{Method: post, Path: up + "/{user_property}/restore"},
			{Method: post, Path: gp, Handler: requires("group_type", "group_property")},
			{Method: get, Path: gp},
		},
	}
}

// taxonomyError writes a local answer in the taxonomy error format:
// {"success":false,"errors":[{"message":"relay: ..."}],"source":"relay"}.
func taxonomyError(w http.ResponseWriter, p *Problem) {
	adminroute.WriteJSON(w, p.Status, map[string]any{"success": false, "errors": []any{map[string]string{"message": "relay: " + p.Msg}}, "source": "relay"})
}

// taxonomyRequires checks that a form body (or the query) holds every field.
func taxonomyRequires(fields []string) func(r *http.Request, body []byte) *Problem {
	return func(r *http.Request, body []byte) *Problem {
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return Bad("body is not form encoded (application/x-www-form-urlencoded)")
		}
		q := r.URL.Query()
		for _, f := range fields {
			if form.Get(f) == "" && q.Get(f) == "" {
				return Bad("missing required field: %s", f)
			}
		}
		return nil
	}
}
