package groupidentify

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/forms"
	"github.com/svcrelay/relay/internal/storage"
)

// Operations are the group property operations of the API reference.
var operations = map[string]bool{"$set": true, "$setOnce": true, "$add": true, "$append": true, "$unset": true}

// Identification is one parsed, validated identification.
type Identification struct {
	GroupType, GroupValue string
	// Properties is the number of group properties (see Properties).
	Properties int
	// Data is the compacted JSON object as it is sent upstream.
	Data []byte
}

// Parse validates the identification parameter (a JSON array of objects, or
// one object) against the limits and returns the identifications. apiKey
// is only used to check that each identification fits an upstream request.
func Parse(apiKey string, identification []byte, maxIdentifies, maxProperties, maxBodyBytes int) ([]Identification, *forms.ValidationError) {
	raws, verr := forms.Items("identification", identification, maxIdentifies, "too_many_identifies", "group identifies")
	if verr != nil {
		return nil, verr
	}
	frame := (&delivery.Form{Field: "identification", MaxBodyBytes: maxBodyBytes}).Frame(storage.LaneKey{APIKey: apiKey})
	out := make([]Identification, 0, len(raws))
	total := 0
	var esc []byte // one record escaped, reused
	for i, raw := range raws {
		id, err := parseOne(raw)
		if err != nil {
			sep := "."
			if strings.HasPrefix(err.Msg, ":") {
				sep = ""
			}
			err.Msg = fmt.Sprintf("identification[%d]%s%s", i, sep, err.Msg)
			return nil, err
		}
		total += id.Properties
		if total > maxProperties {
			return nil, forms.Bad("too_many_properties", "identification: more than %d group properties in one request (at identification[%d])", maxProperties, i)
		}
		if esc, _ = frame.Record(esc, id.Data); frame.TooLarge(esc) { // escaped, as sent
			return nil, &forms.ValidationError{Status: http.StatusRequestEntityTooLarge, Reason: "too_large",
				Msg: fmt.Sprintf("identification[%d]: too large for one upstream request (1 MB)", i)}
		}
		out = append(out, id)
	}
	return out, nil
}

func parseOne(raw json.RawMessage) (Identification, *forms.ValidationError) {
	var obj map[string]json.RawMessage
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &obj) != nil {
		return Identification{}, forms.Bad("invalid_type", ": must be an object")
	}
	var id Identification
	for k, v := range obj {
		switch k {
		case "group_type", "group_value":
			var s string
			if isNull(v) {
				continue
			}
			if json.Unmarshal(v, &s) != nil {
				return id, forms.Bad("invalid_type", "%s: must be a string", k)
			}
			if k == "group_type" {
				id.GroupType = s
			} else {
				id.GroupValue = s
			}
		case "group_properties":
		default:
			return id, forms.Bad("unknown_field", "%s: unknown field (allowed: group_type, group_value, group_properties)", k)
		}
	}
	if id.GroupType == "" {
		return id, forms.Bad("missing_field", "group_type: missing or empty")
	}
	if id.GroupValue == "" {
		return id, forms.Bad("missing_field", "group_value: missing or empty")
	}
	gp, ok := obj["group_properties"]
	if !ok || isNull(gp) {
		return id, forms.Bad("missing_field", "group_properties: missing")
	}
	var props map[string]json.RawMessage
	if gp[0] != '{' || json.Unmarshal(gp, &props) != nil {
		return id, forms.Bad("invalid_type", "group_properties: must be an object")
	}
	for k, v := range props {
		if len(k) > 0 && k[0] == '$' {
			if !operations[k] {
				return id, forms.Bad("unknown_operation", "group_properties.%s: unknown operation (allowed: $set, $setOnce, $add, $append, $unset)", k)
			}
			var op map[string]json.RawMessage
			if len(v) == 0 || v[0] != '{' || json.Unmarshal(v, &op) != nil {
				return id, forms.Bad("invalid_type", "group_properties.%s: must be an object", k)
			}
			id.Properties += len(op)
		} else {
			id.Properties++
		}
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return id, forms.Bad("invalid_json", ": invalid JSON")
	}
	id.Data = buf.Bytes()
	return id, nil
}

// Properties counts the group properties of one identification's JSON: the
// keys of each $operation object plus each plain key of group_properties.
// Unreadable input counts 0.
func Properties(data []byte) int {
	var obj struct {
		GroupProperties map[string]json.RawMessage `json:"group_properties"`
	}
	if json.Unmarshal(data, &obj) != nil {
		return 0
	}
	n := 0
	for k, v := range obj.GroupProperties {
		if len(k) > 0 && k[0] == '$' {
			var op map[string]json.RawMessage
			if json.Unmarshal(v, &op) == nil {
				n += len(op)
				continue
			}
		}
		n++
	}
	return n
}

func isNull(v json.RawMessage) bool { return string(v) == "null" }

func (g *GroupIdentify) serve(w http.ResponseWriter, r *http.Request) {
	f, err := forms.ReadForm(r)
	if err != nil {
		g.In.Reject(w, &forms.ValidationError{Status: http.StatusRequestEntityTooLarge, Reason: "too_large",
			Msg: fmt.Sprintf("Payload too large: the limit is under %d bytes (1 MB)", MaxBodyBytes)})
		return
	}
	if n := len(f.Body); n >= MaxBodyBytes {
		g.In.Reject(w, &forms.ValidationError{Status: http.StatusRequestEntityTooLarge, Reason: "too_large",
			Msg: fmt.Sprintf("Payload too large: body of %d bytes; the limit is under %d bytes (1 MB)", n, MaxBodyBytes)})
		return
	}
	apiKey, ok := g.In.APIKey(w, r, forms.First("api_key", f.Post, f.Query))
	if !ok {
		return
	}
	ids, verr := Parse(apiKey, []byte(forms.First("identification", f.Post, f.Query)), MaxIdentifies, MaxProperties, MaxBodyBytes)
	if verr != nil {
		g.In.Reject(w, verr)
		return
	}
	var b storage.Batch
	for _, id := range ids {
		key := make([]byte, 0, len(id.GroupType)+1+len(id.GroupValue))
		key = append(append(append(key, id.GroupType...), 0), id.GroupValue...)
		b.Add(storage.Record{OrderKey: key, Data: id.Data})
	}
	g.In.Accept(w, apiKey, &b, len(ids))
}
