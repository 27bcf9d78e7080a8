package sim

import (
	"encoding/json"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
)

// User mapping, by the API reference.
//
// POST /usermap: api_key and mapping from the query, else the form body.
// Checks: method POST; body under MaxBodyBytes (413); api_key present and
// valid (400 as /2/httpapi); mapping a JSON object or array of objects (400
// "Invalid JSON request body"); at most 2000 mappings ("at most 2000
// requests/events per batch"), each with a non-empty string user_id, a
// non-empty string global_user_id unless unmap is true, unmap a boolean, and
// no user_id in Knobs.RejectedUserIDs (else 400 "Invalid mapping", no index
// named). Then the rate: the mapping calls accepted for the api_key's
// organization (Knobs.UserMapOrgs; by default each api_key is its own) during the
// last window (1500 per 30 s, Knobs.UserMapLimit) plus this request's mappings
// must not pass the limit, else 429 {"code":429,"error":"Too many requests"}
// and nothing is applied or counted ("above it all requests are throttled
// until the window falls below the limit"). Then the mappings are applied
// in order (map sets user_id -> global_user_id, unmap removes it) and 200
// {"code":200}.
//
// GET /api/2/usermap: HTTP Basic authentication with a valid api_key and a
// non-empty secret (Knobs.UserMapSecrets', when set), else 401
// {"code":401,"error":"Invalid credentials"}; user_ids a JSON array of
// strings or comma-separated, 1 to 100 (else 400). The answer is a JSON object
// keyed by each requested id, with mapped_from (users that map into it) and
// mapped_to (the user it maps into) arrays of {svc_id, user_id}; empty arrays
// for an unknown user. svc_id is SvcID of the Basic user and the user id.

// MappingCall is one mapping applied by the simulator.
type MappingCall struct {
	Seq          int64     `json:"seq"`
	Request      int64     `json:"request"`
	Time         time.Time `json:"time"`
	KeyLabel     string    `json:"key_label"`
	UserID       string    `json:"user_id"`
	GlobalUserID string    `json:"global_user_id,omitempty"`
	Unmap        bool      `json:"unmap,omitempty"`
}

// MappingBatch is one accepted POST /usermap request: when it arrived, its
// organization and how many mapping calls it counted.
type MappingBatch struct {
	Time time.Time `json:"time"`
	Org  string    `json:"org"`
	N    int       `json:"n"`
}

// MappingRead is one GET /api/2/usermap request as the sim saw it.
type MappingRead struct {
	Time    time.Time `json:"time"`
	Status  int       `json:"status"`
	User    string    `json:"user_label"` // KeyLabel of the Basic auth user
	Query   string    `json:"query"`
	Headers []string  `json:"headers"` // canonical names of the request headers, sorted
}

// Mapping limits of the API reference.
const (
	MaxMappingsPerRequest = 2000
	MaxReadUserIDs        = 100
)

// ErrTextInvalidMapping answers a mapping the sim refuses.
const ErrTextInvalidMapping = "Invalid mapping"

// umState is the user mapping state (guarded by Sim.mu): its read-out's,
// and the rate's.
type umState struct {
	UserMapState
	hits windowHits // mapping calls per organization
	seq  int64
}

// UserMapState is the answer of GET /sim/usermap.
type UserMapState struct {
	Calls     []MappingCall  `json:"calls"`
	Batches   []MappingBatch `json:"batches"`
	Throttled int64          `json:"throttled"`
	Reads     []MappingRead  `json:"reads"`
	// Mapped is each organization's mappings: user_id -> global_user_id.
	Mapped map[string]map[string]string `json:"mapped"`
}

