package sim

import (
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Taxonomy (/api/2/taxonomy), by docs/upstream-api.md (Taxonomy).
// HTTP Basic with the project's key pair (mgmt.go); state per api key.
// Bodies are form encoded; GET parameters come from the query, DELETE
// parameters from the query or the body. Answers: {"success": true} (with
// "data" on reads), failures {"success": false, "errors": [{"message"}]}.
//
// Statuses: a missing required form field 400; create of an existing
// entity (deleted ones included) 409; update or delete of an unknown
// entity 409; get of an unknown category, event type or event property
// 400, of an unknown user property 404; delete or restore in a bad state
// (lifecycle table) 400, of an unknown entity 409; event property restore
// answers 201.
//
// Lifecycle: created entities are "planned"; SeedTaxonomy puts one in any
// state ("live", "unexpected", "transformed", "deleted"). DELETE: live and
// unexpected become deleted, planned is removed, transformed and deleted
// are errors. POST .../restore: deleted becomes live, others are errors.
// An event property DELETE with event_type removes that event type's
// override (error when there is none); its restore with event_type brings
// the override back.
//
// Limits per api key: cost GET 1, PUT/POST/DELETE 2; at most
// Knobs.TaxonomyMaxInFlight cost in flight (4) and TaxonomyPeriodCost cost
// (7200) per TaxonomyPeriod (an hour); above either: 429 with Retry-After.

const taxMaxBody = 1 << 20

type taxEntity struct {
	state  string
	fields map[string]string
}

type taxProject struct {
	categories map[int]string
	nextCat    int
	events     map[string]*taxEntity
	props      map[string]*taxEntity            // shared event properties
	overrides  map[string]map[string]*taxEntity // event type -> property -> override
	users      map[string]*taxEntity
	groups     map[string]map[string]*taxEntity // group type -> property
}

type taxState struct {
	projects map[string]*taxProject
	inFlight map[string]int
	peak     map[string]int // by KeyLabel
	spent    windowHits
}

// SeedTaxonomy puts an entity of apiKey's taxonomy in state: kind is
// "event", "event-property" (shared) or "user-property".
func (s *Sim) SeedTaxonomy(apiKey, kind, name, state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.mg.tax.project(apiKey)
	m := map[string]map[string]*taxEntity{"event": p.events, "event-property": p.props, "user-property": p.users}[kind]
	if m == nil {
		panic("sim: SeedTaxonomy: unknown kind " + kind)
	}
	m[name] = &taxEntity{state: state, fields: map[string]string{}}
}

// list reads a comma-separated field as a JSON array ([] when unset).
func (e *taxEntity) list(field string) []string {
	if v := e.fields[field]; v != "" {
		return strings.Split(v, ",")
	}
	return []string{}
}

func newTaxEntities() map[string]*taxEntity { return map[string]*taxEntity{} }

func (x *taxState) project(key string) *taxProject {
	return entry(x.projects, key, func() *taxProject {
		return &taxProject{categories: map[int]string{}, nextCat: 1, events: map[string]*taxEntity{},
			props: map[string]*taxEntity{}, overrides: map[string]map[string]*taxEntity{},
			users: map[string]*taxEntity{}, groups: map[string]map[string]*taxEntity{}}
	})
}

// taxReq is one taxonomy request: its form values and project.
type taxReq struct {
	*mgRequest
	form url.Values
	p    *taxProject
}

func taxOK(status int, data any) (int, any) {
	b := map[string]any{"success": true}
	if data != nil {
		b["data"] = data
	}
	return status, b
}

func taxFail(status int, msg string) (int, any) {
	return status, map[string]any{"success": false, "errors": []any{map[string]any{"message": msg}}}
}

func (q *taxReq) set(e *taxEntity, fields []string) {
	for _, f := range fields {
		if v, ok := q.form[f]; ok && len(v) > 0 {
			e.fields[f] = v[0]
		}
	}
}

// create adds m[name], planned, with the form's values of fields, or
// answers 409 "WHAT exists".
func (q *taxReq) create(m map[string]*taxEntity, name, what string, fields []string) (int, any) {
	if m[name] != nil {
		return taxFail(http.StatusConflict, what+" exists")
	}
	m[name] = &taxEntity{state: "planned", fields: map[string]string{}}
	q.set(m[name], fields)
	return taxOK(http.StatusOK, nil)
}

// update sets the form's values of fields on m[name], renamed to newName
// when that is given; 409 when m[name] is missing or deleted, or newName
// exists.
func (q *taxReq) update(m map[string]*taxEntity, name, newName, what string, fields []string) (int, any) {
	e := m[name]
	if e == nil || e.state == "deleted" {
		return taxFail(http.StatusConflict, what+" not found")
	}
	if newName != "" && newName != name {
		if m[newName] != nil {
			return taxFail(http.StatusConflict, what+" exists")
		}
		delete(m, name)
		m[newName] = e
	}
	q.set(e, fields)
	return taxOK(http.StatusOK, nil)
}

// list answers m's entities by name as view shows them, deleted ones only
// when deleted.
func (q *taxReq) list(m map[string]*taxEntity, deleted bool, view func(string, *taxEntity) map[string]any) (int, any) {
	out := []any{}
	for _, n := range sortedKeys(m) {
		if e := m[n]; e.state != "deleted" || deleted {
			out = append(out, view(n, e))
		}
	}
	return taxOK(http.StatusOK, out)
}

func (s *Sim) registerTaxonomy() {
	// In-flight costs survive Reset: requests still running decrement them.
	x := &taxState{inFlight: map[string]int{}}
	s.mg.tax = x
	s.onReset(func() { x.projects, x.spent, x.peak = map[string]*taxProject{}, windowHits{}, map[string]int{} })
	// r registers a taxonomy route: f answers once the limits (cost in
	// flight and per period) pass, the form is read and its required fields
	// are there.
	r := func(pattern string, f func(q *taxReq) (int, any), required ...string) {
		s.mgmtRoute("taxonomy", pattern, authBasic, taxMaxBody, func(w http.ResponseWriter, q *mgRequest) (int, any) {
			k := &s.knobs
			cost := 2 // GET 1, PUT/POST/DELETE 2
			if q.r.Method == http.MethodGet {
				cost = 1
			}
			key := q.account
			s.mu.Lock()
			if x.inFlight[key]+cost > k.TaxonomyMaxInFlight {
				s.mu.Unlock()
				retryAfter(w, time.Second)
				return taxFail(http.StatusTooManyRequests, "Too many concurrent requests")
			}
			if ok, wait := x.spent.take(key, s.cfg.Now(), cost, k.TaxonomyPeriodCost, k.TaxonomyPeriod); !ok {
				s.mu.Unlock()
				retryAfter(w, wait)
				return taxFail(http.StatusTooManyRequests, "Too many requests: cost budget exceeded")
			}
			x.inFlight[key] += cost
			x.peak[q.call.Principal] = max(x.peak[q.call.Principal], x.inFlight[key]) // Principal: the key's label
			delay := k.TaxonomyDelay
			s.mu.Unlock()
			defer func() {
				s.mu.Lock()
				x.inFlight[key] -= cost
				s.mu.Unlock()
			}()
			select { // held in flight, unless the client goes
			case <-time.After(delay):
			case <-q.r.Context().Done():
			}
			form := q.r.URL.Query()
			if q.r.Method != http.MethodGet {
				if b, err := url.ParseQuery(string(q.body)); err == nil {
					for k, v := range b {
						form[k] = append(form[k], v...)
					}
				} else {
					return taxFail(http.StatusBadRequest, "body is not form encoded")
				}
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, field := range required {
				if form.Get(field) == "" {
					return taxFail(http.StatusBadRequest, "missing required field: "+field)
				}
			}
			return f(&taxReq{mgRequest: q, form: form, p: x.project(key)})
		})
	}

	// Categories.
	r("POST /api/2/taxonomy/category", func(q *taxReq) (int, any) {
		name := q.form.Get("category_name")
		if slices.Contains(slices.Collect(maps.Values(q.p.categories)), name) {
			return taxFail(http.StatusConflict, "category exists")
		}
		q.p.categories[q.p.nextCat] = name
		q.p.nextCat++
		return taxOK(http.StatusOK, nil)
	}, "category_name")
	r("GET /api/2/taxonomy/category", func(q *taxReq) (int, any) {
		return taxOK(http.StatusOK, views(slices.Sorted(maps.Keys(q.p.categories)), func(id int) any {
			return map[string]any{"id": id, "name": q.p.categories[id]}
		}))
	})
	r("GET /api/2/taxonomy/category/{category_name}", func(q *taxReq) (int, any) {
		name := q.r.PathValue("category_name")
		for id, n := range q.p.categories {
			if n == name {
				return taxOK(http.StatusOK, map[string]any{"id": id, "name": n})
			}
		}
		return taxFail(http.StatusBadRequest, "category not found")
	})
	// category runs f on the category the path's {category_id} names (409
	// when there is none).
	category := func(f func(q *taxReq, id int)) func(q *taxReq) (int, any) {
		return func(q *taxReq) (int, any) {
			id, err := strconv.Atoi(q.r.PathValue("category_id"))
			if _, ok := q.p.categories[id]; err != nil || !ok {
				return taxFail(http.StatusConflict, "category not found")
			}
			f(q, id)
			return taxOK(http.StatusOK, nil)
		}
	}
	r("PUT /api/2/taxonomy/category/{category_id}", category(func(q *taxReq, id int) {
		q.p.categories[id] = q.form.Get("category_name")
	}), "category_name")
	r("DELETE /api/2/taxonomy/category/{category_id}", category(func(q *taxReq, id int) { delete(q.p.categories, id) }))

	// Event types.
	eventFields := []string{"category", "description", "display_name", "is_active", "is_hidden_from_dropdowns",
		"is_hidden_from_persona_results", "is_hidden_from_pathfinder", "is_hidden_from_timeline", "tags", "owner"}
	eventView := func(name string, e *taxEntity) map[string]any {
		v := map[string]any{"event_type": name, "category": map[string]any{"name": e.fields["category"]},
			"description": nullable(e.fields["description"]), "display_name": nullable(e.fields["display_name"]),
			"is_active": e.fields["is_active"] != "false", "tags": e.list("tags"), "owner": nullable(e.fields["owner"])}
		for _, f := range eventFields[4:8] {
			v[f] = e.fields[f] == "true"
		}
		return v
	}
	r("POST /api/2/taxonomy/event", func(q *taxReq) (int, any) {
		return q.create(q.p.events, q.form.Get("event_type"), "event type", eventFields)
	}, "event_type")
	r("GET /api/2/taxonomy/event", func(q *taxReq) (int, any) {
		return q.list(q.p.events, q.form.Get("showDeleted") == "true", eventView)
	})
	r("GET /api/2/taxonomy/event/{event_type}", func(q *taxReq) (int, any) {
		n := q.r.PathValue("event_type")
		e := q.p.events[n]
		if e == nil || e.state == "deleted" {
			return taxFail(http.StatusBadRequest, "event type not found")
		}
		return taxOK(http.StatusOK, eventView(n, e))
	})
	r("PUT /api/2/taxonomy/event/{event_type}", func(q *taxReq) (int, any) {
		return q.update(q.p.events, q.r.PathValue("event_type"), q.form.Get("new_event_type"), "event type", eventFields)
	})
	r("DELETE /api/2/taxonomy/event/{event_type}", func(q *taxReq) (int, any) {
		return lifecycleDelete(q.p.events, q.r.PathValue("event_type"))
	})
	r("POST /api/2/taxonomy/event/{event_type}/restore", func(q *taxReq) (int, any) {
		return lifecycleRestore(q.p.events, q.r.PathValue("event_type"), http.StatusOK)
	})

	// Event properties.
	propFields := []string{"description", "type", "regex", "enum_values", "is_array_type", "is_required", "is_hidden", "classifications"}
	propView := func(name, eventType string, e *taxEntity) map[string]any {
		t := e.fields["type"]
		if t == "" {
			t = "any"
		}
		v := map[string]any{"event_property": name, "description": e.fields["description"], "type": t,
			"regex": nullable(e.fields["regex"]), "enum_values": nullable(e.fields["enum_values"]),
			"is_array_type": e.fields["is_array_type"] == "true", "is_required": e.fields["is_required"] == "true",
			"is_hidden": e.fields["is_hidden"] == "true", "classifications": e.list("classifications")}
		if eventType != "" {
			v["event_type"] = eventType
		}
		return v
	}
	r("POST /api/2/taxonomy/event-property", func(q *taxReq) (int, any) {
		name, et := q.form.Get("event_property"), q.form.Get("event_type")
		shared := q.p.props[name]
		switch {
		case et != "" && q.p.overrides[et][name] != nil:
			return taxFail(http.StatusConflict, "event property exists on that event type")
		case et != "" && shared != nil:
			return q.create(entry(q.p.overrides, et, newTaxEntities), name, "event property", propFields)
		default:
			return q.create(q.p.props, name, "event property", propFields)
		}
	}, "event_property")
	r("GET /api/2/taxonomy/event-property", func(q *taxReq) (int, any) {
		et := q.form.Get("event_type")
		if name := q.form.Get("event_property"); name != "" {
			e := q.p.props[name]
			if o := q.p.overrides[et][name]; et != "" && o != nil && o.state != "deleted" {
				e = o
			}
			if e == nil || e.state == "deleted" {
				return taxFail(http.StatusBadRequest, "event property not found")
			}
			return taxOK(http.StatusOK, propView(name, et, e))
		}
		m := q.p.props
		if et != "" {
			m = q.p.overrides[et]
		}
		return q.list(m, false, func(n string, e *taxEntity) map[string]any { return propView(n, et, e) })
	})
	r("PUT /api/2/taxonomy/event-property/{event_property}", func(q *taxReq) (int, any) {
		name := q.r.PathValue("event_property")
		et := q.form.Get("event_type")
		shared := q.p.props[name]
		if shared == nil || shared.state == "deleted" {
			return taxFail(http.StatusConflict, "event property not found")
		}
		target := shared
		if et != "" {
			o := q.p.overrides[et][name]
			switch scope := q.form.Get("overrideScope"); scope {
			case "":
				if o != nil {
					target = o
				}
			case "override":
				if o == nil {
					o = &taxEntity{state: "planned", fields: maps.Clone(shared.fields)}
				}
				target = o
			case "shared":
				delete(q.p.overrides[et], name)
			default:
				return taxFail(http.StatusBadRequest, "overrideScope must be override or shared")
			}
		}
		if target != shared && q.form.Get("classifications") != "" {
			return taxFail(http.StatusBadRequest, "classifications can only be applied to shared properties")
		}
		if target != shared {
			entry(q.p.overrides, et, newTaxEntities)[name] = target // a new override is kept only now
		}
		if nn := q.form.Get("new_event_property_value"); nn != "" && nn != name && target == shared {
			if q.p.props[nn] != nil {
				return taxFail(http.StatusConflict, "event property exists")
			}
			delete(q.p.props, name)
			q.p.props[nn] = shared
		}
		q.set(target, propFields)
		return taxOK(http.StatusOK, nil)
	})
	r("DELETE /api/2/taxonomy/event-property/{event_property}", func(q *taxReq) (int, any) {
		name := q.r.PathValue("event_property")
		if et := q.form.Get("event_type"); et != "" {
			o := q.p.overrides[et][name]
			if o == nil || o.state == "deleted" {
				return taxFail(http.StatusConflict, "event property is not on that event type")
			}
			o.state = "deleted"
			return taxOK(http.StatusOK, nil)
		}
		return lifecycleDelete(q.p.props, name)
	})
	r("POST /api/2/taxonomy/event-property/{event_property}/restore", func(q *taxReq) (int, any) {
		name := q.r.PathValue("event_property")
		if et := q.form.Get("event_type"); et != "" {
			return lifecycleRestore(q.p.overrides[et], name, http.StatusCreated)
		}
		return lifecycleRestore(q.p.props, name, http.StatusCreated)
	})

	// User properties: custom ones answer with the "gp:" prefix.
	userFields := []string{"description", "type", "enum_values", "regex", "is_array_type", "is_hidden", "classifications"}
	userName := func(n string) string { return strings.TrimPrefix(n, "gp:") }
	userView := func(name string, e *taxEntity) map[string]any {
		return map[string]any{"user_property": "gp:" + name, "description": e.fields["description"],
			"type": e.fields["type"], "enum_values": nullable(e.fields["enum_values"]), "regex": nullable(e.fields["regex"]),
			"is_array_type": e.fields["is_array_type"] == "true", "is_hidden": e.fields["is_hidden"] == "true",
			"classifications": e.list("classifications"), "deleted": e.state == "deleted"}
	}
	r("POST /api/2/taxonomy/user-property", func(q *taxReq) (int, any) {
		return q.create(q.p.users, userName(q.form.Get("user_property")), "user property", userFields)
	}, "user_property")
	r("GET /api/2/taxonomy/user-property", func(q *taxReq) (int, any) {
		return q.list(q.p.users, q.form.Get("showDeleted") == "true", userView)
	})
	r("GET /api/2/taxonomy/user-property/{user_property}", func(q *taxReq) (int, any) {
		n := userName(q.r.PathValue("user_property"))
		e := q.p.users[n]
		if e == nil || (e.state == "deleted" && q.form.Get("showDeleted") != "true") {
			return taxFail(http.StatusNotFound, "user property not found")
		}
		return taxOK(http.StatusOK, userView(n, e))
	})
	r("PUT /api/2/taxonomy/user-property/{user_property}", func(q *taxReq) (int, any) {
		return q.update(q.p.users, userName(q.r.PathValue("user_property")), userName(q.form.Get("new_user_property_value")),
			"user property", userFields)
	})
	r("DELETE /api/2/taxonomy/user-property/{user_property}", func(q *taxReq) (int, any) {
		return lifecycleDelete(q.p.users, userName(q.r.PathValue("user_property")))
	})
	r("POST /api/2/taxonomy/user-property/{user_property}/restore", func(q *taxReq) (int, any) {
		return lifecycleRestore(q.p.users, userName(q.r.PathValue("user_property")), http.StatusOK)
	})

	// Group properties.
	r("POST /api/2/taxonomy/group-property", func(q *taxReq) (int, any) {
		return q.create(entry(q.p.groups, q.form.Get("group_type"), newTaxEntities), q.form.Get("group_property"),
			"group property", propFields)
	}, "group_type", "group_property")
	r("GET /api/2/taxonomy/group-property", func(q *taxReq) (int, any) {
		out := []any{}
		for _, gt := range sortedKeys(q.p.groups) {
			if want := q.form.Get("group_type"); want != "" && want != gt {
				continue
			}
			for _, n := range sortedKeys(q.p.groups[gt]) {
				out = append(out, map[string]any{"group_type": gt, "group_property": n,
					"description": q.p.groups[gt][n].fields["description"]})
			}
		}
		return taxOK(http.StatusOK, out)
	})
}

// lifecycleDelete applies the document's DELETE lifecycle to m[name].
func lifecycleDelete(m map[string]*taxEntity, name string) (int, any) {
	e := m[name]
	switch {
	case e == nil:
		return taxFail(http.StatusConflict, "not found")
	case e.state == "live", e.state == "unexpected":
		e.state = "deleted"
	case e.state == "planned":
		delete(m, name)
	case e.state == "transformed":
		return taxFail(http.StatusBadRequest, "transformed entities cannot be deleted")
	default:
		return taxFail(http.StatusBadRequest, "already deleted")
	}
	return taxOK(http.StatusOK, nil)
}

// lifecycleRestore brings a deleted m[name] back (live).
func lifecycleRestore(m map[string]*taxEntity, name string, okStatus int) (int, any) {
	e := m[name]
	switch {
	case e == nil:
		return taxFail(http.StatusConflict, "not found")
	case e.state != "deleted":
		return taxFail(http.StatusBadRequest, "not deleted")
	default:
		e.state = "live"
		return taxOK(okStatus, nil)
	}
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// views returns view of each of in: a JSON list, [] for none.
func views[T any](in []T, view func(T) any) []any {
	out := make([]any, 0, len(in))
	for _, x := range in {
		out = append(out, view(x))
	}
	return out
}
