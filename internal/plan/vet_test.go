package plan

import (
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/benchtest"
	"github.com/svcrelay/relay/internal/event"
)

// vetted is clean given ev as the ingest gives it: parsed, with the
// members of its property objects recorded.
func vetted(t testing.TB, clean func(*event.Request, *event.Event) bool, ev []byte) bool {
	t.Helper()
	req := event.Request{PlanMembers: true}
	if err := event.Parse([]byte(`{"api_key":"k","events":[`+string(ev)+`]}`), &req); err != nil {
		t.Fatalf("%s: %v", ev, err)
	}
	return clean(&req, &req.Events[0])
}

// vetPlan is benchPlan with the rules benchPlan's events do not exercise:
// a required property of user-defined type, an array of enum, a boolean, a
// number enum, an any-typed one.
func vetPlan() *Plan {
	p := benchPlan()
	p.EventTypes = append(p.EventTypes, "Checkout")
	p.Overrides["Checkout"] = []Property{{Name: "total", Type: "number", Required: true},
		{Name: "sizes", Type: "enum", Enum: []string{"s", "m", "l"}, Array: true}, {Name: "gift", Type: "boolean"},
		{Name: "level", Type: "enum", Enum: []string{"1", "2"}}, {Name: "extra"}, {Name: "items"}}
	return p
}

// vetSeeds are events for FuzzVet: clean and not, with the members the
// check reads in every order, twice, escaped, spaced, absent.
var vetSeeds = []string{
	`{"device_id":"d-12345","event_type":"Checkout","event_properties":{"total":3,"sizes":["s","m"],"gift":true,"level":2}}`,
	`{"device_id":"d-12345","event_properties":{"total":3},"event_type":"Checkout"}`,
	`{"device_id":"d-12345","event_type":"Checkout","event_properties":{"total":null}}`,
	`{"device_id":"d-12345","event_type":"Checkout","event_properties":{"sizes":["xl"],"total":1}}`,
	`{"device_id":"d-12345","event_type":"Checkout","event_properties":{"total":1,"level":3}}`,
	`{"device_id":"d-12345","event_type":"Checkout"}`,
	`{"device_id":"d-12345","event_type":"Checkout","event_properties":{"total":1},"event_properties":{}}`,
	`{"device_id":"d-12345","event_type":"Search","event_type":"Checkout","event_properties":{"total":1}}`,
	`{"device_id":"d-12345","event\u005ftype":"Nope","event_type":"Search"}`,
	`{"device_id":"d-12345","event_type":"Search","event\u005fproperties":{"bad":1}}`,
	`{"device_id":"d-12345","event_type":"Search","user\u005fproperties":{"bad":1}}`,
	`{"device_id":"d-12345", "event_type" : "Search" , "event_properties" : { "query" : "q" } , "user_properties" : { "beta" : true } }`,
	`{"device_id":"d-12345","event_type":"Se\u0061rch","event_properties":{"qu\u0065ry":"q"}}`,
	`{"device_id":"d-12345","event_type":"$identify","user_properties":{"$set":{"plan":"free"},"$unset":{"beta":"-"}}}`,
	`{"device_id":"d-12345","event_type":"Search","user_properties":{"$set":{"plan":"gold"}}}`,
	`{"device_id":"d-12345","event_type":"Search","user_properties":{"nope":1}}`,
	`{"device_id":"d-12345","event_type":"Search","user_properties":{"beta":true,"plan":"gold"}}`,
	`{"device_id":"d-12345","user_properties":{"plan":"free"},"event_type":"Search","event_properties":{"query":"q"}}`,
	`{"device_id":"d-12345","event_type":"Unplanned"}`,
	`{"device_id":"d-12345","event_type":"Checkout","event_properties":{"total":1,"items":{"a":[1,{"b":2}]},"extra":{"x":[1]}}}`,
	`{"device_id":"d-12345","event_type":"Checkout","ip":"$remote","insert_id":null,"time":null,"event_properties":{"total":1}}`,
}

// FuzzVet: the ingest's verdict (cleanAt, from the parser's key offsets)
// is the delivery check's on the record as spooled (the event rewritten:
// an insert_id, a time and the ip), for every event the parser accepts.
func FuzzVet(f *testing.F) {
	for _, s := range vetSeeds {
		f.Add(s)
	}
	for i := range 8 {
		f.Add(benchtest.SDKEvent(i))
	}
	c, err := compile(vetPlan())
	if err != nil {
		f.Fatal(err)
	}
	ids := event.NewIDGen()
	// Both ways cleanAt is given an event: with its members recorded by
	// the parser, and without (it walks the property objects itself).
	var keys, members event.Request
	members.PlanMembers = true
	f.Fuzz(func(t *testing.T, ev string) {
		if strings.Contains(ev, `"api_key"`) {
			return // not an event of this envelope
		}
		body := []byte(`{"api_key":"k","events":[` + ev + `]}`)
		if event.Parse(body, &keys) != nil || event.Parse(body, &members) != nil {
			return
		}
		for i := range members.Events {
			e := &members.Events[i]
			rec := e.AppendRewritten(nil, ids, []byte("1795682223335"), []byte("192.0.2.1"))
			want := c.isClean(rec)
			if got := c.cleanAt(&members, e); got != want {
				t.Fatalf("cleanAt with members %v, the check on the record %v\nevent  %s\nrecord %s\nkeys %v", got, want, e.Raw, rec, e.PlanKeys())
			}
			if got := c.cleanAt(&keys, &keys.Events[i]); got != want {
				t.Fatalf("cleanAt without members %v, the check on the record %v\nevent  %s\nrecord %s", got, want, e.Raw, rec)
			}
		}
	})
}

// TestVetSeeds: the seeds give the verdicts they were written for, so that
// FuzzVet's corpus covers both sides and the full check's fallback.
func TestVetSeeds(t *testing.T) {
	c, err := compile(vetPlan())
	if err != nil {
		t.Fatal(err)
	}
	want := []bool{true, true, false, false, false, false, false, true, true, true, true, true, true, true, false, false, false, true, false, true, true}
	for i, s := range vetSeeds {
		if got := vetted(t, c.cleanAt, []byte(s)); got != want[i] {
			t.Errorf("seed %d: clean %v, want %v\n%s", i, got, want[i], s)
		}
	}
}

// TestMemberWords: the parser gives a short key's words as wordsOf does
// (a wrong word would only send the key to the map, so no verdict shows it).
func TestMemberWords(t *testing.T) {
	ev := `{"device_id":"d-12345","event_type":"Search","event_properties":{"":1,"q":2,"sixteen_bytes_16":3,"seventeen_bytes_17":4,"a\u0062":5},` +
		`"user_properties":{"plan":"free","beta":true}}` // beta: too near the body's end
	req := event.Request{PlanMembers: true}
	if err := event.Parse([]byte(`{"api_key":"k","events":[`+ev+`]}`), &req); err != nil {
		t.Fatal(err)
	}
	e := &req.Events[0]
	for k, want := range [][]string{{"", "q", "sixteen_bytes_16", "-", "-"}, {"plan", "-"}} {
		ms, _ := req.PropMembers(e, k)
		if len(ms) != len(want) {
			t.Fatalf("object %d: %d members, want %d", k, len(ms), len(want))
		}
		for i, m := range ms {
			if want[i] == "-" {
				if m.Short != 0 {
					t.Errorf("member %d of %d: short, want not", i, k)
				}
			} else if got := (keyWords{m.Lo, m.Hi}); got != wordsOf(want[i]) {
				t.Errorf("member %d of %d: words %v, want those of %q", i, k, got, want[i])
			}
		}
	}
}
