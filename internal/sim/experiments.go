package sim

import (
	"cmp"
	"encoding/json"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Experiment management (/api/1/experiments), by
// docs/upstream-api.md (Experiment management). Bearer management key (see
// mgmt.go). State: experiments with fields, variants, user/device and cohort
// inclusions per variant, deployments and versions (one per change, newest
// first). Answers: JSON for reads, text "OK" for variant, inclusion and
// deployment changes; unknown experiment, variant, version, inclusion index
// or deployment: 404 {"error"}; malformed body: 400; bulk deletes above 100
// entries: 400; PATCH of a web experiment (AddWebExperiment): 405.

// Experiment limits of the document.
const (
	ExperimentBulkMax = 100
	expMaxBody        = 5 << 20
)

type simVariant struct {
	fields  map[string]any
	users   []string
	cohorts []string
}

type simExperiment struct {
	id          string
	fields      map[string]any
	delivery    string // "feature" or "web"
	variants    []string
	byKey       map[string]*simVariant
	deployments []string
	versions    []map[string]any
	created     time.Time
	modified    time.Time
}

type expState struct {
	exps   map[string]*simExperiment
	nextID int
}

// experimentPatchFields are the fields PATCH /api/1/experiments/{id} takes.
var experimentPatchFields = map[string]bool{"name": true, "description": true, "bucketingKey": true,
	"bucketingSalt": true, "evaluationMode": true, "rolloutPercentage": true, "enabled": true,
	"experimentType": true, "stickyBucketing": true, "startDate": true, "endDate": true, "tags": true,
	"exposureEvent": true}

// AddWebExperiment adds a web experiment (which PATCH refuses with 405) and
// returns its id.
func (s *Sim) AddWebExperiment(name string) string {
	return locked(&s.mu, func() string { return s.mg.exp.add(s.cfg.Now(), map[string]any{"name": name, "key": name}, "web").id })
}

func (x *expState) add(now time.Time, fields map[string]any, delivery string) *simExperiment {
	x.nextID++
	e := &simExperiment{id: strconv.Itoa(x.nextID), fields: fields, delivery: delivery,
		byKey: map[string]*simVariant{}, created: now, modified: now}
	x.exps[e.id] = e
	e.version(now, "created")
	return e
}

func (e *simExperiment) version(now time.Time, what string) {
	e.modified = now
	e.versions = append(e.versions, map[string]any{"versionId": strconv.Itoa(len(e.versions) + 1),
		"createdAt": now.UTC().Format(time.RFC3339), "change": what})
}

func (e *simExperiment) view() map[string]any {
	v := maps.Clone(e.fields)
	v["id"] = e.id
	v["variants"] = e.variantList()
	v["deployments"] = append([]string{}, e.deployments...)
	v["deliveryMethod"] = e.delivery
	v["createdAt"] = e.created.UTC().Format(time.RFC3339)
	v["lastModifiedAt"] = e.modified.UTC().Format(time.RFC3339)
	return v
}

func (e *simExperiment) variantList() []any {
	return views(e.variants, func(k string) any { return e.byKey[k].fields })
}

func (s *Sim) registerExperiments() {
	x := &expState{}
	s.mg.exp = x
	s.onReset(func() { *x = expState{exps: map[string]*simExperiment{}} })
	// r registers an experiment route; f gets the experiment and variant its
	// path names ({id}, {variantKey}), after a 404 for either that is
	// unknown, and returns its answer: text when a string ("OK"), else JSON.
	r := func(pattern string, f func(e *simExperiment, v *simVariant, q *mgRequest) (int, any)) {
		s.mgmtRoute("experiment", pattern, authMgmtBearer, expMaxBody, func(w http.ResponseWriter, q *mgRequest) (int, any) {
			s.mu.Lock()
			defer s.mu.Unlock()
			e := x.exps[q.r.PathValue("id")]
			switch {
			case e == nil && q.r.PathValue("id") != "":
				return apiFail(http.StatusNotFound, "experiment not found")
			case e != nil && q.r.PathValue("variantKey") != "" && e.byKey[q.r.PathValue("variantKey")] == nil:
				return apiFail(http.StatusNotFound, "variant not found")
			case e != nil:
				return f(e, e.byKey[q.r.PathValue("variantKey")], q)
			}
			return f(nil, nil, q)
		})
	}
	const ok = "OK"
	bad := func(msg string) (int, any) { return apiFail(http.StatusBadRequest, msg) }
	now := s.cfg.Now

	r("GET /api/1/experiments", func(_ *simExperiment, _ *simVariant, q *mgRequest) (int, any) {
		limit, valid := queryInt(q.r.URL.Query(), "limit", len(x.exps), 0, math.MaxInt)
		if !valid {
			return bad("limit must be a non-negative integer")
		}
		// Newest created first: ids are decimal numbers counted up.
		all := slices.SortedFunc(maps.Values(x.exps), func(a, b *simExperiment) int {
			return cmp.Or(len(b.id)-len(a.id), strings.Compare(b.id, a.id))
		})
		return http.StatusOK, views(all[:min(len(all), limit)], func(e *simExperiment) any { return e.view() })
	})
	r("POST /api/1/experiments", func(_ *simExperiment, _ *simVariant, q *mgRequest) (int, any) {
		m := decodeObject(q.body)
		if m == nil {
			return bad("body is not a JSON object")
		}
		var vars []map[string]any
		if v, has := m["variants"]; has && v != nil {
			raw, _ := json.Marshal(v)
			if json.Unmarshal(raw, &vars) != nil {
				return bad("variants must be an array of objects")
			}
		}
		for _, v := range vars {
			if k, _ := v["key"].(string); k == "" {
				return bad("every variant needs a key")
			}
		}
		fields := maps.Clone(m)
		delete(fields, "variants")
		e := x.add(now(), fields, "feature")
		for _, v := range vars {
			k := v["key"].(string)
			if e.byKey[k] == nil {
				e.variants = append(e.variants, k)
			}
			e.byKey[k] = &simVariant{fields: v}
		}
		deployments, _ := m["deployments"].([]any)
		for _, x := range deployments {
			if s, ok := x.(string); ok {
				e.deployments = append(e.deployments, s)
			}
		}
		return http.StatusOK, map[string]any{"id": e.id, "url": "https://app.example/experiments/" + e.id}
	})
	r("GET /api/1/experiments/{id}", func(e *simExperiment, _ *simVariant, q *mgRequest) (int, any) {
		return http.StatusOK, e.view()
	})
	r("PATCH /api/1/experiments/{id}", func(e *simExperiment, _ *simVariant, q *mgRequest) (int, any) {
		if e.delivery != "feature" {
			return apiFail(http.StatusMethodNotAllowed, "experiments of this type cannot be edited here")
		}
		m := decodeObject(q.body)
		if m == nil {
			return bad("body is not a JSON object")
		}
		for k := range m {
			if !experimentPatchFields[k] {
				return bad("field " + strconv.Quote(k) + " cannot be edited")
			}
		}
		maps.Copy(e.fields, m)
		e.version(now(), "edited")
		return http.StatusOK, e.view()
	})
	r("GET /api/1/experiments/{id}/versions", func(e *simExperiment, _ *simVariant, q *mgRequest) (int, any) {
		out := append([]map[string]any{}, e.versions...)
		slices.Reverse(out)
		return http.StatusOK, out
	})
	r("GET /api/1/experiments/{id}/versions/{versionId}", func(e *simExperiment, _ *simVariant, q *mgRequest) (int, any) {
		for _, v := range e.versions {
			if v["versionId"] == q.r.PathValue("versionId") {
				return http.StatusOK, v
			}
		}
		return apiFail(http.StatusNotFound, "version not found")
	})
	r("GET /api/1/experiments/{id}/variants", func(e *simExperiment, _ *simVariant, q *mgRequest) (int, any) {
		return http.StatusOK, e.variantList()
	})
	// variantBody reads a variant's fields; fail is the error when it cannot.
	variantBody := func(q *mgRequest) (m map[string]any, fail string) {
		m = decodeObject(q.body)
		if m == nil {
			return nil, "body is not a JSON object"
		}
		for k := range m {
			switch k {
			case "key", "name", "description", "payload", "rolloutWeight":
			default:
				return nil, "unknown variant field " + strconv.Quote(k)
			}
		}
		return m, ""
	}
	r("POST /api/1/experiments/{id}/variants", func(e *simExperiment, _ *simVariant, q *mgRequest) (int, any) {
		m, fail := variantBody(q)
		k, _ := m["key"].(string)
		switch {
		case m == nil:
			return bad(fail)
		case k == "":
			return bad("key is required")
		case e.byKey[k] != nil:
			return bad("variant " + strconv.Quote(k) + " exists")
		}
		e.variants = append(e.variants, k)
		e.byKey[k] = &simVariant{fields: m}
		e.version(now(), "variant added")
		return http.StatusOK, ok
	})
	r("GET /api/1/experiments/{id}/variants/{variantKey}", func(_ *simExperiment, v *simVariant, q *mgRequest) (int, any) {
		return http.StatusOK, v.fields
	})
	r("PATCH /api/1/experiments/{id}/variants/{variantKey}", func(e *simExperiment, v *simVariant, q *mgRequest) (int, any) {
		m, fail := variantBody(q)
		if m == nil {
			return bad(fail)
		}
		old := q.r.PathValue("variantKey")
		if k, _ := m["key"].(string); k != "" && k != old {
			if e.byKey[k] != nil {
				return bad("variant " + strconv.Quote(k) + " exists")
			}
			delete(e.byKey, old)
			e.byKey[k] = v
			e.variants[slices.Index(e.variants, old)] = k
		}
		maps.Copy(v.fields, m)
		e.version(now(), "variant edited")
		return http.StatusOK, ok
	})
	r("DELETE /api/1/experiments/{id}/variants/{variantKey}", func(e *simExperiment, _ *simVariant, q *mgRequest) (int, any) {
		k := q.r.PathValue("variantKey")
		delete(e.byKey, k)
		e.variants = removeString(e.variants, k)
		e.version(now(), "variant deleted")
		return http.StatusOK, ok
	})
	// include reads body[field], an array of at most most strings (0: any
	// number), and gives it to f (which adds or removes it at the variant or
	// experiment).
	include := func(field string, most int, f func(e *simExperiment, v *simVariant, ids []string)) func(*simExperiment, *simVariant, *mgRequest) (int, any) {
		return func(e *simExperiment, v *simVariant, q *mgRequest) (int, any) {
			var m map[string]json.RawMessage
			var ids []string
			switch {
			case json.Unmarshal(q.body, &m) != nil || m == nil:
				return bad("body is not a JSON object")
			case json.Unmarshal(m[field], &ids) != nil || ids == nil:
				return bad(field + " must be an array of strings")
			case most > 0 && len(ids) > most:
				return bad(field + " holds more than " + strconv.Itoa(most) + " entries")
			}
			f(e, v, ids)
			return http.StatusOK, ok
		}
	}
	// The inclusion lists: users and cohorts (bulk deletes of both read "users").
	for name, list := range map[string]func(v *simVariant) *[]string{
		"users": func(v *simVariant) *[]string { return &v.users }, "cohorts": func(v *simVariant) *[]string { return &v.cohorts },
	} {
		path := "/api/1/experiments/{id}/variants/{variantKey}/"
		r("GET "+path+name, func(_ *simExperiment, v *simVariant, q *mgRequest) (int, any) {
			return http.StatusOK, append([]string{}, *list(v)...)
		})
		r("POST "+path+name, include("inclusions", 0, func(_ *simExperiment, v *simVariant, ids []string) {
			*list(v) = append(*list(v), ids...)
		}))
		r("DELETE "+path+"bulk-delete-"+name, include("users", ExperimentBulkMax, func(_ *simExperiment, v *simVariant, ids []string) {
			*list(v) = slices.DeleteFunc(*list(v), func(id string) bool { return slices.Contains(ids, id) })
		}))
	}
	r("DELETE /api/1/experiments/{id}/variants/{variantKey}/users/{userIndex}", func(_ *simExperiment, v *simVariant, q *mgRequest) (int, any) {
		i, err := strconv.Atoi(q.r.PathValue("userIndex"))
		if err != nil || i < 0 || i >= len(v.users) {
			return apiFail(http.StatusNotFound, "inclusion not found")
		}
		v.users = append(v.users[:i], v.users[i+1:]...)
		return http.StatusOK, ok
	})
	r("DELETE /api/1/experiments/{id}/variants/{variantKey}/users", func(_ *simExperiment, v *simVariant, q *mgRequest) (int, any) {
		v.users = nil
		return http.StatusOK, ok
	})
	r("GET /api/1/experiments/{id}/deployments", func(e *simExperiment, _ *simVariant, q *mgRequest) (int, any) {
		return http.StatusOK, views(e.deployments, func(d string) any { return map[string]any{"id": d} })
	})
	r("POST /api/1/experiments/{id}/deployments", include("deployments", 0, func(e *simExperiment, _ *simVariant, ids []string) {
		for _, id := range ids {
			e.deployments = append(removeString(e.deployments, id), id)
		}
		e.version(now(), "deployments added")
	}))
	r("DELETE /api/1/experiments/{id}/deployments/{deploymentId}", func(e *simExperiment, _ *simVariant, q *mgRequest) (int, any) {
		n := len(e.deployments)
		if e.deployments = removeString(e.deployments, q.r.PathValue("deploymentId")); len(e.deployments) == n {
			return apiFail(http.StatusNotFound, "deployment not found")
		}
		e.version(now(), "deployment removed")
		return http.StatusOK, ok
	})
}
