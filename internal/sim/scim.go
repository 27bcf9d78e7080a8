package sim

import (
	"encoding/json"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SCIM provisioning (/scim/1), by docs/upstream-api.md (SCIM provisioning).
//
// State per organization (the SCIM token's): users keyed by lower-cased
// email (pending or joined, both reported active) and groups with numeric
// ids. Rate: Knobs.SCIMLimit requests per SCIMWindow per organization (100
// per minute), counted at arrival after authentication; above it 429 with
// Retry-After (the refused call is not counted). Errors use the SCIM error schema
// {"schemas":[ErrorSchema],"status":"400","scimType":...,"detail":...}.
//
//	GET    /scim/1/Users   startIndex (>=1, default 1), itemsPerPage (1..100,
//	                       default 100; above 100: 400), filter `userName eq "x"`
//	                       (other filters: 400 invalidFilter)
//	GET    /scim/1/Users/{id}     404 unknown; id not case sensitive
//	POST   /scim/1/Users          id and userName valid emails (400), new (409): 201 echo
//	PUT    /scim/1/Users/{id}     PATCH as well: 404 unknown; userName change 400;
//	                              active=false removes the user; 200 echo
//	DELETE /scim/1/Users/{id}     204; 404 unknown
//	GET    /scim/1/Groups         list (startIndex, itemsPerPage)
//	GET    /scim/1/Groups/{id}    id an integer (400), 404 unknown; id as string
//	POST   /scim/1/Groups         displayName required; members' emails; unknown
//	                              members become pending users; 200, numeric id
//	PATCH  /scim/1/Groups/{id}    PatchOp schema, Operations of op add|remove,
//	                              path "members" (or members[value eq "x"]),
//	                              value [{value}]: 200 group (id as string)
//	DELETE /scim/1/Groups/{id}    204

// SCIM constants of the document.
const (
	SCIMUserSchema    = "urn:ietf:params:scim:schemas:core:2.0:User"
	SCIMGroupSchema   = "urn:ietf:params:scim:schemas:core:2.0:Group"
	SCIMListSchema    = "urn:ietf:params:scim:api:messages:2.0:ListResponse"
	SCIMPatchOpSchema = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
	SCIMErrorSchema   = "urn:ietf:params:scim:api:messages:2.0:Error"
	SCIMMaxPageSize   = 100
	scimMaxBody       = 1 << 20
)

type scimUser struct {
	email string
	body  map[string]any
}

type scimGroup struct {
	id          int
	displayName string
	members     []string // emails, lower-cased
	created     time.Time
	modified    time.Time
}

type scimOrg struct {
	users  map[string]*scimUser
	order  []string // user keys in creation order
	groups map[int]*scimGroup
	nextID int
}

// scimReq is one SCIM request: its organization, and the user (by its
// lower-cased key) or group its path's {id} names.
type scimReq struct {
	*mgRequest
	o   *scimOrg
	m   map[string]any // the body's JSON object, nil when it is none
	u   *scimUser
	key string
	g   *scimGroup
}

func (s *Sim) registerSCIM() {
	var orgs map[string]*scimOrg
	var hits windowHits // requests per organization
	s.onReset(func() { orgs, hits = map[string]*scimOrg{}, windowHits{} })
	// r registers a SCIM route: f answers for the organization once the rate
	// passes, the path's {id} names a user (an email, not checked for a
	// GET: 400) or a group (an integer: 400) that exists (404), and the body
	// is a JSON object where object names the route (400).
	object := map[string]bool{"POST /scim/1/Users": true, "PUT /scim/1/Users/{id}": true,
		"PATCH /scim/1/Users/{id}": true, "POST /scim/1/Groups": true}
	r := func(pattern string, f func(w http.ResponseWriter, q *scimReq) (int, any)) {
		s.mgmtRoute("scim", pattern, authSCIMBearer, scimMaxBody, func(w http.ResponseWriter, mq *mgRequest) (int, any) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if ok, wait := hits.take(mq.account, mq.call.Time, 1, s.knobs.SCIMLimit, s.knobs.SCIMWindow); !ok {
				retryAfter(w, wait)
				return scimError(http.StatusTooManyRequests, "", "Too many requests: 100 per minute per organization")
			}
			q := &scimReq{mgRequest: mq, m: decodeObject(mq.body), o: entry(orgs, mq.account, func() *scimOrg {
				return &scimOrg{users: map[string]*scimUser{}, groups: map[int]*scimGroup{}, nextID: 1001}
			})}
			id := mq.r.PathValue("id")
			n, err := strconv.Atoi(id)
			users := strings.Contains(pattern, "/Users/")
			switch {
			case id == "":
			case users && !ValidEmail(id) && !strings.HasPrefix(pattern, "GET "):
				return scimError(http.StatusBadRequest, "invalidValue", "id must be a valid email")
			case users:
				if q.key = strings.ToLower(id); q.o.users[q.key] == nil {
					return scimError(http.StatusNotFound, "", "user not found")
				}
				q.u = q.o.users[q.key]
			case err != nil:
				return scimError(http.StatusBadRequest, "invalidValue", "group id must be an integer")
			case q.o.groups[n] == nil:
				return scimError(http.StatusNotFound, "", "group not found")
			default:
				q.g = q.o.groups[n]
			}
			if q.m == nil && object[pattern] {
				return scimError(http.StatusBadRequest, "invalidSyntax", "body is not a JSON object")
			}
			return f(w, q)
		})
	}
	r("GET /scim/1/Users", func(_ http.ResponseWriter, q *scimReq) (int, any) {
		o := q.o
		want := ""
		if f := strings.TrimSpace(q.r.URL.Query().Get("filter")); f != "" {
			parts := strings.SplitN(f, " ", 3)
			if len(parts) != 3 || !strings.EqualFold(parts[0], "userName") || !strings.EqualFold(parts[1], "eq") ||
				len(parts[2]) < 2 || parts[2][0] != '"' || parts[2][len(parts[2])-1] != '"' {
				return scimError(http.StatusBadRequest, "invalidFilter", `only filter=userName eq "email" is supported`)
			}
			want = strings.ToLower(parts[2][1 : len(parts[2])-1])
		}
		var all []*scimUser
		for _, k := range o.order {
			if u := o.users[k]; u != nil && (want == "" || k == want) {
				all = append(all, u)
			}
		}
		return scimList(q.r, all, func(u *scimUser) any { return o.userView(u, false) })
	})
	r("GET /scim/1/Users/{id}", func(_ http.ResponseWriter, q *scimReq) (int, any) {
		return http.StatusOK, q.o.userView(q.u, true)
	})
	r("POST /scim/1/Users", func(w http.ResponseWriter, q *scimReq) (int, any) {
		o, m := q.o, q.m
		id, _ := m["id"].(string)
		userName, _ := m["userName"].(string)
		if !ValidEmail(id) || !ValidEmail(userName) || !strings.EqualFold(id, userName) {
			return scimError(http.StatusBadRequest, "invalidValue", "id and userName must be the same valid email")
		}
		key := strings.ToLower(userName)
		if o.users[key] != nil {
			return scimError(http.StatusConflict, "uniqueness", "user exists or has a pending invitation")
		}
		o.users[key] = &scimUser{email: userName, body: m}
		o.order = append(o.order, key)
		w.Header().Set("Location", "/scim/1/Users/"+userName)
		return http.StatusCreated, q.body
	})
	updateUser := func(_ http.ResponseWriter, q *scimReq) (int, any) {
		o, u, m := q.o, q.u, q.m
		if un, ok := m["userName"].(string); ok && !strings.EqualFold(un, u.email) {
			return scimError(http.StatusBadRequest, "mutability", "the email address of a user cannot be changed")
		}
		if active, ok := m["active"].(bool); ok && !active {
			o.removeUser(q.key)
		} else {
			maps.Copy(u.body, m)
		}
		return http.StatusOK, q.body
	}
	r("PUT /scim/1/Users/{id}", updateUser)
	r("PATCH /scim/1/Users/{id}", updateUser)
	r("DELETE /scim/1/Users/{id}", func(_ http.ResponseWriter, q *scimReq) (int, any) {
		q.o.removeUser(q.key)
		return http.StatusNoContent, nil
	})
	r("GET /scim/1/Groups", func(_ http.ResponseWriter, q *scimReq) (int, any) {
		return scimList(q.r, q.o.sortedGroups(), func(g *scimGroup) any { return q.o.groupView(g, false) })
	})
	r("GET /scim/1/Groups/{id}", func(_ http.ResponseWriter, q *scimReq) (int, any) {
		return http.StatusOK, q.o.groupView(q.g, true)
	})
	r("POST /scim/1/Groups", func(_ http.ResponseWriter, q *scimReq) (int, any) {
		o, m := q.o, q.m
		name, _ := m["displayName"].(string)
		if name == "" {
			return scimError(http.StatusBadRequest, "invalidValue", "displayName is required")
		}
		var members []string
		if v, ok := m["members"]; ok && v != nil {
			if members, ok = memberValues(v); !ok {
				return scimError(http.StatusBadRequest, "invalidValue", "members must be objects with a valid email value")
			}
		}
		now := s.cfg.Now()
		g := &scimGroup{id: o.nextID, displayName: name, created: now, modified: now}
		o.nextID++
		o.groups[g.id] = g
		for _, e := range members {
			o.addMember(g, e)
		}
		return http.StatusOK, o.groupView(g, false)
	})
	r("PATCH /scim/1/Groups/{id}", func(_ http.ResponseWriter, q *scimReq) (int, any) {
		o, g := q.o, q.g
		var body struct {
			Schemas    []string `json:"schemas"`
			Operations []struct {
				Op    string `json:"op"`
				Path  string `json:"path"`
				Value any    `json:"value"`
			} `json:"Operations"`
		}
		if err := json.Unmarshal(q.body, &body); err != nil {
			return scimError(http.StatusBadRequest, "invalidSyntax", "body is not a PatchOp")
		}
		if !slices.Contains(body.Schemas, SCIMPatchOpSchema) || len(body.Operations) == 0 {
			return scimError(http.StatusBadRequest, "invalidSyntax", "schemas must hold "+SCIMPatchOpSchema+" and Operations must not be empty")
		}
		type change struct {
			add    bool
			emails []string
		}
		var changes []change
		for _, op := range body.Operations {
			kind := strings.ToLower(op.Op)
			if kind != "add" && kind != "remove" {
				return scimError(http.StatusBadRequest, "invalidSyntax", "op must be add or remove")
			}
			var emails []string
			switch {
			case op.Path == "members":
				var ok bool
				if emails, ok = memberValues(op.Value); !ok {
					return scimError(http.StatusBadRequest, "invalidValue", "value must be objects with a valid email value")
				}
			case kind == "remove" && strings.HasPrefix(op.Path, `members[value eq "`) && strings.HasSuffix(op.Path, `"]`):
				emails = []string{strings.TrimSuffix(strings.TrimPrefix(op.Path, `members[value eq "`), `"]`)}
			default:
				return scimError(http.StatusBadRequest, "invalidPath", "path must be members")
			}
			changes = append(changes, change{add: kind == "add", emails: emails})
		}
		for _, c := range changes {
			for _, e := range c.emails {
				if c.add {
					o.addMember(g, e)
				} else {
					g.members = removeString(g.members, strings.ToLower(e))
				}
			}
		}
		g.modified = s.cfg.Now()
		return http.StatusOK, o.groupView(g, true)
	})
	r("DELETE /scim/1/Groups/{id}", func(_ http.ResponseWriter, q *scimReq) (int, any) {
		delete(q.o.groups, q.g.id)
		return http.StatusNoContent, nil
	})
}

