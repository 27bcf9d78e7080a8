package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// Channel classifiers (/api/2/channel-classifiers), by
// docs/upstream-api.md (Channel classifiers). HTTP Basic with the
// project's key pair (mgmt.go: 401 missing or malformed, 403 invalid);
// classifiers are per api key. Checks in order: name characters (POST: 400),
// body (POST, PATCH): a JSON object with csvDefinition an object holding a
// string csvText (400), csvText above ClassifierMaxCSVBytes (413),
// displayName or description above ClassifierMaxTextChars characters (400);
// then existence: GET and PATCH of an unknown name 404, POST of an existing
// name 409. Errors are {"error": "..."}.

// Classifier limits of the document ("1 MB" read as 1 MiB: the relay's
// local check must never refuse what the upstream takes).
const (
	ClassifierMaxCSVBytes  = 1 << 20
	ClassifierMaxTextChars = 1000
	clsMaxBody             = 4 << 20
)

type simClassifier struct {
	name, displayName, description string
	def                            map[string]any
	modified                       time.Time
}

type clsState struct {
	byKey map[string]map[string]*simClassifier
}

// validClassifierName reports whether name has only letters, digits, '_'
// and '-' (and is not empty).
func validClassifierName(name string) bool {
	return name != "" && strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == ""
}

func (c *simClassifier) view() map[string]any {
	csv, _ := c.def["csvText"].(string)
	return map[string]any{"id": c.name, "name": c.name, "displayName": c.displayName, "description": c.description,
		"csvText": csv, "csvDefinition": c.def, "lastModified": c.modified.UTC().Format(time.RFC3339)}
}

func (s *Sim) registerClassifiers() {
	st := s.mg
	st.cls = &clsState{byKey: map[string]map[string]*simClassifier{}}
	r := func(pattern string, f func(m map[string]*simClassifier, w *statusWriter, q *mgRequest)) {
		s.mgmtRoute("classifier", pattern, authBasic, clsMaxBody, func(w *statusWriter, q *mgRequest) {
			st.mu.Lock()
			defer st.mu.Unlock()
			m := entry(st.cls.byKey, q.account, func() map[string]*simClassifier { return map[string]*simClassifier{} })
			f(m, w, q)
		})
	}
	type body struct {
		DisplayName *string         `json:"displayName"`
		Description *string         `json:"description"`
		Def         json.RawMessage `json:"csvDefinition"`
	}
	parse := func(w *statusWriter, q *mgRequest) (*body, map[string]any) {
		var b body
		if err := json.Unmarshal(q.body, &b); err != nil {
			apiError(w, http.StatusBadRequest, "body is not a JSON object")
			return nil, nil
		}
		var def map[string]any
		if json.Unmarshal(b.Def, &def) != nil || def == nil {
			apiError(w, http.StatusBadRequest, "csvDefinition is required")
			return nil, nil
		}
		csv, ok := def["csvText"].(string)
		if !ok {
			apiError(w, http.StatusBadRequest, "csvDefinition.csvText is required")
			return nil, nil
		}
		if len(csv) > ClassifierMaxCSVBytes {
			apiError(w, http.StatusRequestEntityTooLarge, "csvDefinition.csvText is larger than 1 MB")
			return nil, nil
		}
		for _, t := range []*string{b.DisplayName, b.Description} {
			if t != nil && utf8.RuneCountInString(*t) > ClassifierMaxTextChars {
				apiError(w, http.StatusBadRequest, "displayName and description take at most 1000 characters")
				return nil, nil
			}
		}
		return &b, def
	}
	set := func(c *simClassifier, b *body, def map[string]any) {
		c.def, c.modified = def, s.cfg.Now()
		if b.DisplayName != nil {
			c.displayName = *b.DisplayName
		}
		if b.Description != nil {
			c.description = *b.Description
		}
	}
	r("GET /api/2/channel-classifiers", func(m map[string]*simClassifier, w *statusWriter, q *mgRequest) {
		out := []any{}
		for _, n := range sortedKeys(m) {
			out = append(out, m[n].view())
		}
		writeJSON(w, http.StatusOK, map[string]any{"channelClassifiers": out})
	})
	r("GET /api/2/channel-classifiers/{name}", func(m map[string]*simClassifier, w *statusWriter, q *mgRequest) {
		c := m[q.r.PathValue("name")]
		if c == nil {
			apiError(w, http.StatusNotFound, "classifier not found")
			return
		}
		writeJSON(w, http.StatusOK, c.view())
	})
	r("POST /api/2/channel-classifiers/{name}", func(m map[string]*simClassifier, w *statusWriter, q *mgRequest) {
		name := q.r.PathValue("name")
		if !validClassifierName(name) {
			apiError(w, http.StatusBadRequest, "name may hold letters, digits, underscores and hyphens only")
			return
		}
		b, def := parse(w, q)
		if b == nil {
			return
		}
		if m[name] != nil {
			apiError(w, http.StatusConflict, "classifier exists")
			return
		}
		m[name] = &simClassifier{name: name}
		set(m[name], b, def)
		writeJSON(w, http.StatusOK, map[string]any{"status": "created", "name": name})
	})
	r("PATCH /api/2/channel-classifiers/{name}", func(m map[string]*simClassifier, w *statusWriter, q *mgRequest) {
		name := q.r.PathValue("name")
		b, def := parse(w, q)
		if b == nil {
			return
		}
		c := m[name]
		if c == nil {
			apiError(w, http.StatusNotFound, "classifier not found")
			return
		}
		set(c, b, def)
		writeJSON(w, http.StatusOK, map[string]any{"status": "updated", "name": name})
	})
}
