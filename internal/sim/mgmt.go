package sim

import (
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// This file holds what the management API groups of
// docs/upstream-api.md (experiments, SCIM, classifiers) and the taxonomy API share
// (experiments.go, scim.go, classifiers.go, taxonomy.go):
//
//   - mgmtRoute registers a route with the shared request log, latency,
//     injected faults and down state, reads the body with the group's own
//     limit (larger: 413), checks the group's authentication and logs the
//     call (GET /sim/mgmt/calls).
//   - Authentication. Experiments: "Authorization: Bearer <management key>";
//     SCIM: "Bearer <scim token>", the token names the organization;
//     classifiers and taxonomy: HTTP Basic api_key:secret_key, the api key
//     names the project. Missing or malformed: 401. A token or key pair that
//     is not accepted: 403. Accepted: the Knobs' management keys, SCIM tokens
//     and project secrets (see Knobs); api keys as /2/httpapi accepts them.
//   - Their state lives in the route groups, not in the store; Reset (and
//     /sim/reset) forgets the call log and every experiment, SCIM user and
//     group, classifier, taxonomy entry, rate window and cost spent, and
//     keeps the accepted keys, tokens, secrets and limits.

// MgmtCall is one request to a management route as the sim saw it.
type MgmtCall struct {
	Seq    int64     `json:"seq"`
	Time   time.Time `json:"time"`
	API    string    `json:"api"` // "experiment", "scim", "classifier", "taxonomy"
	Method string    `json:"method"`
	Path   string    `json:"path"` // escaped path as received
	Query  string    `json:"query,omitempty"`
	// Auth is the scheme of the Authorization header: "bearer", "basic",
	// "none" or "other".
	Auth string `json:"auth"`
	// Principal is KeyLabel of the bearer token or Basic user ("" when none).
	Principal string `json:"principal,omitempty"`
	// Account is the organization (SCIM) or api key label (classifier,
	// taxonomy) the call counted for; "" when authentication failed.
	Account string `json:"account,omitempty"`
	Status  int    `json:"status"`
	// Headers are the canonical names of the request headers, sorted.
	Headers []string `json:"headers,omitempty"`
	Body    string   `json:"body,omitempty"` // first 4 KiB
}

// mgmtAuth is a group's authentication: its scheme, the text of its 403
// and the content type of its answers.
type mgmtAuth struct{ scheme, forbidden, ct string }

var (
	authMgmtBearer = &mgmtAuth{"Bearer", "invalid management API key", "application/json"}
	authSCIMBearer = &mgmtAuth{"Bearer", "invalid SCIM token", "application/scim+json"}
	authBasic      = &mgmtAuth{"Basic", "invalid API key or secret key", "application/json"}
)

// mgmtState is the state the management route groups share (guarded by
// Sim.mu).
type mgmtState struct {
	seq   int64
	calls []MgmtCall

	exp *expState
	tax *taxState
}

// maxMgmtCalls bounds the call log (oldest dropped first).
const maxMgmtCalls = 100_000

// MgmtCalls is the answer of GET /sim/mgmt/calls.
type MgmtCalls struct {
	Calls []MgmtCall `json:"calls"`
	// TaxonomyPeak is the highest taxonomy cost in flight seen per KeyLabel.
	TaxonomyPeak map[string]int `json:"taxonomy_peak"`
}

func (s *Sim) registerMgmt() {
	st := &mgmtState{}
	s.mg = st
	s.onReset(func() { st.seq, st.calls = 0, nil })
	s.readout("/sim/mgmt/calls", func(url.Values) any {
		return MgmtCalls{Calls: st.calls, TaxonomyPeak: st.tax.peak}
	})
}

type mgRequest struct {
	r       *http.Request
	body    []byte
	account string // organization (SCIM), api key (classifier, taxonomy), token label (experiment)
	call    *MgmtCall
}

// mgmtRoute registers pattern ("METHOD /path/{x}") for api: h returns a
// request's answer (see writeAnswer) once it passed the checks of the top of
// this file.
func (s *Sim) mgmtRoute(api, pattern string, auth *mgmtAuth, maxBody int64, h func(w http.ResponseWriter, q *mgRequest) (int, any)) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		call := &MgmtCall{Time: s.cfg.Now(), API: api, Method: r.Method, Path: r.URL.EscapedPath(),
			Query: r.URL.RawQuery, Headers: sortedKeys(r.Header)}
		call.Status = s.serve(&Exchange{W: w, R: r, Direct: true, h: routeHandler{serve: func(w http.ResponseWriter, r *http.Request, _ *incoming) (int, any) {
			av := r.Header.Get("Authorization")
			scheme, cred, _ := strings.Cut(av, " ")
			cred = strings.TrimSpace(cred)
			call.Auth = "other"
			switch {
			case av == "":
				call.Auth = "none"
			case strings.EqualFold(scheme, "bearer"), strings.EqualFold(scheme, "basic"):
				call.Auth = strings.ToLower(scheme)
			}
			key, secret, found := cred, "", true
			if auth == authBasic {
				dec, err := base64.StdEncoding.DecodeString(cred)
				key, secret, found = strings.Cut(string(dec), ":")
				found = found && err == nil
			}
			if call.Auth != strings.ToLower(auth.scheme) || key == "" || !found {
				w.Header().Set("WWW-Authenticate", auth.scheme+` realm="svc"`)
				return apiFail(http.StatusUnauthorized, "missing or malformed Authorization: "+auth.scheme+" header")
			}
			call.Principal = KeyLabel(key)
			q := &mgRequest{r: r, call: call, account: call.Principal}
			validKey := auth != authBasic || s.validKey(key) // it takes s.mu itself
			s.mu.Lock()
			k := &s.knobs
			ok := len(k.ManagementKeys) == 0 || k.ManagementKeys[key]
			switch auth {
			case authSCIMBearer:
				if q.account, ok = k.SCIMTokens[key]; len(k.SCIMTokens) == 0 {
					q.account, ok = call.Principal, true
				}
			case authBasic:
				wantSecret, hasSecret := k.ProjectSecrets[key]
				q.account, ok = key, secret != "" && (!hasSecret || wantSecret == secret)
			}
			s.mu.Unlock()
			if !validKey || !ok {
				return apiFail(http.StatusForbidden, auth.forbidden)
			}
			if status, msg := decodeBody(r); status != 0 {
				return apiFail(status, msg)
			}
			body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
			switch {
			case err != nil:
				return apiFail(http.StatusBadRequest, "unreadable body")
			case int64(len(body)) > maxBody:
				return apiFail(http.StatusRequestEntityTooLarge, "Payload too large")
			}
			q.body = body
			call.Body = string(body[:min(len(body), 4096)])
			call.Account = q.account
			if auth == authBasic {
				call.Account = call.Principal // a label, not the api key
			}
			status, answer := h(w, q)
			writeAnswer(w, status, answer, auth.ct)
			return status, written{}
		}}})
		s.mu.Lock()
		s.mg.seq++
		call.Seq = s.mg.seq
		pushKeep(&s.mg.calls, *call, maxMgmtCalls)
		s.mu.Unlock()
	})
}

