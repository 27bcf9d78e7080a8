package sim

import (
	"slices"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/sim/wiretest"
)

var (
	deep    = `{"a":` + strings.Repeat(`{"a":`, 39) + `1` + strings.Repeat(`}`, 40) // 40 layers
	tooDeep = `{"a":` + strings.Repeat(`{"a":`, 40) + `1` + strings.Repeat(`}`, 41) // 41 layers
)

// validationCases are the documented rules, one case each; TestValidation
// posts them over HTTP and TestAgree runs them through internal/event too.
// want holds the fields the answer must have (others may be present).
var validationCases = []struct {
	name   string
	doc    string // the sentence of the document the case rests on
	body   string
	status int
	want   map[string]any
}{
	{"minimal", "Minimal ingestion request: api_key plus events holding objects with event_type and user_id or device_id.",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1"}]}`, 200,
		map[string]any{"code": 200, "events_ingested": 1}},
	{"empty body", "error is one of: ... Missing request body", ``, 400,
		map[string]any{"code": 400, "error": "Missing request body"}},
	{"whitespace body", "Missing request body (sim's and relay's choice: JSON whitespace is no body)", " \r\n\t ", 400,
		map[string]any{"code": 400, "error": "Missing request body"}},
	{"bad json", "Invalid JSON request body", `{"api_key":`, 400,
		map[string]any{"error": "Invalid JSON request body"}},
	{"not an object", "Invalid JSON request body", `[1,2]`, 400,
		map[string]any{"error": "Invalid JSON request body"}},
	{"missing api_key", "api_key | string | Required. missing_field (string, names the missing request-level field)",
		`{"events":[{"event_type":"e","user_id":"user1"}]}`, 400,
		map[string]any{"error": "Request missing required field", "missing_field": "api_key"}},
	{"empty api_key", "api_key Required", `{"api_key":"","events":[{"event_type":"e","user_id":"user1"}]}`, 400,
		map[string]any{"missing_field": "api_key"}},
	{"null api_key", "api_key Required (null is absent)", `{"api_key":null,"events":[{"event_type":"e","user_id":"user1"}]}`, 400,
		map[string]any{"error": "Request missing required field", "missing_field": "api_key"}},
	{"api_key not a string", "Invalid API key", `{"api_key":5,"events":[{"event_type":"e","user_id":"user1"}]}`, 400,
		map[string]any{"error": "Invalid API key", "missing_field": nil}},
	{"api_key array before bad events", "Invalid API key", `{"api_key":["k"],"events":"x"}`, 400,
		map[string]any{"error": "Invalid API key"}},
	{"missing events", "events | array of Event | Required.", `{"api_key":"k"}`, 400,
		map[string]any{"error": "Request missing required field", "missing_field": "events"}},
	{"empty events", "events Required", `{"api_key":"k","events":[]}`, 400,
		map[string]any{"missing_field": "events"}},
	{"null events", "events Required (null is absent)", `{"api_key":"k","events":null}`, 400,
		map[string]any{"error": "Request missing required field", "missing_field": "events"}},
	{"events not array", "Invalid event JSON", `{"api_key":"k","events":{"event_type":"e"}}`, 400,
		map[string]any{"error": "Invalid event JSON", "missing_field": nil}},
	{"events a string", "Invalid event JSON", `{"api_key":"k","events":"[]"}`, 400,
		map[string]any{"error": "Invalid event JSON"}},
	{"event not object", "Invalid event JSON", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1"},3]}`, 400,
		map[string]any{"error": "Invalid event JSON"}},
	{"missing event_type", "event_type | string | Required.",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1"},{"user_id":"user1"},{"user_id":"user1"}]}`, 400,
		map[string]any{"error": "Request missing required field", "events_with_missing_fields": map[string]any{"event_type": []int{1}}}},
	{"no ids", "One of user_id or device_id is required",
		`{"api_key":"k","events":[{"event_type":"e"}]}`, 400,
		map[string]any{"error": "Request missing required field", "events_with_missing_fields": map[string]any{"device_id": []int{0}, "user_id": []int{0}}}},
	{"empty ids", "One of user_id or device_id is required (\"\" is absent)",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1"},{"event_type":"e","user_id":"","device_id":null}]}`, 400,
		map[string]any{"error": "Request missing required field", "events_with_missing_fields": map[string]any{"device_id": []int{1}, "user_id": []int{1}}}},
	{"short ids removed", "If an event has a user_id or device_id shorter than the minimum, the ID value is removed from the event; if the event then has neither, it can be rejected with 400.",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1"},{"event_type":"e","user_id":"abcd","device_id":"dev"}]}`, 400,
		map[string]any{"error": "Invalid field values on some events", "events_with_invalid_fields": map[string]any{"device_id": []int{1}, "user_id": []int{1}}, "events_with_missing_fields": nil}},
	{"short user id removed", "the ID value is removed from the event; if the event then has neither, it can be rejected with 400.",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"abcd"}]}`, 400,
		map[string]any{"error": "Invalid field values on some events", "events_with_invalid_fields": map[string]any{"user_id": []int{0}}}},
	{"short id but other ok", "the ID value is removed from the event",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"abcd","device_id":"device1"}]}`, 200, nil},
	{"min_id_length override", "options: min_id_length (integer) overrides the default minimum of 5",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"ab"}],"options":{"min_id_length":2}}`, 200, nil},
	{"min_id_length not integer", "min_id_length (integer)",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1"}],"options":{"min_id_length":"2"}}`, 400,
		map[string]any{"error": "Invalid JSON request body"}},
	{"min_id_length negative", "min_id_length (integer) overrides the default minimum",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1"}],"options":{"min_id_length":-1}}`, 400,
		map[string]any{"error": "Invalid JSON request body"}},
	{"min_id_length above int32", "min_id_length (integer)",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1"}],"options":{"min_id_length":2147483648}}`, 400,
		map[string]any{"error": "Invalid JSON request body"}},
	{"options not object", "options | object | Optional.",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1"}],"options":[]}`, 400,
		map[string]any{"error": "Invalid JSON request body"}},
	{"options checked before api_key", "options | object (an invalid body wins over field rules)",
		`{"api_key":1,"options":"x"}`, 400,
		map[string]any{"error": "Invalid JSON request body"}},
	{"all-zero device", "All-zero device IDs are dropped and the request returns an error.",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1","device_id":"00000000-0000-0000-0000-000000000000"}]}`, 400,
		map[string]any{"error": "Invalid field values on some events", "events_with_invalid_fields": map[string]any{"device_id": []int{0}}}},
	{"iso time", "time: Any other format (for example ISO) returns 400.",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1"},{"event_type":"e","user_id":"user1","time":"2024-01-01T00:00:00Z"}]}`, 400,
		map[string]any{"events_with_invalid_fields": map[string]any{"time": []int{1}}}},
	{"float time", "time | integer | Milliseconds since epoch.",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1","time":1.5e12}]}`, 400,
		map[string]any{"events_with_invalid_fields": map[string]any{"time": []int{0}}}},
	{"time beyond int64", "session_id | long; time | integer (64-bit, sim's reading)",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1","time":99999999999999999999}]}`, 400,
		map[string]any{"events_with_invalid_fields": map[string]any{"time": []int{0}}}},
	{"group_properties depth not limited", "Object depth | event_properties, user_properties | 40 layers",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1","group_properties":` + tooDeep + `}]}`, 200, nil},
	{"integer time", "time | integer", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","time":1700000000000}]}`, 200, nil},
	{"first index only", "an array holding the index of the first event with an error",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1"},{"event_type":"e","user_id":"user1","time":"x"},{"event_type":"e","user_id":"user1","time":"y"}]}`, 400,
		map[string]any{"events_with_invalid_fields": map[string]any{"time": []int{1}}}},
	{"depth 40 ok", "Object depth | event_properties, user_properties | 40 layers",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1","event_properties":` + deep + `}]}`, 200, nil},
	{"depth 41", "depth at most 40",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1","user_properties":` + tooDeep + `}]}`, 400,
		map[string]any{"events_with_invalid_fields": map[string]any{"user_properties": []int{0}}}},
	{"event_type number", "event_type | string", `{"api_key":"k","events":[{"event_type":5,"user_id":"user1"}]}`, 400,
		map[string]any{"events_with_invalid_fields": map[string]any{"event_type": []int{0}}}},
	{"price string", "price | float", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","price":"1"}]}`, 400,
		map[string]any{"events_with_invalid_fields": map[string]any{"price": []int{0}}}},
	{"quantity float", "quantity | integer", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","quantity":1.5}]}`, 400,
		map[string]any{"events_with_invalid_fields": map[string]any{"quantity": []int{0}}}},
	{"properties not object", "event_properties | object", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","event_properties":[1]}]}`, 400,
		map[string]any{"events_with_invalid_fields": map[string]any{"event_properties": []int{0}}}},
	{"skip sync not bool", "$skip_user_properties_sync | boolean", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","$skip_user_properties_sync":"yes"}]}`, 400,
		map[string]any{"events_with_invalid_fields": map[string]any{"$skip_user_properties_sync": []int{0}}}},
	{"null fields are absent", "(sim's choice)", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","time":null,"price":null}]}`, 200, nil},
	{"unknown fields pass", "(partner fields: not shown)", `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","x_custom":{"a":1}}]}`, 200, nil},
	{"missing and invalid", "events_with_invalid_fields and events_with_missing_fields",
		`{"api_key":"k","events":[{"event_type":"e","user_id":"user1","time":"x"},{"user_id":"user1"}]}`, 400,
		map[string]any{"error": "Invalid field values on some events",
			"events_with_invalid_fields": map[string]any{"time": []int{0}},
			"events_with_missing_fields": map[string]any{"event_type": []int{1}}}},
}

// TestValidation checks each documented rule over real HTTP, and that a
// rejected request ingests nothing.
func TestValidation(t *testing.T) {
	s, url := start(t, Config{})
	for _, tc := range validationCases {
		t.Run(tc.name, func(t *testing.T) {
			before := s.Count()
			a := wiretest.Post(t, url+"/2/httpapi", []byte(tc.body))
			if a.Status != tc.status {
				t.Fatalf("%s: status %d, want %d; body %s", tc.doc, a.Status, tc.status, a.Body)
			}
			if a.JSON["code"] != float64(tc.status) {
				t.Errorf("code %v, want %d", a.JSON["code"], tc.status)
			}
			mustJSON(t, a, tc.want)
			ingested := s.Count() - before
			if tc.status != 200 && ingested != 0 {
				t.Errorf("a %d ingested %d events", tc.status, ingested)
			}
			if tc.status == 200 && ingested == 0 {
				t.Errorf("a 200 ingested nothing")
			}
		})
	}
}

func TestTooManyEvents(t *testing.T) {
	s, url := start(t, Config{LenientRate: true})
	evs := make([]string, 2000)
	for i := range evs {
		evs[i] = `{"event_type":"e","user_id":"user1"}`
	}
	a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", evs...))
	if a.Status != 400 || a.JSON["error"] != ErrTextInvalidEvent {
		t.Fatalf("2000 events: %d %s", a.Status, a.Body)
	}
	a = wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", evs[:1999]...))
	if a.Status != 200 || s.Count() != 1999 {
		t.Fatalf("1999 events: %d %s, count %d", a.Status, a.Body, s.Count())
	}
}

func TestAPIKeys(t *testing.T) {
	s, url := start(t, Config{APIKeys: []string{"good-key"}})
	a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("bad-key", wiretest.Event("device1", "i1")))
	if a.Status != 400 || string(a.Body) != `{"code":400,"error":"Invalid API key"}` {
		t.Fatalf("bad key: %d %s", a.Status, a.Body)
	}
	a = wiretest.Post(t, url+"/batch", wiretest.Envelope("good-key", wiretest.Event("device1", "i1")))
	if a.Status != 200 {
		t.Fatalf("good key: %d %s", a.Status, a.Body)
	}
	if n := s.Stats().IngestedByKey[KeyLabel("good-key")]; n != 1 {
		t.Fatalf("countFor = %d", n)
	}
}

func TestPayloadTooLarge(t *testing.T) {
	s, url := start(t, Config{})
	pad := func(total int) []byte {
		// {"api_key":"k","events":[{"event_type":"e","user_id":"user1","p":"xxx"}]}
		head := `{"api_key":"k","events":[{"event_type":"e","user_id":"user1","p":"`
		tail := `"}]}`
		return []byte(head + strings.Repeat("x", total-len(head)-len(tail)) + tail)
	}
	for _, tc := range []struct {
		size   int
		gzip   bool
		status int
	}{{999_999, false, 200}, {1_000_000, false, 413}, {999_999, true, 200}, {1_000_000, true, 413}, {3_000_000, true, 413}} {
		body := pad(tc.size)
		var hdr []string
		if tc.gzip {
			body = gz(body)
			hdr = []string{"Content-Encoding", "gzip"}
		}
		before := s.Count()
		a := wiretest.Post(t, url+"/2/httpapi", body, hdr...)
		if a.Status != tc.status {
			t.Fatalf("size %d gzip %v: %d %s", tc.size, tc.gzip, a.Status, a.Body)
		}
		if tc.status == 413 {
			if string(a.Body) != `{"code":413,"error":"Payload too large"}` {
				t.Errorf("413 body %s", a.Body)
			}
			if s.Count() != before {
				t.Errorf("413 ingested")
			}
		}
	}
}

func TestGzipAndRawPreserved(t *testing.T) {
	s, url := start(t, Config{})
	e1 := `{ "event_type" : "e\u00e9", "device_id":"device1","insert_id":"a1", "event_properties":{"z":1.50,"a":[1, 2],"h":"<b>&"} }`
	e2 := `{"user_id":"user-42","event_type":"e2"}`
	a := wiretest.Post(t, url+"/2/httpapi", gz(wiretest.Envelope("k1", e1, e2)), "Content-Encoding", "gzip")
	if a.Status != 200 {
		t.Fatalf("%d %s", a.Status, a.Body)
	}
	mustJSON(t, a, map[string]any{"code": 200, "events_ingested": 2})
	got := s.Events("k1")
	if len(got) != 2 || string(got[0].Raw) != e1 || string(got[1].Raw) != e2 {
		t.Fatalf("raw not preserved: %+v", got)
	}
	if got[0].DeviceID != "device1" || got[0].InsertID != "a1" || got[1].UserID != "user-42" || got[0].EventType != "eé" {
		t.Fatalf("fields: %+v", got)
	}
	if a := wiretest.Post(t, url+"/2/httpapi", []byte("not gzip"), "Content-Encoding", "gzip"); a.Status != 400 {
		t.Fatalf("bad gzip: %d", a.Status)
	}
	reqs := s.Requests()
	if len(reqs) != 2 || !reqs[0].Gzip || reqs[0].Events != 2 || !slices.Contains(reqs[0].Devices, "device1") || !slices.Contains(reqs[0].Users, "user-42") {
		t.Fatalf("request log: %+v", reqs)
	}
	// Read-out over HTTP gives the same raw bytes.
	var out struct{ Events []Ingested }
	wiretest.GetJSON(t, url+"/sim/events?api_key=k1", &out)
	if len(out.Events) != 2 || string(out.Events[0].Raw) != e1 || string(out.Events[1].Raw) != e2 || out.Events[0].InsertID != "a1" {
		t.Fatalf("/sim/events: %+v", out)
	}
}

func TestInvalidPath(t *testing.T) {
	_, url := start(t, Config{})
	a := wiretest.Post(t, url+"/2/nope", wiretest.Envelope("k", wiretest.Event("device1", "a")))
	if a.Status != 400 || a.JSON["error"] != ErrTextInvalidPath {
		t.Fatalf("%d %s", a.Status, a.Body)
	}
}

// TestRecordOfRefusedRequest: a request the validator refuses is logged with
// what its body names as far as it can be read (ids under min_id_length and
// ids that are not strings left out).
func TestRecordOfRefusedRequest(t *testing.T) {
	s, url := start(t, Config{})
	body := `{"api_key":"k","options":{"min_id_length":3},"events":[{"device_id":"dev1"},{"device_id":"ab","user_id":"usr"},{"user_id":7},5]}`
	if a := wiretest.Post(t, url+"/2/httpapi", []byte(body)); a.Status != 400 || a.JSON["error"] != ErrTextInvalidEvent {
		t.Fatalf("%d %s", a.Status, a.Body)
	}
	rec := s.Requests()[0]
	if rec.KeyLabel != KeyLabel("k") || rec.Events != 4 || !slices.Equal(rec.Devices, []string{"dev1"}) || !slices.Equal(rec.Users, []string{"usr"}) {
		t.Errorf("record %+v", rec)
	}
}
