// The experiment management API (docs/upstream-api.md, "Experiment
// management"): base --experiment-url, the organization's
// management_api_key as Bearer, "Accept: application/json" when the caller
// sent none. No documented rate limit: no client-side limiter.

package forward

import (
	"cmp"
	"encoding/json"
	"net/http"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/credentials"
)

// experimentBulkMax is the most ids a bulk delete may carry.
const experimentBulkMax = 100

// Experiments returns the experiment management API described above.
func Experiments(c APIConfig) API {
	const (
		get, post, patch, del = http.MethodGet, http.MethodPost, http.MethodPatch, http.MethodDelete
		root                  = "/api/1/experiments"
		e                     = root + "/{id}"
		v                     = e + "/variants/{variantKey}"
	)
	r := func(method, path string, c func(body []byte) *Problem) adminroute.Route {
		rt := adminroute.Route{Method: method, Path: path}
		if c != nil {
			rt.Handler = Endpoint{BodyLimit: DefaultMaxRequestBodyBytes, Check: func(_ *http.Request, body []byte) *Problem { return c(body) }}
		}
		return rt
	}
	return API{
		Upstream: Upstream{API: "experiment", Kind: credentials.KindExperiment, Fallback: c.URL,
			Scheme: SchemeManagementBearer},
		Accept: "application/json",
		Routes: []adminroute.Route{
			r(get, root, nil),
			r(post, root, experimentCreate),
			r(get, e, nil),
			r(patch, e, experimentIsObject),
			r(get, e+"/versions", nil),
			r(get, e+"/versions/{versionId}", nil),
			r(get, e+"/variants", nil),
			r(post, e+"/variants", experimentVariant),
			r(get, v, nil),
			r(patch, v, experimentIsObject),
			r(del, v, nil),
			r(get, v+"/users", nil),
			r(get, v+"/cohorts", nil),
			r(post, v+"/users", experimentStrings("inclusions", 0)),
			r(post, v+"/cohorts", experimentStrings("inclusions", 0)),
			r(del, v+"/users/{userIndex}", nil),
			r(del, v+"/users", nil),
			r(del, v+"/bulk-delete-users", experimentStrings("users", experimentBulkMax)),
			r(del, v+"/bulk-delete-cohorts", experimentStrings("users", experimentBulkMax)),
			r(get, e+"/deployments", nil),
			r(post, e+"/deployments", experimentStrings("deployments", 0)),
			r(del, e+"/deployments/{deploymentId}", nil),
		},
	}
}

func experimentObject(body []byte) (map[string]json.RawMessage, *Problem) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		return nil, Bad("body must be a JSON object")
	}
	return m, nil
}

func experimentIsObject(body []byte) *Problem {
	_, p := experimentObject(body)
	return p
}

// experimentStrings requires body[field] to be an array of strings, of at most
// most entries when most > 0.
func experimentStrings(field string, most int) func([]byte) *Problem {
	return func(body []byte) *Problem {
		m, p := experimentObject(body)
		if p != nil {
			return p
		}
		var v []string
		if err := json.Unmarshal(m[field], &v); err != nil || v == nil {
			return Bad("%q must be an array of strings", field)
		}
		if most > 0 && len(v) > most {
			return Bad("%q holds %d entries; at most %d per request", field, len(v), most)
		}
		return nil
	}
}

func experimentVariantKey(raw json.RawMessage) *Problem {
	var v struct {
		Key *string `json:"key"`
	}
	if json.Unmarshal(raw, &v) != nil || v.Key == nil || *v.Key == "" {
		return Bad("a variant needs a non-empty string \"key\"")
	}
	return nil
}

func experimentVariant(body []byte) *Problem {
	return cmp.Or(experimentIsObject(body), experimentVariantKey(body))
}

func experimentCreate(body []byte) *Problem {
	m, p := experimentObject(body)
	if p != nil {
		return p
	}
	var vs []json.RawMessage
	if raw, ok := m["variants"]; !ok || string(raw) == "null" {
		return nil
	} else if json.Unmarshal(raw, &vs) != nil {
		return Bad("\"variants\" must be an array of objects")
	}
	for _, v := range vs {
		if p := experimentVariantKey(v); p != nil {
			return p
		}
	}
	return nil
}
