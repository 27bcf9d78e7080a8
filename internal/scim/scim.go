// Package scim forwards the SCIM 2.0 provisioning API (/scim/1/Users,
// /scim/1/Groups; docs/upstream-api.md, "SCIM provisioning") on the admin
// listener, on the upstream's paths, within the upstream's rate limit.
//
// Every endpoint of the document's table is a route of API; other paths
// under /scim/1/Users and /scim/1/Groups are answered 404 or 405 by the admin listener. The
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
// Client-side limit: at most Rate requests per Window per organization
// (the injected organization, or for pass-through calls the caller's
// bearer token, kept as a hash), counted from each call's answer (see
// internal/ratelimit; forward.APIConfig.Limit changes the figures: its
// Limit is the rate). A call whose turn is further than MaxWait (10 s)
// gets a local 429 with Retry-After; an upstream 429 is passed back with
// its Retry-After, and holds that organization's further calls back for it
// (clamped to 1 s .. Window): they wait, or get a local 429 when that is
// further than MaxWait.
package scim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/ratelimit"
)

// Limits of the document.
const (
	MaxItemsPerPage = 100
	Rate            = 100
	Window          = time.Minute
	PatchOpSchema   = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
	ErrorSchema     = "urn:ietf:params:scim:api:messages:2.0:Error"
	rootUsers       = "/scim/1/Users"
	rootGroups      = "/scim/1/Groups"
)

// API returns the SCIM API as forward data: base cfg.URL (--scim-url),
// the organization's scim_token as Bearer, the SCIM error format, the
// client-side limit (Rate per Window, as cfg changes it) and the routes of
// the document's table with their checks.
func API(cfg forward.APIConfig) forward.API {
	lim := cfg.Over(ratelimit.Config{Name: "scim", Limit: Rate, Window: Window})
	const get, post, put, patch, del = http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete
	r := func(method, path string, c check, body bool) forward.Route {
		rt := forward.Route{Method: method, Path: path, Check: c}
		if body {
			rt.BodyLimit = forward.DefaultMaxRequestBodyBytes
		}
		return rt
	}
	return forward.API{
		Upstream: forward.Upstream{API: "scim", Kind: credentials.KindSCIM, Fallback: cfg.URL, Flag: "--scim-url",
			Scheme: forward.SchemeSCIMBearer},
		Errors: WriteError,
		Limits: []forward.Limit{{
			Config: lim,
			Says:   fmt.Sprintf("%d requests per %v per organization", lim.Limit, lim.Window),
		}},
		Routes: []forward.Route{
			r(get, rootUsers, checkPage, false),
			r(get, rootUsers+"/{id}", nil, false),
			r(post, rootUsers, checkUser, true),
			r(put, rootUsers+"/{id}", checkUserID, false),
			r(patch, rootUsers+"/{id}", checkUserID, false),
			r(del, rootUsers+"/{id}", checkUserID, false),
			r(get, rootGroups, checkPage, false),
			r(get, rootGroups+"/{id}", checkGroupID, false),
			r(post, rootGroups, checkGroup, true),
			r(patch, rootGroups+"/{id}", checkPatch, true),
			r(del, rootGroups+"/{id}", checkGroupID, false),
		},
	}
}

// WriteError writes a local answer in the SCIM error format, with
// "detail" starting "relay: " and "source":"relay".
func WriteError(w http.ResponseWriter, p *forward.Problem) {
	b := map[string]any{"schemas": []string{ErrorSchema}, "status": strconv.Itoa(p.Status), "detail": "relay: " + p.Msg, "source": "relay"}
	if p.Type != "" {
		b["scimType"] = p.Type
	}
	body, _ := json.Marshal(b)
	w.Header().Set("Content-Type", "application/scim+json")
	w.WriteHeader(p.Status)
	w.Write(body)
}

// check validates a request (its path values, query, decoded body).
type check = func(r *http.Request, body []byte) *forward.Problem

