// The experiment management API (docs/upstream-api.md, "Experiment
// management"): base --experiment-url, the organization's
// management_api_key as Bearer, "Accept: application/json" when the caller
// sent none. No documented rate limit: no client-side limiter.

package forward

import (
	"encoding/json"
	"fmt"
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
	r := func(method, path string, c experimentCheck) adminroute.Route {
		rt := adminroute.Route{Method: method, Path: path}
		if c != nil {
			rt.Handler = Endpoint{BodyLimit: DefaultMaxRequestBodyBytes, Check: func(_ *http.Request, body []byte) *Problem {
				if msg := c(body); msg != "" {
					return Bad("%s", msg)
				}
				return nil
			}}
		}
		return rt
	}
	return API{
		Upstream: Upstream{API: "experiment", Kind: credentials.KindExperiment, Fallback: c.URL,
			Flag: "--experiment-url", Scheme: SchemeManagementBearer},
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

// experimentCheck validates a decoded body; it returns "" or the message
// of a 400.
type experimentCheck func(body []byte) string

func experimentObject(body []byte) (map[string]json.RawMessage, string) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		return nil, "body must be a JSON object"
	}
	return m, ""
}

func experimentIsObject(body []byte) string {
	_, msg := experimentObject(body)
	return msg
}

// experimentStrings requires body[field] to be an array of strings, of at most
// most entries when most > 0.
func experimentStrings(field string, most int) experimentCheck {
	return func(body []byte) string {
		m, msg := experimentObject(body)
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

func experimentVariantKey(raw json.RawMessage) string {
	var v struct {
		Key *string `json:"key"`
	}
	if json.Unmarshal(raw, &v) != nil || v.Key == nil || *v.Key == "" {
		return "a variant needs a non-empty string \"key\""
	}
	return ""
}

func experimentVariant(body []byte) string {
	if _, msg := experimentObject(body); msg != "" {
		return msg
	}
	return experimentVariantKey(body)
}

func experimentCreate(body []byte) string {
	m, msg := experimentObject(body)
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
		if msg := experimentVariantKey(v); msg != "" {
			return msg
		}
	}
	return ""
}