// windowHits keeps the counted calls (time, cost) per account for a sliding
// window limit.
type windowHits map[string][]hit

type hit struct {
	t    time.Time
	cost int
}

// take counts a call of account costing cost at now unless the costs in
// (now-window, now] and cost pass limit; when refused it returns how long
// until the oldest leaves.
func (h windowHits) take(account string, now time.Time, cost, limit int, window time.Duration) (bool, time.Duration) {
	ts := h[account]
	for len(ts) > 0 && !ts[0].t.After(now.Add(-window)) {
		ts = ts[1:]
	}
	h[account] = ts
	total := cost
	for _, x := range ts {
		total += x.cost
	}
	switch {
	case total > limit && len(ts) == 0:
		return false, window
	case total > limit:
		return false, ts[0].t.Add(window).Sub(now)
	}
	h[account] = append(ts, hit{now, cost})
	return true, 0
}

// written is the body of an answer its handler wrote itself (an archive,
// a file, a redirect): its status was written, nothing is left to write.
type written struct{}

// writeAnswer writes a handler's answer: nothing more for written{}, only
// the status for a nil body, a string as text, bytes as given, anything
// else as JSON; ct is the type of the last two.
func writeAnswer(w http.ResponseWriter, status int, body any, ct string) {
	var b []byte
	switch v := body.(type) {
	case written:
		return
	case nil:
		w.WriteHeader(status)
		return
	case string:
		b, ct = []byte(v), "text/plain; charset=utf-8"
	case []byte:
		b = v
	default:
		b = appendJSON(nil, v)
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

func retryAfter(w http.ResponseWriter, d time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int((d+time.Second-1)/time.Second))))
}
