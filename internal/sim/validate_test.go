package sim

import (
	"encoding/json"
	"testing"
)

// validateSeeds are FuzzValidate's seeds (FuzzAgree runs them too).
var validateSeeds = []string{
	`{"api_key":"k","events":[{"event_type":"e","user_id":"user1"}]}`,
	`{"api_key":"k","events":[{"event_type":"e","device_id":"0000-0000","time":"x"}],"options":{"min_id_length":0}}`,
	`{"api_key":"k","events":[{"event_type":"e","user_id":"ab","event_properties":{"a":[[[{}]]]}}],"options":{"min_id_length":2}}`,
	`{"api_key":"k","events":[{"event_type":"e","user_id":"user1","time":1.0},{"user_id":null}]}`,
	`{"api_key":"k","events":null}`, `[]`, ``, `{"api_key":1}`,
}

// FuzzValidate: the validator never panics, an accepted envelope satisfies
// the document's minimal request, and a rejection names only real events.
func FuzzValidate(f *testing.F) {
	for _, s := range validateSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		env, e := validate(body, nil, 2000)
		if (env == nil) == (e == nil) {
			t.Fatalf("env %v, err %v", env, e)
		}
		if e != nil {
			if e.Code != 400 || e.Error == "" {
				t.Fatalf("bad error %+v", e)
			}
			var top struct{ Events []json.RawMessage }
			json.Unmarshal(body, &top)
			for _, m := range []map[string][]int{e.InvalidFields, e.MissingFields} {
				for field, idx := range m {
					if len(idx) != 1 || idx[0] < 0 || (len(top.Events) > 0 && idx[0] >= len(top.Events)) {
						t.Fatalf("field %s names %v of %d events", field, idx, len(top.Events))
					}
				}
			}
			return
		}
		if env.apiKey == "" || len(env.raw) == 0 || len(env.raw) != len(env.info) {
			t.Fatalf("accepted %+v", env)
		}
		if !json.Valid(body) {
			t.Fatal("accepted invalid JSON")
		}
		for i, ev := range env.info {
			if ev.eventType == "" || (ev.deviceID == "" && ev.userID == "") || (ev.deviceID != "" && allZero(ev.deviceID)) {
				t.Fatalf("event %d accepted: %+v", i, ev)
			}
		}
	})
}

func TestDepthAndKinds(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want int
	}{{`1`, 0}, {`{}`, 1}, {`{"a":[{"b":"}}}"}]}`, 3}, {`[[],[[]]]`, 3}, {`"[[["`, 0},
		{`{"a":"\"{{"}`, 1}, {`{"a":"\\","b":{}}`, 2}} {
		if got := depth([]byte(tc.v)); got != tc.want {
			t.Errorf("depth(%s) = %d, want %d", tc.v, got, tc.want)
		}
	}
	for _, tc := range []struct {
		s    string
		want bool
	}{{"0", true}, {"00000000-0000-0000-0000-000000000000", true}, {"-", false}, {"0001", false}, {"", false}} {
		if allZero(tc.s) != tc.want {
			t.Errorf("allZero(%q) != %v", tc.s, tc.want)
		}
	}
}