func (s *Sim) registerUserMap() {
	st := &umState{}
	s.onReset(func() {
		*st = umState{UserMapState: UserMapState{Mapped: map[string]map[string]string{}}, hits: windowHits{}}
	})
	s.readout("GET /sim/usermap", func(url.Values) any { return st.UserMapState })
	s.formRoute("/usermap", "mapping", true, MaxMappingsPerRequest, ErrTextInvalidMapping,
		func(in *incoming, apiKey string, raws []json.RawMessage) (int, any) {
			var ms []MappingCall
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, raw := range raws {
				var m struct {
					UserID       any `json:"user_id"`
					GlobalUserID any `json:"global_user_id"`
					Unmap        any `json:"unmap"`
				}
				bad := len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &m) != nil
				uid, isString := m.UserID.(string)
				unmap, isBool := m.Unmap.(bool)
				gid, _ := m.GlobalUserID.(string)
				if bad || !isString || uid == "" || s.knobs.RejectedUserIDs[uid] || (m.Unmap != nil && !isBool) || (gid == "" && !unmap) {
					return codeError(http.StatusBadRequest, ErrTextInvalidMapping)
				}
				ms = append(ms, MappingCall{UserID: uid, GlobalUserID: gid, Unmap: unmap})
			}
			now := s.cfg.Now()
			org := UserMapOrg(&s.knobs, apiKey)
			if ok, _ := st.hits.take(org, now, len(ms), s.knobs.UserMapLimit, s.knobs.UserMapWindow); !ok {
				st.Throttled++
				return codeError(http.StatusTooManyRequests, "Too many requests")
			}
			st.Batches = append(st.Batches, MappingBatch{Time: now, Org: org, N: len(ms)})
			users := entry(st.Mapped, org, func() map[string]string { return map[string]string{} })
			for _, m := range ms {
				st.seq++
				m.Seq, m.Request, m.Time, m.KeyLabel = st.seq, in.Rec.Seq, now, in.Rec.KeyLabel
				if m.Unmap {
					delete(users, m.UserID)
				} else {
					users[m.UserID] = m.GlobalUserID
				}
				st.Calls = append(st.Calls, m)
			}
			in.Rec.Ingested = len(ms)
			return http.StatusOK, map[string]int{"code": 200}
		})
	s.route("/api/2/usermap", routeHandler{serve: func(_ http.ResponseWriter, r *http.Request, _ *incoming) (status int, body any) {
		rd := MappingRead{Time: s.cfg.Now(), Query: r.URL.RawQuery, Headers: sortedKeys(r.Header)}
		defer func() { // after the unlock below
			rd.Status = status
			s.mu.Lock()
			st.Reads = append(st.Reads, rd)
			s.mu.Unlock()
		}()
		if r.Method != http.MethodGet {
			return codeError(http.StatusBadRequest, ErrTextInvalidPath)
		}
		user, pass, ok := r.BasicAuth()
		if ok {
			rd.User = KeyLabel(user)
			s.mu.Lock()
			want, has := s.knobs.UserMapSecrets[user]
			s.mu.Unlock()
			ok = s.validKey(user) && pass != "" && (!has || want == pass)
		}
		if !ok {
			return codeError(http.StatusUnauthorized, "Invalid credentials")
		}
		raw := strings.TrimSpace(r.URL.Query().Get("user_ids"))
		var ids []string
		if strings.HasPrefix(raw, "[") {
			if json.Unmarshal([]byte(raw), &ids) != nil {
				return codeError(http.StatusBadRequest, "Invalid user_ids")
			}
		} else if raw != "" {
			ids = strings.Split(raw, ",")
		}
		if len(ids) < 1 || len(ids) > MaxReadUserIDs {
			return codeError(http.StatusBadRequest, "Invalid user_ids: 1 to 100 user ids")
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		users := st.Mapped[UserMapOrg(&s.knobs, user)]
		out := make(map[string]userMapping, len(ids))
		for _, id := range ids {
			um := userMapping{MappedFrom: []svcUser{}, MappedTo: []svcUser{}}
			if g, ok := users[id]; ok {
				um.MappedTo = append(um.MappedTo, svcUser{SvcID: SvcID(user, g), UserID: g})
			}
			for u, g := range users {
				if g == id {
					um.MappedFrom = append(um.MappedFrom, svcUser{SvcID: SvcID(user, u), UserID: u})
				}
			}
			sort.Slice(um.MappedFrom, func(i, j int) bool { return um.MappedFrom[i].UserID < um.MappedFrom[j].UserID })
			out[id] = um
		}
		return http.StatusOK, out
	}})
}

// UserMapOrg is the organization of apiKey's mappings (Knobs.UserMapOrgs).
func UserMapOrg(k *Knobs, apiKey string) string {
	if o, ok := k.UserMapOrgs[apiKey]; ok {
		return o
	}
	return "key:" + KeyLabel(apiKey)
}

type svcUser struct {
	SvcID  int64  `json:"svc_id"`
	UserID string `json:"user_id"`
}

type userMapping struct {
	MappedFrom []svcUser `json:"mapped_from"`
	MappedTo   []svcUser `json:"mapped_to"`
}
