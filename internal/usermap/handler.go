package usermap

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forms"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/storage"
)

// Mapping is one parsed, validated mapping.
type Mapping struct {
	UserID, GlobalUserID string
	Unmap                bool
	// Data is the compacted JSON object as it is sent upstream.
	Data []byte
}

// shape is POST /usermap's requests.
var shape = forms.Shape{Field: "mapping", Noun: "mappings", TooMany: "too_many_mappings",
	MaxItems: MaxMappings, MaxBodyBytes: MaxBodyBytes, QueryFirst: true, ItemFields: []string{"user_id", "global_user_id", "unmap"}}

// parse validates the mapping parameter (one JSON object or an array of
// them) against the limits of s and returns the mappings. apiKey is used to
// check that each mapping fits one upstream request.
func parse(s forms.Shape, apiKey string, mapping []byte) ([]Mapping, *forms.ValidationError) {
	return forms.Each(s, apiKey, mapping, parseOne)
}

// Record is m's spool record, ordered by user.
func (m Mapping) Record() storage.Record {
	return storage.Record{OrderKey: []byte(m.UserID), UserID: []byte(m.UserID), Data: m.Data}
}

func parseOne(_ int, obj map[string]json.RawMessage, data []byte) (m Mapping, err *forms.ValidationError) {
	m.Data = data
	if m.UserID, err = forms.String(obj, "user_id"); err != nil {
		return m, err
	}
	if m.GlobalUserID, err = forms.String(obj, "global_user_id"); err != nil {
		return m, err
	}
	if v, ok := obj["unmap"]; ok && json.Unmarshal(v, &m.Unmap) != nil {
		return m, forms.Bad("invalid_type", ".unmap: must be a boolean")
	}
	if m.UserID == "" {
		return m, forms.Bad("missing_field", ".user_id: missing or empty")
	}
	if m.GlobalUserID == "" && !m.Unmap {
		return m, forms.Bad("missing_field", ".global_user_id: missing or empty (required unless unmap is true)")
	}
	return m, nil
}

// ParseUserIDs validates the user_ids parameter of GET /api/2/usermap: a
// JSON array of strings, or a comma-separated list; 1 to MaxUserIDs
// non-empty ids.
func ParseUserIDs(v []byte) ([]string, *forms.ValidationError) {
	t := bytes.TrimSpace(v)
	if len(t) == 0 {
		return nil, forms.Bad("missing_field", "user_ids: missing or empty (1 to 100 user ids)")
	}
	var ids []string
	if t[0] == '[' {
		if json.Unmarshal(t, &ids) != nil {
			return nil, forms.Bad("invalid_json", "user_ids: invalid JSON array of strings")
		}
	} else {
		ids = strings.Split(string(t), ",")
	}
	if len(ids) == 0 {
		return nil, forms.Bad("missing_field", "user_ids: empty list (1 to 100 user ids)")
	}
	if len(ids) > MaxUserIDs {
		return nil, forms.Bad("too_many_user_ids", "user_ids: %d ids; at most %d per request", len(ids), MaxUserIDs)
	}
	for i, id := range ids {
		if strings.TrimSpace(id) == "" {
			return nil, forms.Bad("invalid_type", "user_ids[%d]: empty user id", i)
		}
	}
	return ids, nil
}

// ReadAPI is GET /api/2/usermap as a forwarded API: base c.URL
// (--analytics-url; a project's analytics_url overrides it), the project's
// key pair as Basic, user_ids checked by ParseUserIDs, and only Accept
// forwarded beside Authorization. Local answers are {"code":N,"error":"...",
// "source":"relay"}.
func ReadAPI(c forward.APIConfig) forward.API {
	return forward.API{
		Upstream: forward.Upstream{API: "usermap", Kind: credentials.KindAnalytics, Fallback: c.URL,
			Scheme: forward.SchemeProjectBasic},
		Headers: []string{"Accept"},
		Errors: func(w http.ResponseWriter, p *forward.Problem) {
			p.Extra = map[string]int{"code": p.Status}
			forward.JSONErrors(w, p)
		},
		Routes: []adminroute.Route{{Method: http.MethodGet, Path: "/api/2/usermap", Handler: forward.Endpoint{Check: func(r *http.Request, _ []byte) *forward.Problem {
			if _, verr := ParseUserIDs([]byte(r.URL.Query().Get("user_ids"))); verr != nil {
				return &forward.Problem{Status: verr.Status, Msg: verr.Msg}
			}
			return nil
		}}}},
	}
}
