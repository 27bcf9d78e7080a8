// The channel classifier API (docs/upstream-api.md, "Channel
// classifiers"): base --analytics-url, the project's key pair as Basic.
// The document's "1 MB" of csvText is read as 1 MiB: the relay never
// refuses what the upstream may take. No documented rate limit.

package forward

import (
	"encoding/json"
	"fmt"
	"net/http"
	"unicode/utf8"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/credentials"
)

// Limits of the channel classifier document.
const (
	ClassifierMaxCSVBytes  = 1 << 20
	ClassifierMaxTextChars = 1000
)

// Classifiers returns the channel classifier API described above.
func Classifiers(c APIConfig) API {
	body := func(_ *http.Request, b []byte) *Problem { return CheckClassifier(b) }
	named := func(r *http.Request, b []byte) *Problem {
		if !ValidClassifierName(r.PathValue("name")) {
			return Bad("classifier name may hold letters, digits, underscores and hyphens only")
		}
		return CheckClassifier(b)
	}
	const root, limit = "/api/2/channel-classifiers", DefaultMaxRequestBodyBytes
	return API{
		Upstream: Upstream{API: "classifier", Kind: credentials.KindAnalytics, Fallback: c.URL,
			Scheme: SchemeProjectBasic},
		Routes: []adminroute.Route{
			{Method: http.MethodGet, Path: root},
			{Method: http.MethodGet, Path: root + "/{name}"},
			{Method: http.MethodPost, Path: root + "/{name}", Handler: Endpoint{Check: named, BodyLimit: limit}},
			{Method: http.MethodPatch, Path: root + "/{name}", Handler: Endpoint{Check: body, BodyLimit: limit}},
		},
	}
}

// ValidClassifierName reports whether name has only letters, digits, '_' and '-'
// (and is not empty).
func ValidClassifierName(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// CheckClassifier validates a POST or PATCH body; it returns nil when it is
// acceptable, else the upstream's answer.
func CheckClassifier(body []byte) *Problem {
	var b struct {
		DisplayName *string         `json:"displayName"`
		Description *string         `json:"description"`
		Def         json.RawMessage `json:"csvDefinition"`
	}
	if err := json.Unmarshal(body, &b); err != nil || len(body) == 0 {
		return Bad("body must be a JSON object")
	}
	var def struct {
		CSV *string `json:"csvText"`
	}
	if len(b.Def) == 0 || string(b.Def) == "null" {
		return Bad("csvDefinition is required")
	}
	if err := json.Unmarshal(b.Def, &def); err != nil || b.Def[0] != '{' {
		return Bad("csvDefinition must be an object")
	}
	if def.CSV == nil {
		return Bad("csvDefinition.csvText is required")
	}
	if n := len(*def.CSV); n > ClassifierMaxCSVBytes {
		return &Problem{Status: http.StatusRequestEntityTooLarge,
			Msg: fmt.Sprintf("csvDefinition.csvText is %d bytes; at most 1 MB (%d bytes)", n, ClassifierMaxCSVBytes)}
	}
	for _, f := range []struct {
		name string
		v    *string
	}{{"displayName", b.DisplayName}, {"description", b.Description}} {
		if f.v != nil && utf8.RuneCountInString(*f.v) > ClassifierMaxTextChars {
			return Bad("%s is longer than %d characters", f.name, ClassifierMaxTextChars)
		}
	}
	return nil
}