func scimError(status int, scimType, detail string) (int, any) {
	b := map[string]any{"schemas": []string{SCIMErrorSchema}, "status": strconv.Itoa(status), "detail": detail}
	if scimType != "" {
		b["scimType"] = scimType
	}
	return status, b
}

// ValidEmail is the simulator's email check: one '@', a non-empty local
// part, a domain with a dot between non-empty labels, no spaces or control
// characters.
func ValidEmail(s string) bool {
	local, domain, ok := strings.Cut(s, "@")
	if !ok || local == "" || domain == "" || strings.Contains(domain, "@") || len(s) > 254 {
		return false
	}
	for _, c := range s {
		if c <= ' ' || c == 0x7f || c == '<' || c == '>' || c == ',' || c == ';' {
			return false
		}
	}
	labels := strings.Split(domain, ".")
	return len(labels) >= 2 && !slices.Contains(labels, "")
}

// scimList answers the page of all that the query's startIndex and
// itemsPerPage name, each as view shows it.
func scimList[T any](r *http.Request, all []T, view func(T) any) (int, any) {
	q := r.URL.Query()
	start, ok := queryInt(q, "startIndex", 1, 1, math.MaxInt)
	if !ok {
		return scimError(http.StatusBadRequest, "invalidValue", "startIndex must be an integer >= 1")
	}
	count, ok := queryInt(q, "itemsPerPage", SCIMMaxPageSize, 0, SCIMMaxPageSize)
	if !ok {
		return scimError(http.StatusBadRequest, "invalidValue", "itemsPerPage must be an integer from 0 to 100")
	}
	lo := min(start-1, len(all))
	res := views(all[lo:lo+min(count, len(all)-lo)], view)
	return http.StatusOK, map[string]any{"schemas": []string{SCIMListSchema}, "startIndex": start, "itemsPerPage": len(res),
		"totalResults": len(all), "Resources": res}
}