func problem(scimType, detail string) *forward.Problem {
	return &forward.Problem{Status: http.StatusBadRequest, Type: scimType, Msg: detail}
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

func checkPage(r *http.Request, _ []byte) *forward.Problem {
	args := r.URL.Query()
	if v, ok := args["startIndex"]; ok {
		if n, err := strconv.Atoi(v[0]); err != nil || n < 1 {
			return problem("invalidValue", "startIndex must be an integer >= 1")
		}
	}
	if v, ok := args["itemsPerPage"]; ok {
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 0 {
			return problem("invalidValue", "itemsPerPage must be a non-negative integer")
		}
		if n > MaxItemsPerPage {
			return problem("invalidValue", fmt.Sprintf("itemsPerPage %d is above the maximum of %d", n, MaxItemsPerPage))
		}
	}
	return nil
}

func checkUserID(r *http.Request, _ []byte) *forward.Problem {
	if !ValidEmail(r.PathValue("id")) {
		return problem("invalidValue", "the user id in the path must be a valid email")
	}
	return nil
}

func checkUser(_ *http.Request, body []byte) *forward.Problem {
	var u struct {
		ID       *string `json:"id"`
		UserName *string `json:"userName"`
	}
	if err := json.Unmarshal(body, &u); err != nil {
		return problem("invalidSyntax", "body must be a SCIM User JSON object")
	}
	if u.ID == nil || u.UserName == nil || !ValidEmail(*u.ID) || !ValidEmail(*u.UserName) {
		return problem("invalidValue", "id and userName must be valid emails")
	}
	return nil
}

func checkGroupID(r *http.Request, _ []byte) *forward.Problem {
	if _, err := strconv.Atoi(r.PathValue("id")); err != nil {
		return problem("invalidValue", "the group id in the path must be an integer")
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

func checkGroup(_ *http.Request, body []byte) *forward.Problem {
	var g struct {
		DisplayName *string         `json:"displayName"`
		Members     json.RawMessage `json:"members"`
	}
	if err := json.Unmarshal(body, &g); err != nil {
		return problem("invalidSyntax", "body must be a SCIM Group JSON object")
	}
	if g.DisplayName == nil || *g.DisplayName == "" {
		return problem("invalidValue", "displayName is required")
	}
	if len(g.Members) > 0 && string(g.Members) != "null" && !checkMembers(g.Members) {
		return problem("invalidValue", "members must be objects whose value is a valid email")
	}
	return nil
}

func checkPatch(r *http.Request, raw []byte) *forward.Problem {
	if pr := checkGroupID(r, nil); pr != nil {
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
		return problem("invalidSyntax", "body must be a PatchOp JSON object")
	}
	found := false
	for _, s := range body.Schemas {
		found = found || s == PatchOpSchema
	}
	if !found {
		return problem("invalidSyntax", "schemas must contain "+PatchOpSchema)
	}
	if len(body.Operations) == 0 {
		return problem("invalidSyntax", "Operations must be a non-empty array")
	}
	for i, op := range body.Operations {
		if op.Op == nil || (!strings.EqualFold(*op.Op, "add") && !strings.EqualFold(*op.Op, "remove")) {
			return problem("invalidSyntax", fmt.Sprintf("Operations[%d].op must be add or remove", i))
		}
		add := strings.EqualFold(*op.Op, "add")
		switch {
		case op.Path != nil && *op.Path == "members":
			if (add || len(op.Value) > 0) && !checkMembers(op.Value) {
				return problem("invalidValue", fmt.Sprintf("Operations[%d].value must be objects whose value is a valid email", i))
			}
		case !add && op.Path != nil && strings.HasPrefix(*op.Path, "members[") && strings.HasSuffix(*op.Path, "]"):
			// remove with a filter path: its exact shape is not documented.
		default:
			return problem("invalidPath", fmt.Sprintf("Operations[%d].path must be members", i))
		}
	}
	return nil
}
