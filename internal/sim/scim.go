package sim

import (
	"encoding/json"
	"maps"
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
// ids. Rate: SCIMRateLimit requests per SCIMRateWindow per organization,
// counted at arrival after authentication; above it 429 with Retry-After
// (the refused call is not counted). Errors use the SCIM error schema
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
	// SCIMRateLimit requests per SCIMRateWindow per organization.
	SCIMRateLimit  = 100
	SCIMRateWindow = time.Minute
	scimMaxBody    = 1 << 20
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

type scimState struct {
	orgs   map[string]*scimOrg
	hits   windowHits
	limit  int
	window time.Duration
}

// SetSCIMRate sets the SCIM rate limit (defaults SCIMRateLimit per
// SCIMRateWindow); zero values keep the current setting.
func (s *Sim) SetSCIMRate(limit int, window time.Duration) {
	s.mg.mu.Lock()
	defer s.mg.mu.Unlock()
	setPositive(&s.mg.scim.limit, limit)
	setPositive(&s.mg.scim.window, window)
}

// scimUsers returns the emails of org's users, sorted.
func (s *Sim) scimUsers(org string) []string {
	st := s.mg
	st.mu.Lock()
	defer st.mu.Unlock()
	if o := st.scim.orgs[org]; o != nil {
		return sortedKeys(o.users)
	}
	return nil
}

func (s *Sim) registerSCIM() {
	st := s.mg
	st.scim = &scimState{orgs: map[string]*scimOrg{}, hits: windowHits{}, limit: SCIMRateLimit, window: SCIMRateWindow}
	h := func(f func(st *mgmtState, o *scimOrg, w *statusWriter, q *mgRequest)) mgHandler {
		return func(w *statusWriter, q *mgRequest) {
			st.mu.Lock()
			defer st.mu.Unlock()
			if ok, wait := st.scim.hits.take(q.account, q.call.Time, 1, st.scim.limit, st.scim.window); !ok {
				retryAfter(w, wait)
				scimError(w, http.StatusTooManyRequests, "", "Too many requests: 100 per minute per organization")
				return
			}
			o := entry(st.scim.orgs, q.account, func() *scimOrg {
				return &scimOrg{users: map[string]*scimUser{}, groups: map[int]*scimGroup{}, nextID: 1001}
			})
			f(st, o, w, q)
		}
	}
	r := func(pattern string, f func(st *mgmtState, o *scimOrg, w *statusWriter, q *mgRequest)) {
		s.mgmtRoute("scim", pattern, authSCIMBearer, scimMaxBody, h(f))
	}
	r("GET /scim/1/Users", s.scimListUsers)
	r("GET /scim/1/Users/{id}", s.scimGetUser)
	r("POST /scim/1/Users", s.scimCreateUser)
	r("PUT /scim/1/Users/{id}", s.scimUpdateUser)
	r("PATCH /scim/1/Users/{id}", s.scimUpdateUser)
	r("DELETE /scim/1/Users/{id}", s.scimDeleteUser)
	r("GET /scim/1/Groups", s.scimListGroups)
	r("GET /scim/1/Groups/{id}", s.scimGetGroup)
	r("POST /scim/1/Groups", s.scimCreateGroup)
	r("PATCH /scim/1/Groups/{id}", s.scimPatchGroup)
	r("DELETE /scim/1/Groups/{id}", s.scimDeleteGroup)
}

func scimError(w http.ResponseWriter, status int, scimType, detail string) {
	b := map[string]any{"schemas": []string{SCIMErrorSchema}, "status": strconv.Itoa(status), "detail": detail}
	if scimType != "" {
		b["scimType"] = scimType
	}
	scimJSON(w, status, b)
}

func scimJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/scim+json")
	body := appendJSON(nil, v)
	w.WriteHeader(status)
	w.Write(body)
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

// page parses startIndex and itemsPerPage.
func scimPage(w http.ResponseWriter, r *http.Request) (start, count int, ok bool) {
	start, count = 1, SCIMMaxPageSize
	q := r.URL.Query()
	if v := q.Get("startIndex"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			scimError(w, http.StatusBadRequest, "invalidValue", "startIndex must be an integer >= 1")
			return 0, 0, false
		}
		start = n
	}
	if v := q.Get("itemsPerPage"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > SCIMMaxPageSize {
			scimError(w, http.StatusBadRequest, "invalidValue", "itemsPerPage must be an integer from 0 to 100")
			return 0, 0, false
		}
		count = n
	}
	return start, count, true
}