func (o *scimOrg) userView(u *scimUser, withGroups bool) map[string]any {
	v := maps.Clone(u.body)
	v["schemas"] = []string{SCIMUserSchema}
	v["id"] = u.email
	v["userName"] = u.email
	v["active"] = true
	v["meta"] = map[string]any{"resourceType": "User"}
	if withGroups {
		gs := []any{}
		for _, g := range o.sortedGroups() {
			if slices.Contains(g.members, strings.ToLower(u.email)) {
				gs = append(gs, map[string]any{"value": strconv.Itoa(g.id), "display": g.displayName})
			}
		}
		v["groups"] = gs
	}
	return v
}

func (o *scimOrg) sortedGroups() []*scimGroup {
	return slices.SortedFunc(maps.Values(o.groups), func(a, b *scimGroup) int { return a.id - b.id })
}

// decodeObject returns the JSON object b holds, nil when it holds none.
func decodeObject(b []byte) map[string]any {
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m
}

func (o *scimOrg) removeUser(key string) {
	delete(o.users, key)
	o.order = removeString(o.order, key)
	for _, g := range o.groups {
		g.members = removeString(g.members, key)
	}
}

func removeString(v []string, s string) []string {
	return slices.DeleteFunc(v, func(x string) bool { return x == s })
}

