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

func (c *simClassifier) view() map[string]any {
	csv, _ := c.def["csvText"].(string)
	return map[string]any{"id": c.name, "name": c.name, "displayName": c.displayName, "description": c.description,
		"csvText": csv, "csvDefinition": c.def, "lastModified": c.modified.UTC().Format(time.RFC3339)}
}

func (s *Sim) registerClassifiers() {
	var byKey map[string]map[string]*simClassifier // api key -> name -> classifier
	s.onReset(func() { byKey = map[string]map[string]*simClassifier{} })
	r := func(pattern string, f func(m map[string]*simClassifier, q *mgRequest) (int, any)) {
		s.mgmtRoute("classifier", pattern, authBasic, clsMaxBody, func(w http.ResponseWriter, q *mgRequest) (int, any) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return f(entry(byKey, q.account, func() map[string]*simClassifier { return map[string]*simClassifier{} }), q)
		})
	}
	// save serves POST (create) and PATCH: the checks in the order of the
	// rules above, then the classifier is written.
	save := func(create bool) func(m map[string]*simClassifier, q *mgRequest) (int, any) {
		return func(m map[string]*simClassifier, q *mgRequest) (int, any) {
			name := q.r.PathValue("name")
			var b struct {
				DisplayName *string         `json:"displayName"`
				Description *string         `json:"description"`
				Def         json.RawMessage `json:"csvDefinition"`
			}
			var def map[string]any
			bodyErr := json.Unmarshal(q.body, &b)
			noDef := bodyErr == nil && (json.Unmarshal(b.Def, &def) != nil || def == nil)
			csv, isCSV := def["csvText"].(string)
			tooLong := func(t *string) bool { return t != nil && utf8.RuneCountInString(*t) > ClassifierMaxTextChars }
			status, msg := http.StatusBadRequest, ""
			switch {
			case create && (name == "" || strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != ""):
				msg = "name may hold letters, digits, underscores and hyphens only"
			case bodyErr != nil:
				msg = "body is not a JSON object"
			case noDef:
				msg = "csvDefinition is required"
			case !isCSV:
				msg = "csvDefinition.csvText is required"
			case len(csv) > ClassifierMaxCSVBytes:
				status, msg = http.StatusRequestEntityTooLarge, "csvDefinition.csvText is larger than 1 MB"
			case tooLong(b.DisplayName) || tooLong(b.Description):
				msg = "displayName and description take at most 1000 characters"
			case create && m[name] != nil:
				status, msg = http.StatusConflict, "classifier exists"
			case !create && m[name] == nil:
				status, msg = http.StatusNotFound, "classifier not found"
			}
			if msg != "" {
				return apiFail(status, msg)
			}
			if create {
				m[name] = &simClassifier{name: name}
			}
			c := m[name]
			c.def, c.modified = def, s.cfg.Now()
			if b.DisplayName != nil {
				c.displayName = *b.DisplayName
			}
			if b.Description != nil {
				c.description = *b.Description
			}
			return http.StatusOK, map[string]any{"status": map[bool]string{true: "created", false: "updated"}[create], "name": name}
		}
	}
	r("GET /api/2/channel-classifiers", func(m map[string]*simClassifier, q *mgRequest) (int, any) {
		return http.StatusOK, map[string]any{"channelClassifiers": views(sortedKeys(m), func(n string) any { return m[n].view() })}
	})
	r("GET /api/2/channel-classifiers/{name}", func(m map[string]*simClassifier, q *mgRequest) (int, any) {
		c := m[q.r.PathValue("name")]
		if c == nil {
			return apiFail(http.StatusNotFound, "classifier not found")
		}
		return http.StatusOK, c.view()
	})
	r("POST /api/2/channel-classifiers/{name}", save(true))
	r("PATCH /api/2/channel-classifiers/{name}", save(false))
}