func listResponse(start, total int, res []any) map[string]any {
	return map[string]any{"schemas": []string{SCIMListSchema}, "startIndex": start, "itemsPerPage": len(res),
		"totalResults": total, "Resources": res}
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

func (s *Sim) scimListUsers(st *mgmtState, o *scimOrg, w *statusWriter, q *mgRequest) {
	start, count, ok := scimPage(w, q.r)
	if !ok {
		return
	}
	want := ""
	if f := strings.TrimSpace(q.r.URL.Query().Get("filter")); f != "" {
		parts := strings.SplitN(f, " ", 3)
		if len(parts) != 3 || !strings.EqualFold(parts[0], "userName") || !strings.EqualFold(parts[1], "eq") ||
			len(parts[2]) < 2 || parts[2][0] != '"' || parts[2][len(parts[2])-1] != '"' {
			scimError(w, http.StatusBadRequest, "invalidFilter", `only filter=userName eq "email" is supported`)
			return
		}
		want = strings.ToLower(parts[2][1 : len(parts[2])-1])
	}
	var all []*scimUser
	for _, k := range o.order {
		if u := o.users[k]; u != nil && (want == "" || k == want) {
			all = append(all, u)
		}
	}
	res := []any{}
	for i := start - 1; i < len(all) && len(res) < count; i++ {
		res = append(res, o.userView(all[i], false))
	}
	scimJSON(w, http.StatusOK, listResponse(start, len(all), res))
}

func (s *Sim) scimGetUser(st *mgmtState, o *scimOrg, w *statusWriter, q *mgRequest) {
	if u := o.users[strings.ToLower(q.r.PathValue("id"))]; u == nil {
		scimError(w, http.StatusNotFound, "", "user not found")
	} else {
		scimJSON(w, http.StatusOK, o.userView(u, true))
	}
}

func decodeObject(b []byte) (map[string]any, error) {
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, errNotObject
	}
	return m, nil
}

