package groupidentify

import (
	"encoding/json"

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

// shape is POST /groupidentify's requests.
var shape = forms.Shape{Field: "identification", Noun: "group identifies", TooMany: "too_many_identifies",
	MaxItems: MaxIdentifies, MaxBodyBytes: MaxBodyBytes, ItemFields: []string{"group_type", "group_value", "group_properties"}}

// parse validates the identification parameter (a JSON array of objects,
// or one object) against the limits of s and MaxProperties and returns the
// identifications. apiKey is only used to check that each identification
// fits an upstream request.
func parse(s forms.Shape, apiKey string, identification []byte) ([]Identification, *forms.ValidationError) {
	total := 0
	return forms.Each(s, apiKey, identification, func(i int, obj map[string]json.RawMessage, data []byte) (Identification, *forms.ValidationError) {
		id, err := parseOne(obj, data)
		if total += id.Properties; err == nil && total > MaxProperties {
			err = forms.Bad("too_many_properties", "identification: more than %d group properties in one request (at identification[%d])", MaxProperties, i)
		}
		return id, err
	})
}

// Record is id's spool record, ordered by group.
func (id Identification) Record() storage.Record {
	key := make([]byte, 0, len(id.GroupType)+1+len(id.GroupValue))
	return storage.Record{OrderKey: append(append(append(key, id.GroupType...), 0), id.GroupValue...), Data: id.Data}
}

func parseOne(obj map[string]json.RawMessage, data []byte) (id Identification, err *forms.ValidationError) {
	id.Data = data
	if id.GroupType, err = forms.String(obj, "group_type"); err != nil {
		return id, err
	}
	if id.GroupValue, err = forms.String(obj, "group_value"); err != nil {
		return id, err
	}
	gp, ok := obj["group_properties"]
	switch {
	case id.GroupType == "":
		return id, forms.Bad("missing_field", ".group_type: missing or empty")
	case id.GroupValue == "":
		return id, forms.Bad("missing_field", ".group_value: missing or empty")
	case !ok:
		return id, forms.Bad("missing_field", ".group_properties: missing")
	}
	var props map[string]json.RawMessage
	if gp[0] != '{' || json.Unmarshal(gp, &props) != nil {
		return id, forms.Bad("invalid_type", ".group_properties: must be an object")
	}
	for k, v := range props {
		if len(k) > 0 && k[0] == '$' {
			if !operations[k] {
				return id, forms.Bad("unknown_operation", ".group_properties.%s: unknown operation (allowed: $set, $setOnce, $add, $append, $unset)", k)
			}
			if v[0] != '{' { // valid JSON: an object
				return id, forms.Bad("invalid_type", ".group_properties.%s: must be an object", k)
			}
		}
	}
	id.Properties = count(props)
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
	return count(obj.GroupProperties)
}

// count is Properties of group_properties read.
func count(props map[string]json.RawMessage) (n int) {
	for k, v := range props {
		var op map[string]json.RawMessage
		if len(k) > 0 && k[0] == '$' && json.Unmarshal(v, &op) == nil {
			n += len(op)
		} else {
			n++
		}
	}
	return n
}