func (o *scimOrg) groupView(g *scimGroup, idAsString bool) map[string]any {
	members := []any{}
	for _, m := range g.members {
		display := m
		if u := o.users[m]; u != nil {
			display = u.email
			if n, ok := u.body["name"].(map[string]any); ok {
				gn, _ := n["givenName"].(string)
				fn, _ := n["familyName"].(string)
				if d := strings.TrimSpace(gn + " " + fn); d != "" {
					display = d
				}
			}
		}
		members = append(members, map[string]any{"value": m, "display": display})
	}
	var id any = g.id
	if idAsString {
		id = strconv.Itoa(g.id)
	}
	const ts = "2006-01-02T15:04:05.000+00:00"
	return map[string]any{"schemas": []string{SCIMGroupSchema}, "id": id, "displayName": g.displayName,
		"members": members, "meta": map[string]any{"resourceType": "Group",
			"created": g.created.UTC().Format(ts), "lastModified": g.modified.UTC().Format(ts)}}
}

// memberValues reads [{"value": email}, ...]; ok false when malformed.
func memberValues(v any) ([]string, bool) {
	arr, ok := v.([]any)
	if !ok {
		return nil, false
	}
	var out []string
	for _, x := range arr {
		m, _ := x.(map[string]any) // nil when x is not an object: no value
		e, ok := m["value"].(string)
		if !ok || !ValidEmail(e) {
			return nil, false
		}
		out = append(out, e)
	}
	return out, true
}

func (o *scimOrg) addMember(g *scimGroup, email string) {
	key := strings.ToLower(email)
	if o.users[key] == nil { // not in the organization: invited, pending
		o.users[key] = &scimUser{email: email, body: map[string]any{}}
		o.order = append(o.order, key)
	}
	if !slices.Contains(g.members, key) {
		g.members = append(g.members, key)
	}
}
