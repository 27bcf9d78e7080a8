package sim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"time"
)

// Group identify (POST /groupidentify), by the API reference: form fields
// api_key and identification (a JSON array of objects with group_type,
// group_value, group_properties; the simulator also takes one object), "at
// most 1024 group identifies, 1024 group properties, 1 MB" per request.
//
// Order of checks: method POST (else 400 "Invalid request path"); body under
// MaxBodyBytes (else 413 "Payload too large"); api_key present (else 400
// "Request missing required field", missing_field api_key) and valid (else
// 400 "Invalid API key"); identification present (else missing_field
// identification); valid JSON array or object of objects (else 400 "Invalid
// JSON request body"); at most 1024 identifications and 1024 group
// properties (plain keys of group_properties plus the keys inside each
// $operation), each with non-empty string group_type and group_value,
// group_properties absent or an object whose $ keys are $set, $setOnce,
// $add, $append or $unset holding objects, and no group value refused with
// Knobs.RejectedGroupValues (else 400 "Invalid group identification", naming no index,
// so a client bisects). Then 200 {"code":200} and every identification is
// stored. The form fields are read from the body, else from the query.

// GroupIdentify is one identification stored by the simulator.
type GroupIdentify struct {
	// Seq numbers stored identifications in arrival order, from 1.
	Seq int64 `json:"seq"`
	// Request is the Seq of the request (Record) that brought it.
	Request    int64           `json:"request"`
	Time       time.Time       `json:"time"`
	KeyLabel   string          `json:"key_label"`
	GroupType  string          `json:"group_type"`
	GroupValue string          `json:"group_value"`
	Raw        json.RawMessage `json:"raw"`
}

// Group identify limits of the API reference.
const (
	MaxGroupIdentifies = 1024
	MaxGroupProperties = 1024
)

// ErrTextInvalidGroupIdentify answers an identification the sim refuses.
const ErrTextInvalidGroupIdentify = "Invalid group identification"

var groupOps = map[string]bool{"$set": true, "$setOnce": true, "$add": true, "$append": true, "$unset": true}

// registerGroupIdentify registers the route and its read-out GET
// /sim/groupidentify?api_key=K (K's identifications).
func (s *Sim) registerGroupIdentify() {
	var seq int64
	var byKey map[string][]GroupIdentify
	s.onReset(func() { seq, byKey = 0, map[string][]GroupIdentify{} })
	s.readout("/sim/groupidentify", func(q url.Values) any { return nonNil(byKey[q.Get("api_key")]) })
	s.formRoute("/groupidentify", "identification", false, MaxGroupIdentifies, ErrTextInvalidGroupIdentify,
		func(in *incoming, apiKey string, raws []json.RawMessage) (int, any) {
			s.mu.Lock()
			defer s.mu.Unlock()
			out, ok := parseIdentifies(raws, s.knobs.RejectedGroupValues)
			if !ok {
				return codeError(http.StatusBadRequest, ErrTextInvalidGroupIdentify)
			}
			now := s.cfg.Now()
			for i := range out {
				seq++
				out[i].Seq, out[i].Request, out[i].Time, out[i].KeyLabel = seq, in.Rec.Seq, now, in.Rec.KeyLabel
			}
			byKey[apiKey] = append(byKey[apiKey], out...)
			s.store.stats.GroupIdentifies++
			in.Rec.Ingested = len(out)
			return http.StatusOK, map[string]int{"code": 200}
		})
}

// formRoute registers a form endpoint (/groupidentify, /usermap): f gets
// the api key and the items of field name once they passed the checks the
// two share. The form's fields are the body's and the query's others (the
// query's first with queryFirst); api_key must be given and valid, name a
// JSON array of 1 to most objects. Failures are refuseIngest's, or 400 with
// the upstream's text (tooMany for more than most objects).
func (s *Sim) formRoute(pattern, name string, queryFirst bool, most int, tooMany string,
	f func(in *incoming, apiKey string, raws []json.RawMessage) (int, any)) {
	s.route(pattern, routeHandler{
		describe: func(in *incoming) { // the record's key label and item count, from the body
			v, _ := url.ParseQuery(string(in.Body))
			if k := v.Get("api_key"); k != "" {
				in.Rec.KeyLabel = KeyLabel(k)
			}
			if items, ok := jsonObjects(v.Get(name)); ok {
				in.Rec.Events = len(items)
			}
		},
		serve: func(_ http.ResponseWriter, r *http.Request, in *incoming) (int, any) {
			if status, body := refuseIngest(r, in); status != 0 {
				return status, body
			}
			form, _ := url.ParseQuery(string(in.Body))
			then := r.URL.Query()
			if queryFirst {
				form, then = then, form
			}
			for k, vs := range then {
				if _, ok := form[k]; !ok {
					form[k] = vs
				}
			}
			fail := func(b errBody) (int, any) {
				b.Code = http.StatusBadRequest
				return b.Code, &b
			}
			apiKey := form.Get("api_key")
			if apiKey == "" {
				return fail(errBody{Error: ErrTextMissingField, MissingField: "api_key"})
			}
			in.Rec.KeyLabel = KeyLabel(apiKey)
			if !s.validKey(apiKey) {
				return fail(errBody{Error: ErrTextInvalidAPIKey})
			}
			value := form.Get(name)
			if value == "" {
				return fail(errBody{Error: ErrTextMissingField, MissingField: name})
			}
			raws, ok := jsonObjects(value)
			in.Rec.Events = len(raws)
			switch {
			case !ok || len(raws) == 0:
				return fail(errBody{Error: ErrTextInvalidJSON})
			case len(raws) > most:
				return fail(errBody{Error: tooMany})
			}
			return f(in, apiKey, raws)
		}})
}

// jsonObjects parses a JSON array of values or one object.
func jsonObjects(v string) ([]json.RawMessage, bool) {
	b := bytes.TrimSpace([]byte(v))
	if len(b) > 0 && b[0] == '{' {
		return []json.RawMessage{b}, json.Valid(b)
	}
	var arr []json.RawMessage
	err := json.Unmarshal(b, &arr) // leaves arr nil when b is no array
	return arr, err == nil
}

// parseIdentifies reads the identifications by the rules above; ok is
// false when one breaks them (the answer names none).
func parseIdentifies(raws []json.RawMessage, rejected map[string]bool) (out []GroupIdentify, ok bool) {
	props := 0
	for _, raw := range raws {
		var p struct {
			GroupType       any                        `json:"group_type"`
			GroupValue      any                        `json:"group_value"`
			GroupProperties map[string]json.RawMessage `json:"group_properties"`
		}
		if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &p) != nil {
			return nil, false
		}
		gt, ok1 := p.GroupType.(string)
		gv, ok2 := p.GroupValue.(string)
		if !ok1 || !ok2 || gt == "" || gv == "" || rejected[gv] {
			return nil, false
		}
		for k, v := range p.GroupProperties {
			if len(k) == 0 || k[0] != '$' {
				props++
				continue
			}
			var op map[string]json.RawMessage
			if !groupOps[k] || json.Unmarshal(v, &op) != nil || op == nil {
				return nil, false
			}
			props += len(op)
		}
		out = append(out, GroupIdentify{GroupType: gt, GroupValue: gv, Raw: append(json.RawMessage{}, raw...)})
	}
	return out, props <= MaxGroupProperties
}
