// Package experiments forwards the experiment management API
// (/api/1/experiments/...; docs/upstream-api.md, "Experiment management") on
// the admin listener, on the upstream's paths.
//
// Every endpoint of the document's table is a route of API; any other path
// under /api/1/experiments is answered 404 or 405 by the admin listener and never forwarded. The
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
	"net/http"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
)

// BulkMax is the most ids a bulk delete may carry.
const BulkMax = 100

// Root is the path every route of this package is under.
const Root = "/api/1/experiments"

// API is the experiment management API as forward data: base
// --experiment-url (url), the organization's management_api_key as Bearer,
// and the routes of the document's table with their checks.
func API(url string) forward.API {
	const (
		get, post, patch, del = http.MethodGet, http.MethodPost, http.MethodPatch, http.MethodDelete
		e                     = Root + "/{id}"
		v                     = e + "/variants/{variantKey}"
	)
	r := func(method, path string, c check) forward.Route {
		rt := forward.Route{Method: method, Path: path}
		if c != nil {
			rt.BodyLimit = forward.DefaultMaxRequestBodyBytes
			rt.Check = func(_ *http.Request, body []byte) *forward.Problem {
				if msg := c(body); msg != "" {
					return forward.Bad("%s", msg)
				}
				return nil
			}
		}
		return rt
	}
	return forward.API{
		Upstream: forward.Upstream{API: "experiment", Kind: credentials.KindExperiment, Fallback: url,
			Flag: "--experiment-url", Scheme: forward.SchemeManagementBearer},
		Accept: "application/json",
		Routes: []forward.Route{
			r(get, Root, nil),
			r(post, Root, checkCreate),
			r(get, e, nil),
			r(patch, e, checkObject),
			r(get, e+"/versions", nil),
			r(get, e+"/versions/{versionId}", nil),
			r(get, e+"/variants", nil),
			r(post, e+"/variants", checkVariant),
			r(get, v, nil),
			r(patch, v, checkObject),
			r(del, v, nil),
			r(get, v+"/users", nil),
			r(get, v+"/cohorts", nil),
			r(post, v+"/users", checkStrings("inclusions", 0)),
			r(post, v+"/cohorts", checkStrings("inclusions", 0)),
			r(del, v+"/users/{userIndex}", nil),
			r(del, v+"/users", nil),
			r(del, v+"/bulk-delete-users", checkStrings("users", BulkMax)),
			r(del, v+"/bulk-delete-cohorts", checkStrings("users", BulkMax)),
			r(get, e+"/deployments", nil),
			r(post, e+"/deployments", checkStrings("deployments", 0)),
			r(del, e+"/deployments/{deploymentId}", nil),
		},
	}
}

// check validates a decoded body; it returns "" or the message of a 400.
type check func(body []byte) string

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
