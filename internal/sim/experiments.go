package sim

import (
	"cmp"
	"encoding/json"
	"maps"
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
	fields    map[string]any
	users     []string
	cohorts   []string
	createdAt time.Time
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
	s.mg.mu.Lock()
	defer s.mg.mu.Unlock()
	e := s.mg.exp.add(s.cfg.Now(), map[string]any{"name": name, "key": name}, "web")
	return e.id
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
	vars := []any{}
	for _, k := range e.variants {
		vars = append(vars, e.byKey[k].fields)
	}
	v["id"] = e.id
	v["variants"] = vars
	v["deployments"] = append([]string{}, e.deployments...)
	v["deliveryMethod"] = e.delivery
	v["createdAt"] = e.created.UTC().Format(time.RFC3339)
	v["lastModifiedAt"] = e.modified.UTC().Format(time.RFC3339)
	return v
}

func (s *Sim) registerExperiments() {
	st := s.mg
	st.exp = &expState{exps: map[string]*simExperiment{}}
	x := st.exp
	// r registers an experiment route; f gets the experiment and variant its
	// path names ({id}, {variantKey}), after a 404 for either that is unknown.
	r := func(pattern string, f func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest)) {
		s.mgmtRoute("experiment", pattern, authMgmtBearer, expMaxBody, func(w *statusWriter, q *mgRequest) {
			st.mu.Lock()
			defer st.mu.Unlock()
			var e *simExperiment
			if id := q.r.PathValue("id"); id != "" {
				if e = x.exps[id]; e == nil {
					apiError(w, http.StatusNotFound, "experiment not found")
					return
				}
			}
			var v *simVariant
			if k := q.r.PathValue("variantKey"); k != "" {
				if v = e.byKey[k]; v == nil {
					apiError(w, http.StatusNotFound, "variant not found")
					return
				}
			}
			f(e, v, w, q)
		})
	}
	ok := func(w *statusWriter) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		w.Write([]byte("OK"))
	}
	now := func() time.Time { return s.cfg.Now() }

	r("GET /api/1/experiments", func(_ *simExperiment, _ *simVariant, w *statusWriter, q *mgRequest) {
		limit := len(x.exps)
		if v := q.r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				apiError(w, http.StatusBadRequest, "limit must be a non-negative integer")
				return
			}
			limit = n
		}
		// Newest created first: ids are decimal numbers counted up.
		all := slices.SortedFunc(maps.Values(x.exps), func(a, b *simExperiment) int {
			return cmp.Or(len(b.id)-len(a.id), strings.Compare(b.id, a.id))
		})
		out := []any{}
		for _, e := range all[:min(len(all), limit)] {
			out = append(out, e.view())
		}
		writeJSON(w, http.StatusOK, out)
	})
	r("POST /api/1/experiments", func(_ *simExperiment, _ *simVariant, w *statusWriter, q *mgRequest) {
		m, err := decodeObject(q.body)
		if err != nil {
			apiError(w, http.StatusBadRequest, "body is not a JSON object")
			return
		}
		var vars []map[string]any
		if v, has := m["variants"]; has && v != nil {
			raw, _ := json.Marshal(v)
			if json.Unmarshal(raw, &vars) != nil {
				apiError(w, http.StatusBadRequest, "variants must be an array of objects")
				return
			}
		}
		for _, v := range vars {
			if k, _ := v["key"].(string); k == "" {
				apiError(w, http.StatusBadRequest, "every variant needs a key")
				return
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
			e.byKey[k] = &simVariant{fields: v, createdAt: now()}
		}
		if d, ok := m["deployments"].([]any); ok {
			for _, x := range d {
				if s, ok := x.(string); ok {
					e.deployments = append(e.deployments, s)
				}
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": e.id, "url": "https://app.example/experiments/" + e.id})
	})
	r("GET /api/1/experiments/{id}", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		writeJSON(w, http.StatusOK, e.view())
	})
	r("PATCH /api/1/experiments/{id}", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		if e.delivery != "feature" {
			apiError(w, http.StatusMethodNotAllowed, "experiments of this type cannot be edited here")
			return
		}
		m, err := decodeObject(q.body)
		if err != nil {
			apiError(w, http.StatusBadRequest, "body is not a JSON object")
			return
		}
		for k := range m {
			if !experimentPatchFields[k] {
				apiError(w, http.StatusBadRequest, "field "+strconv.Quote(k)+" cannot be edited")
				return
			}
		}
		maps.Copy(e.fields, m)
		e.version(now(), "edited")
		writeJSON(w, http.StatusOK, e.view())
	})
	r("GET /api/1/experiments/{id}/versions", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		out := []any{}
		for i := len(e.versions) - 1; i >= 0; i-- {
			out = append(out, e.versions[i])
		}
		writeJSON(w, http.StatusOK, out)
	})
	r("GET /api/1/experiments/{id}/versions/{versionId}", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		for _, v := range e.versions {
			if v["versionId"] == q.r.PathValue("versionId") {
				writeJSON(w, http.StatusOK, v)
				return
			}
		}
		apiError(w, http.StatusNotFound, "version not found")
	})
	r("GET /api/1/experiments/{id}/variants", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		out := []any{}
		for _, k := range e.variants {
			out = append(out, e.byKey[k].fields)
		}
		writeJSON(w, http.StatusOK, out)
	})
	variantBody := func(w *statusWriter, q *mgRequest) map[string]any {
		m, err := decodeObject(q.body)
		if err != nil {
			apiError(w, http.StatusBadRequest, "body is not a JSON object")
			return nil
		}
		for k := range m {
			switch k {
			case "key", "name", "description", "payload", "rolloutWeight":
			default:
				apiError(w, http.StatusBadRequest, "unknown variant field "+strconv.Quote(k))
				return nil
			}
		}
		return m
	}
	r("POST /api/1/experiments/{id}/variants", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		m := variantBody(w, q)
		if m == nil {
			return
		}
		k, _ := m["key"].(string)
		if k == "" {
			apiError(w, http.StatusBadRequest, "key is required")
			return
		}
		if e.byKey[k] != nil {
			apiError(w, http.StatusBadRequest, "variant "+strconv.Quote(k)+" exists")
			return
		}
		e.variants = append(e.variants, k)
		e.byKey[k] = &simVariant{fields: m, createdAt: now()}
		e.version(now(), "variant added")
		ok(w)
	})
	r("GET /api/1/experiments/{id}/variants/{variantKey}", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		writeJSON(w, http.StatusOK, v.fields)
	})
	r("PATCH /api/1/experiments/{id}/variants/{variantKey}", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		m := variantBody(w, q)
		if m == nil {
			return
		}
		old := q.r.PathValue("variantKey")
		if k, _ := m["key"].(string); k != "" && k != old {
			if e.byKey[k] != nil {
				apiError(w, http.StatusBadRequest, "variant "+strconv.Quote(k)+" exists")
				return
			}
			delete(e.byKey, old)
			e.byKey[k] = v
			for i, x := range e.variants {
				if x == old {
					e.variants[i] = k
				}
			}
		}
		maps.Copy(v.fields, m)
		e.version(now(), "variant edited")
		ok(w)
	})
	r("DELETE /api/1/experiments/{id}/variants/{variantKey}", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		k := q.r.PathValue("variantKey")
		delete(e.byKey, k)
		e.variants = removeString(e.variants, k)
		e.version(now(), "variant deleted")
		ok(w)
	})
	r("GET /api/1/experiments/{id}/variants/{variantKey}/users", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		writeJSON(w, http.StatusOK, append([]string{}, v.users...))
	})
	r("GET /api/1/experiments/{id}/variants/{variantKey}/cohorts", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		writeJSON(w, http.StatusOK, append([]string{}, v.cohorts...))
	})
	// strings reads body[field] as an array of strings.
	stringsField := func(w *statusWriter, q *mgRequest, field string, most int) ([]string, bool) {
		var m map[string]json.RawMessage
		if json.Unmarshal(q.body, &m) != nil || m == nil {
			apiError(w, http.StatusBadRequest, "body is not a JSON object")
			return nil, false
		}
		var v []string
		if json.Unmarshal(m[field], &v) != nil || v == nil {
			apiError(w, http.StatusBadRequest, field+" must be an array of strings")
			return nil, false
		}
		if most > 0 && len(v) > most {
			apiError(w, http.StatusBadRequest, field+" holds more than "+strconv.Itoa(most)+" entries")
			return nil, false
		}
		return v, true
	}
	r("POST /api/1/experiments/{id}/variants/{variantKey}/users", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		if ids, good := stringsField(w, q, "inclusions", 0); good {
			v.users = append(v.users, ids...)
			ok(w)
		}
	})
	r("POST /api/1/experiments/{id}/variants/{variantKey}/cohorts", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		if ids, good := stringsField(w, q, "inclusions", 0); good {
			v.cohorts = append(v.cohorts, ids...)
			ok(w)
		}
	})
	r("DELETE /api/1/experiments/{id}/variants/{variantKey}/users/{userIndex}", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		i, err := strconv.Atoi(q.r.PathValue("userIndex"))
		if err != nil || i < 0 || i >= len(v.users) {
			apiError(w, http.StatusNotFound, "inclusion not found")
			return
		}
		v.users = append(v.users[:i], v.users[i+1:]...)
		ok(w)
	})
	r("DELETE /api/1/experiments/{id}/variants/{variantKey}/users", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		v.users = nil
		ok(w)
	})
	bulk := func(cohorts bool) func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		return func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
			ids, good := stringsField(w, q, "users", ExperimentBulkMax)
			if !good {
				return
			}
			for _, id := range ids {
				if cohorts {
					v.cohorts = removeString(v.cohorts, id)
				} else {
					v.users = removeString(v.users, id)
				}
			}
			ok(w)
		}
	}
	r("DELETE /api/1/experiments/{id}/variants/{variantKey}/bulk-delete-users", bulk(false))
	r("DELETE /api/1/experiments/{id}/variants/{variantKey}/bulk-delete-cohorts", bulk(true))
	r("GET /api/1/experiments/{id}/deployments", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		out := []any{}
		for _, d := range e.deployments {
			out = append(out, map[string]any{"id": d})
		}
		writeJSON(w, http.StatusOK, out)
	})
	r("POST /api/1/experiments/{id}/deployments", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		if ids, good := stringsField(w, q, "deployments", 0); good {
			for _, id := range ids {
				e.deployments = append(removeString(e.deployments, id), id)
			}
			e.version(now(), "deployments added")
			ok(w)
		}
	})
	r("DELETE /api/1/experiments/{id}/deployments/{deploymentId}", func(e *simExperiment, v *simVariant, w *statusWriter, q *mgRequest) {
		d := q.r.PathValue("deploymentId")
		n := len(e.deployments)
		e.deployments = removeString(e.deployments, d)
		if len(e.deployments) == n {
			apiError(w, http.StatusNotFound, "deployment not found")
			return
		}
		e.version(now(), "deployment removed")
		ok(w)
	})
}