func (s *Sim) scimCreateUser(st *mgmtState, o *scimOrg, w *statusWriter, q *mgRequest) {
	m := scimObject(w, q)
	if m == nil {
		return
	}
	id, _ := m["id"].(string)
	userName, _ := m["userName"].(string)
	if !ValidEmail(id) || !ValidEmail(userName) || !strings.EqualFold(id, userName) {
		scimError(w, http.StatusBadRequest, "invalidValue", "id and userName must be the same valid email")
		return
	}
	key := strings.ToLower(userName)
	if o.users[key] != nil {
		scimError(w, http.StatusConflict, "uniqueness", "user exists or has a pending invitation")
		return
	}
	o.users[key] = &scimUser{email: userName, body: m}
	o.order = append(o.order, key)
	w.Header().Set("Location", "/scim/1/Users/"+userName)
	scimEcho(w, q, http.StatusCreated)
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

// userByID returns the user the path's {id} names and its key, or answers
// 400 (not an email) or 404.
func (o *scimOrg) userByID(w *statusWriter, q *mgRequest) (*scimUser, string) {
	id := q.r.PathValue("id")
	if !ValidEmail(id) {
		scimError(w, http.StatusBadRequest, "invalidValue", "id must be a valid email")
		return nil, ""
	}
	key := strings.ToLower(id)
	if o.users[key] == nil {
		scimError(w, http.StatusNotFound, "", "user not found")
	}
	return o.users[key], key
}

// scimObject decodes the body as a JSON object or answers 400.
func scimObject(w *statusWriter, q *mgRequest) map[string]any {
	m, err := decodeObject(q.body)
	if err != nil {
		scimError(w, http.StatusBadRequest, "invalidSyntax", "body is not a JSON object")
	}
	return m
}

// scimEcho answers the request's own body, as the document's examples do.
func scimEcho(w *statusWriter, q *mgRequest, status int) {
	w.Header().Set("Content-Type", "application/scim+json")
	w.WriteHeader(status)
	w.Write(q.body)
}

func (s *Sim) scimUpdateUser(st *mgmtState, o *scimOrg, w *statusWriter, q *mgRequest) {
	u, key := o.userByID(w, q)
	if u == nil {
		return
	}
	m := scimObject(w, q)
	if m == nil {
		return
	}
	if un, ok := m["userName"].(string); ok && !strings.EqualFold(un, u.email) {
		scimError(w, http.StatusBadRequest, "mutability", "the email address of a user cannot be changed")
		return
	}
	if active, ok := m["active"].(bool); ok && !active {
		o.removeUser(key)
	} else {
		maps.Copy(u.body, m)
	}
	scimEcho(w, q, http.StatusOK)
}

func (s *Sim) scimDeleteUser(st *mgmtState, o *scimOrg, w *statusWriter, q *mgRequest) {
	if u, key := o.userByID(w, q); u != nil {
		o.removeUser(key)
		w.WriteHeader(http.StatusNoContent)
	}
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

func (s *Sim) scimListGroups(st *mgmtState, o *scimOrg, w *statusWriter, q *mgRequest) {
	start, count, ok := scimPage(w, q.r)
	if !ok {
		return
	}
	gs := o.sortedGroups()
	res := []any{}
	for i := start - 1; i < len(gs) && len(res) < count; i++ {
		res = append(res, o.groupView(gs[i], false))
	}
	scimJSON(w, http.StatusOK, listResponse(start, len(gs), res))
}

func (s *Sim) scimGroupByID(o *scimOrg, w *statusWriter, q *mgRequest) *scimGroup {
	id, err := strconv.Atoi(q.r.PathValue("id"))
	if err != nil {
		scimError(w, http.StatusBadRequest, "invalidValue", "group id must be an integer")
		return nil
	}
	g := o.groups[id]
	if g == nil {
		scimError(w, http.StatusNotFound, "", "group not found")
	}
	return g
}

func (s *Sim) scimGetGroup(st *mgmtState, o *scimOrg, w *statusWriter, q *mgRequest) {
	if g := s.scimGroupByID(o, w, q); g != nil {
		scimJSON(w, http.StatusOK, o.groupView(g, true))
	}
}

// memberValues reads [{"value": email}, ...]; ok false when malformed.
func memberValues(v any) ([]string, bool) {
	arr, ok := v.([]any)
	if !ok {
		return nil, false
	}
	var out []string
	for _, x := range arr {
		m, ok := x.(map[string]any)
		if !ok {
			return nil, false
		}
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

func (s *Sim) scimCreateGroup(st *mgmtState, o *scimOrg, w *statusWriter, q *mgRequest) {
	m := scimObject(w, q)
	if m == nil {
		return
	}
	name, _ := m["displayName"].(string)
	if name == "" {
		scimError(w, http.StatusBadRequest, "invalidValue", "displayName is required")
		return
	}
	var members []string
	if v, ok := m["members"]; ok && v != nil {
		if members, ok = memberValues(v); !ok {
			scimError(w, http.StatusBadRequest, "invalidValue", "members must be objects with a valid email value")
			return
		}
	}
	now := s.cfg.Now()
	g := &scimGroup{id: o.nextID, displayName: name, created: now, modified: now}
	o.nextID++
	o.groups[g.id] = g
	for _, e := range members {
		o.addMember(g, e)
	}
	scimJSON(w, http.StatusOK, o.groupView(g, false))
}

func (s *Sim) scimPatchGroup(st *mgmtState, o *scimOrg, w *statusWriter, q *mgRequest) {
	g := s.scimGroupByID(o, w, q)
	if g == nil {
		return
	}
	var body struct {
		Schemas    []string `json:"schemas"`
		Operations []struct {
			Op    string `json:"op"`
			Path  string `json:"path"`
			Value any    `json:"value"`
		} `json:"Operations"`
	}
	if err := json.Unmarshal(q.body, &body); err != nil {
		scimError(w, http.StatusBadRequest, "invalidSyntax", "body is not a PatchOp")
		return
	}
	if !slices.Contains(body.Schemas, SCIMPatchOpSchema) || len(body.Operations) == 0 {
		scimError(w, http.StatusBadRequest, "invalidSyntax", "schemas must hold "+SCIMPatchOpSchema+" and Operations must not be empty")
		return
	}
	type change struct {
		add    bool
		emails []string
	}
	var changes []change
	for _, op := range body.Operations {
		kind := strings.ToLower(op.Op)
		if kind != "add" && kind != "remove" {
			scimError(w, http.StatusBadRequest, "invalidSyntax", "op must be add or remove")
			return
		}
		var emails []string
		switch {
		case op.Path == "members":
			var ok bool
			if emails, ok = memberValues(op.Value); !ok {
				scimError(w, http.StatusBadRequest, "invalidValue", "value must be objects with a valid email value")
				return
			}
		case kind == "remove" && strings.HasPrefix(op.Path, `members[value eq "`) && strings.HasSuffix(op.Path, `"]`):
			emails = []string{strings.TrimSuffix(strings.TrimPrefix(op.Path, `members[value eq "`), `"]`)}
		default:
			scimError(w, http.StatusBadRequest, "invalidPath", "path must be members")
			return
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
	scimJSON(w, http.StatusOK, o.groupView(g, true))
}

func (s *Sim) scimDeleteGroup(st *mgmtState, o *scimOrg, w *statusWriter, q *mgRequest) {
	if g := s.scimGroupByID(o, w, q); g != nil {
		delete(o.groups, g.id)
		w.WriteHeader(http.StatusNoContent)
	}
}
