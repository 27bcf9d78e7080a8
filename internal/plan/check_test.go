package plan

import (
	"encoding/json"
	"reflect"
	"testing"
)

func testPlan() *Plan {
	return &Plan{
		EventTypes: []string{"Product Viewed", "Search"},
		Shared:     []Property{{Name: "page", Type: "string"}, {Name: "price", Type: "number"}},
		Overrides: map[string][]Property{
			"Product Viewed": {
				{Name: "product_id", Type: "string", Regex: `SKU-[0-9]+`, Required: true},
				{Name: "category", Type: "enum", Enum: []string{"garden", "kitchen"}},
				{Name: "tags", Type: "string", Array: true},
				{Name: "in_stock", Type: "boolean"},
			},
		},
		UserProperties: []Property{{Name: "plan", Type: "enum", Enum: []string{"free", "pro"}}, {Name: "age", Type: "number"}},
	}
}

func TestCheck(t *testing.T) {
	c, err := compile(testPlan())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		event string
		want  []Violation
	}{
		{"planned", `{"event_type":"Product Viewed","event_properties":{"product_id":"SKU-1","category":"garden","tags":["a","b"],"price":3.5,"in_stock":true},"user_properties":{"$set":{"plan":"pro"}}}`, nil},
		{"shared only", `{"event_type":"Search","event_properties":{"page":"/x"}}`, nil},
		{"sdk own event", `{"event_type":"$identify","user_properties":{"$set":{"age":3}}}`, nil},
		{"null is absent", `{"event_type":"Product Viewed","event_properties":{"product_id":"SKU-2","price":null}}`, nil},
		{"unplanned type", `{"event_type":"Nope"}`, []Violation{{UnplannedEventType, ""}}},
		{"unplanned property", `{"event_type":"Search","event_properties":{"x":1}}`, []Violation{{UnplannedEventProperty, "x"}}},
		{"override not on other type", `{"event_type":"Search","event_properties":{"product_id":"SKU-1"}}`, []Violation{{UnplannedEventProperty, "product_id"}}},
		{"required missing", `{"event_type":"Product Viewed","event_properties":{"price":1}}`, []Violation{{RequiredMissing, "product_id"}}},
		{"required null", `{"event_type":"Product Viewed","event_properties":{"product_id":null}}`, []Violation{{RequiredMissing, "product_id"}}},
		{"wrong type", `{"event_type":"Search","event_properties":{"price":"3"}}`, []Violation{{WrongType, "price"}}},
		{"object for string", `{"event_type":"Search","event_properties":{"page":{"a":1}}}`, []Violation{{WrongType, "page"}}},
		{"boolean", `{"event_type":"Product Viewed","event_properties":{"product_id":"SKU-1","in_stock":"yes"}}`, []Violation{{WrongType, "in_stock"}}},
		{"enum", `{"event_type":"Product Viewed","event_properties":{"product_id":"SKU-1","category":"toys"}}`, []Violation{{NotInEnum, "category"}}},
		{"regex is whole", `{"event_type":"Product Viewed","event_properties":{"product_id":"xSKU-1"}}`, []Violation{{RegexMismatch, "product_id"}}},
		{"escaped keys", `{"event_type":"Search","event_properties":{"pa\u0067e":"/x"},"user_properties":{"$set":{"a\u0067e":1}}}`, nil},
		{"escaped string", `{"event_type":"Product Viewed","event_properties":{"product_id":"SKU-\u0031"}}`, nil},
		{"scalar for array", `{"event_type":"Product Viewed","event_properties":{"product_id":"SKU-1","tags":"a"}}`, []Violation{{ArrayMismatch, "tags"}}},
		{"array for scalar", `{"event_type":"Search","event_properties":{"page":["a"]}}`, []Violation{{ArrayMismatch, "page"}}},
		{"array element", `{"event_type":"Product Viewed","event_properties":{"product_id":"SKU-1","tags":["a",1,2]}}`, []Violation{{WrongType, "tags"}}},
		{"user unplanned", `{"event_type":"Search","user_properties":{"$set":{"x":1},"$unset":{"age":"-"}}}`, []Violation{{UnplannedUserProperty, "user:x"}}},
		{"user enum", `{"event_type":"Search","user_properties":{"plan":"gold"}}`, []Violation{{NotInEnum, "user:plan"}}},
		// One order of violations whatever the record's order of fields.
		{"type last", `{"event_properties":{"x":1},"user_properties":{"w":1},"event_type":"Search"}`,
			[]Violation{{UnplannedEventProperty, "x"}, {UnplannedUserProperty, "user:w"}}},
		{"user first", `{"user_properties":{"w":1},"event_type":"Product Viewed","event_properties":{"x":1}}`,
			[]Violation{{UnplannedEventProperty, "x"}, {RequiredMissing, "product_id"}, {UnplannedUserProperty, "user:w"}}},
		{"user before missing", `{"event_type":"Product Viewed","user_properties":{"w":1}}`,
			[]Violation{{RequiredMissing, "product_id"}, {UnplannedUserProperty, "user:w"}}},
		// A field given twice: the last counts.
		{"twice", `{"event_type":"Search","event_properties":{"x":1},"user_properties":{"w":1},"event_properties":{"page":"/a"}}`,
			[]Violation{{UnplannedUserProperty, "user:w"}}},
		{"type twice", `{"event_type":"Nope","event_properties":{"page":"/a"},"event_type":"Search"}`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !json.Valid([]byte(tt.event)) {
				t.Fatal("test event is not JSON")
			}
			for _, m := range []Mode{Observe, Filter, Block} {
				v, vs := c.check([]byte(tt.event), m, nil)
				if (len(vs) > 0 || len(tt.want) > 0) && !reflect.DeepEqual(vs, tt.want) {
					t.Fatalf("%v: violations %v, want %v", m, vs, tt.want)
				}
				unplannedType := len(vs) > 0 && vs[0].Kind == UnplannedEventType
				if want := len(vs) > 0 && (m == Block || m == Filter && unplannedType); v.quarantine != want {
					t.Errorf("%v: quarantine %v, want %v", m, v.quarantine, want)
				}
				if m != Filter && v.out != nil {
					t.Errorf("%v: rewrote the event", m)
				}
			}
		})
	}
}

