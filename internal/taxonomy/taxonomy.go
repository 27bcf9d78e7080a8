// Package taxonomy forwards the taxonomy API (/api/2/taxonomy/...;
// docs/upstream-api.md, "Taxonomy") on the admin listener, on the upstream's
// paths, within the upstream's cost budget.
//
// Every endpoint of the document's table is a route of API; other paths
// under /api/2/taxonomy are answered 404 or 405 by the admin listener. The upstream is
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
// most MaxInFlight cost in flight and PeriodCost cost per Period, counted
// from each call's answer (internal/ratelimit; forward.APIConfig.Limit
// changes the figures: its Limit is the period's cost, its Window the
// period). A call whose turn is further than MaxWait (10 s) gets a local
// 429 with Retry-After; an upstream 429 is passed back with its
// Retry-After, and holds that project's further calls back for it (clamped
// to 1 s .. Period).
package taxonomy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/ratelimit"
)

// Limits of the document.
const (
	MaxInFlight = 4
	PeriodCost  = 7200
	Period      = time.Hour
	// Root is the path every route is under.
	Root = "/api/2/taxonomy"
)

// Cost is the document's cost of a request of method.
func Cost(method string) int {
	if method == http.MethodGet {
		return 1
	}
	return 2
}

// API returns the taxonomy API as forward data: base cfg.URL
// (--analytics-url), the project's key pair as Basic, the taxonomy error
// format, the cost budget (as cfg changes it) and the routes of the
// document's table, with the required field of each create.
func API(cfg forward.APIConfig) forward.API {
	lim := cfg.Over(ratelimit.Config{Name: "taxonomy", Limit: PeriodCost, Window: Period, MaxInFlight: MaxInFlight})
	const get, post, put, del = http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete
	const c, e, ep, up, gp = Root + "/category", Root + "/event", Root + "/event-property", Root + "/user-property", Root + "/group-property"
	r := func(method, path string, required ...string) forward.Route {
		rt := forward.Route{Method: method, Path: path}
		if len(required) > 0 {
			rt.BodyLimit = forward.DefaultMaxRequestBodyBytes
			rt.Check = requires(required)
		}
		return rt
	}
	return forward.API{
		Upstream: forward.Upstream{API: "taxonomy", Kind: credentials.KindAnalytics, Fallback: cfg.URL,
			Flag: "--analytics-url", Scheme: forward.SchemeProjectBasic},
		Errors: WriteError,
		Limits: []forward.Limit{{
			Config: lim,
			Cost:   Cost,
			Says:   fmt.Sprintf("a cost of %d in flight and %d per %v per project", lim.MaxInFlight, lim.Limit, lim.Window),
		}},
		Routes: []forward.Route{
			r(post, c, "category_name"),
			r(get, c),
			r(get, c+"/{category_name}"),
			r(put, c+"/{category_id}", "category_name"),
			r(del, c+"/{category_id}"),
			r(post, e, "event_type"),
			r(get, e),
			r(get, e+"/{event_type}"),
			r(put, e+"/{event_type}"),
			r(del, e+"/{event_type}"),
			r(post, e+"/{event_type}/restore"),
			r(post, ep, "event_property"),
			r(get, ep),
			r(put, ep+"/{event_property}"),
			r(del, ep+"/{event_property}"),
			r(post, ep+"/{event_property}/restore"),
			r(post, up, "user_property"),
			r(get, up),
			r(get, up+"/{user_property}"),
			r(put, up+"/{user_property}"),
			r(del, up+"/{user_property}"),
			r(post, up+"/{user_property}/restore"),
			r(post, gp, "group_type", "group_property"),
			r(get, gp),
		},
	}
}

// WriteError writes a local answer in the taxonomy error format:
// {"success":false,"errors":[{"message":"relay: ..."}],"source":"relay"}.
func WriteError(w http.ResponseWriter, p *forward.Problem) {
	body, _ := json.Marshal(map[string]any{"success": false, "errors": []any{map[string]string{"message": "relay: " + p.Msg}}, "source": "relay"})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(p.Status)
	w.Write(body)
}

// requires checks that a form body (or the query) holds every field.
func requires(fields []string) func(r *http.Request, body []byte) *forward.Problem {
	return func(r *http.Request, body []byte) *forward.Problem {
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return forward.Bad("body is not form encoded (application/x-www-form-urlencoded)")
		}
		q := r.URL.Query()
		for _, f := range fields {
			if form.Get(f) == "" && q.Get(f) == "" {
				return forward.Bad("missing required field: %s", f)
			}
		}
		return nil
	}
}
