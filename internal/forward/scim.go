// The SCIM 2.0 provisioning API (docs/upstream-api.md, "SCIM
// provisioning"): base --scim-url, the organization's scim_token as Bearer.
// Local answers are in the SCIM error format, "detail" starting "relay: ".
// One limit per organization (or caller's token hash): scimRate per
// scimWindow, counted from each call's answer; an upstream 429 holds the
// account's further calls back for its Retry-After.

package forward

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/ratelimit"
)

// Limits and schemas of the SCIM document.
const (
	scimMaxItemsPerPage = 100
	scimRate            = 100
	scimWindow          = time.Minute
	SCIMPatchOpSchema   = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
	SCIMErrorSchema     = "urn:ietf:params:scim:api:messages:2.0:Error"
	scimUsers           = "/scim/1/Users"
	scimGroups          = "/scim/1/Groups"
)

// SCIM returns the SCIM API described above; c changes its base and
// limit.
func SCIM(c APIConfig) API {
	lim := c.Over(ratelimit.Config{Name: "scim", Limit: scimRate, Window: scimWindow})
	const get, post, put, patch, del = http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete
	const body = DefaultMaxRequestBodyBytes
	return API{
		Upstream: Upstream{API: "scim", Kind: credentials.KindSCIM, Fallback: c.URL,
			Scheme: SchemeSCIMBearer},
		Errors: scimError,
		Limits: []Limit{{
			Config: lim,
			Says:   fmt.Sprintf("%d requests per %v per organization", lim.Limit, lim.Window),
		}},
		Routes: []adminroute.Route{
			{Method: get, Path: scimUsers, Handler: Endpoint{Check: scimPage}},
			{Method: get, Path: scimUsers + "/{id}"},
			{Method: post, Path: scimUsers, Handler: Endpoint{Check: scimUser, BodyLimit: body}},
			{Method: put, Path: scimUsers + "/{id}", Handler: Endpoint{Check: scimUserID}},
			{Method: patch, Path: scimUsers + "/{id}", Handler: Endpoint{Check: scimUserID}},
			{Method: del, Path: scimUsers + "/{id}", Handler: Endpoint{Check: scimUserID}},
			{Method: get, Path: scimGroups, Handler: Endpoint{Check: scimPage}},
			{Method: get, Path: scimGroups + "/{id}", Handler: Endpoint{Check: scimGroupID}},
			{Method: post, Path: scimGroups, Handler: Endpoint{Check: scimGroup, BodyLimit: body}},
			{Method: patch, Path: scimGroups + "/{id}", Handler: Endpoint{Check: scimPatch, BodyLimit: body}},
			{Method: del, Path: scimGroups + "/{id}", Handler: Endpoint{Check: scimGroupID}},
		},
	}
}

// scimError writes a local answer in the SCIM error format, with "detail"
// starting "relay: " and "source":"relay".
func scimError(w http.ResponseWriter, p *Problem) {
	b := map[string]any{"schemas": []string{SCIMErrorSchema}, "status": strconv.Itoa(p.Status), "detail": "relay: " + p.Msg, "source": "relay"}
	if p.Type != "" {
		b["scimType"] = p.Type
	}
	body, _ := json.Marshal(b)
	w.Header().Set("Content-Type", "application/scim+json")
	w.WriteHeader(p.Status)
	w.Write(body)
}

func scimProblem(scimType, detail string) *Problem {
	return &Problem{Status: http.StatusBadRequest, Type: scimType, Msg: detail}
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
	return len(labels) >= 2 && !slices.Contains(labels, "")
}

func scimPage(r *http.Request, _ []byte) *Problem {
	args := r.URL.Query()
	if v, ok := args["startIndex"]; ok {
		if n, err := strconv.Atoi(v[0]); err != nil || n < 1 {
			return scimProblem("invalidValue", "startIndex must be an integer >= 1")
		}
	}
	if v, ok := args["itemsPerPage"]; ok {
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 0 {
			return scimProblem("invalidValue", "itemsPerPage must be a non-negative integer")
		}
		if n > scimMaxItemsPerPage {
			return scimProblem("invalidValue", fmt.Sprintf("itemsPerPage %d is above the maximum of %d", n, scimMaxItemsPerPage))
		}
	}
	return nil
}

func scimUserID(r *http.Request, _ []byte) *Problem {
	if !ValidEmail(r.PathValue("id")) {
		return scimProblem("invalidValue", "the user id in the path must be a valid email")
	}
	return nil
}

func scimUser(_ *http.Request, body []byte) *Problem {
	var u struct {
		ID       *string `json:"id"`
		UserName *string `json:"userName"`
	}
	if err := json.Unmarshal(body, &u); err != nil {
		return scimProblem("invalidSyntax", "body must be a SCIM User JSON object")
	}
	if u.ID == nil || u.UserName == nil || !ValidEmail(*u.ID) || !ValidEmail(*u.UserName) {
		return scimProblem("invalidValue", "id and userName must be valid emails")
	}
	return nil
}

func scimGroupID(r *http.Request, _ []byte) *Problem {
	if _, err := strconv.Atoi(r.PathValue("id")); err != nil {
		return scimProblem("invalidValue", "the group id in the path must be an integer")
	}
	return nil
}

func scimMembers(raw json.RawMessage) bool {
	var ms []struct {
		Value *string `json:"value"`
	}
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

func scimGroup(_ *http.Request, body []byte) *Problem {
	var g struct {
		DisplayName *string         `json:"displayName"`
		Members     json.RawMessage `json:"members"`
	}
	if err := json.Unmarshal(body, &g); err != nil {
		return scimProblem("invalidSyntax", "body must be a SCIM Group JSON object")
	}
	if g.DisplayName == nil || *g.DisplayName == "" {
		return scimProblem("invalidValue", "displayName is required")
	}
	if len(g.Members) > 0 && string(g.Members) != "null" && !scimMembers(g.Members) {
		return scimProblem("invalidValue", "members must be objects whose value is a valid email")
	}
	return nil
}

func scimPatch(r *http.Request, raw []byte) *Problem {
	if pr := scimGroupID(r, nil); pr != nil {
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
		return scimProblem("invalidSyntax", "body must be a PatchOp JSON object")
	}
	if !slices.Contains(body.Schemas, SCIMPatchOpSchema) {
		return scimProblem("invalidSyntax", "schemas must contain "+SCIMPatchOpSchema)
	}
	if len(body.Operations) == 0 {
		return scimProblem("invalidSyntax", "Operations must be a non-empty array")
	}
	for i, op := range body.Operations {
		if op.Op == nil || (!strings.EqualFold(*op.Op, "add") && !strings.EqualFold(*op.Op, "remove")) {
			return scimProblem("invalidSyntax", fmt.Sprintf("Operations[%d].op must be add or remove", i))
		}
		add := strings.EqualFold(*op.Op, "add")
		switch {
		case op.Path != nil && *op.Path == "members":
			if (add || len(op.Value) > 0) && !scimMembers(op.Value) {
				return scimProblem("invalidValue", fmt.Sprintf("Operations[%d].value must be objects whose value is a valid email", i))
			}
		case !add && op.Path != nil && strings.HasPrefix(*op.Path, "members[") && strings.HasSuffix(*op.Path, "]"):
			// remove with a filter path: its exact shape is not documented.
		default:
			return scimProblem("invalidPath", fmt.Sprintf("Operations[%d].path must be members", i))
		}
	}
	return nil
}