func TestFilterRemovesUnplanned(t *testing.T) {
	c, err := compile(testPlan())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ in, want string }{
		{`{"event_type":"Search","event_properties":{"x":1,"page":"/a","y":[1,{"z":"}"}]},"user_properties":{"age":1,"w":2}}`,
			`{"event_type":"Search","event_properties":{"page":"/a"},"user_properties":{"age":1}}`},
		{`{"user_properties":{"$set":{"q":1}}, "event_type":"Search", "event_properties":{ "x" : 1 }}`,
			`{"user_properties":{"$set":{}}, "event_type":"Search", "event_properties":{  }}`},
		{`{"event_type":"Search","event_properties":{"page":"/a","x":1}}`, `{"event_type":"Search","event_properties":{"page":"/a"}}`},
	}
	for _, tt := range tests {
		v, _ := c.check([]byte(tt.in), Filter, nil)
		if string(v.out) != tt.want || v.quarantine {
			t.Errorf("filter of %s:\n got %s (quarantine %v)\nwant %s", tt.in, v.out, v.quarantine, tt.want)
		}
		if !json.Valid(v.out) {
			t.Errorf("filter of %s gave invalid JSON", tt.in)
		}
	}
}

func FuzzCheck(f *testing.F) {
	f.Add([]byte(`{"event_type":"Search","event_properties":{"x":1,"page":"/a"},"user_properties":{"$set":{"q":[1]}}}`))
	c, err := compile(testPlan())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		v, _ := c.check(b, Filter, nil)
		if v.out != nil && !json.Valid(v.out) {
			t.Fatalf("filter of %q gave invalid JSON %q", b, v.out)
		}
	})
}
