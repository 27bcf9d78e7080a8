package event

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// refParse is an independent, slow implementation of Parse's rules on top of
// encoding/json (decode into maps, last duplicate key wins). It is the fuzz
// oracle: Parse must give the same verdict and the same error body.
func refParse(body []byte) (*Error, []refEvent) {
	if len(bytes.Trim(body, " \t\r\n")) == 0 {
		return newError(msgMissingBody), nil
	}
	if !json.Valid(body) {
		return newError(msgInvalidJSON), nil
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		panic(err) // json.Valid said yes
	}
	env, ok := v.(map[string]any)
	if !ok {
		return newError(msgInvalidJSON), nil
	}
	minLen := DefaultMinIDLength
	if o, ok := env["options"]; ok && o != nil {
		om, ok := o.(map[string]any)
		if !ok {
			return newError(msgInvalidJSON), nil
		}
		if m, ok := om["min_id_length"]; ok && m != nil {
			n, ok := m.(json.Number)
			if !ok || !intRE.MatchString(string(n)) {
				return newError(msgInvalidJSON), nil
			}
			x, err := strconv.ParseInt(string(n), 10, 64)
			if err != nil || x < 0 || x > math.MaxInt32 {
				return newError(msgInvalidJSON), nil
			}
			minLen = int(x)
		}
	}
	switch k, ok := env["api_key"].(string); {
	case ok && k != "":
	case ok || env["api_key"] == nil:
		return newMissingField("api_key"), nil
	default:
		return newError(msgInvalidAPIKey), nil
	}
	evs, ok := env["events"].([]any)
	switch {
	case !ok && env["events"] != nil:
		return newError(msgInvalidEvent), nil
	case len(evs) == 0:
		return newMissingField("events"), nil
	}
	var out []map[string]any
	for _, e := range evs {
		m, ok := e.(map[string]any)
		if !ok {
			return newError(msgInvalidEvent), nil
		}
		out = append(out, m)
	}
	bad := map[string][]int{}
	missing := map[string][]int{}
	first := func(m map[string][]int, f string, i int) {
		if _, ok := m[f]; !ok {
			m[f] = []int{i}
		}
	}
	var refs []refEvent
	for i, m := range out {
		for f := range numFields {
			name := fieldNames[f]
			val, ok := m[name]
			if !ok || val == nil {
				continue
			}
			valid := true
			switch fieldKinds[f] {
			case kString:
				_, valid = val.(string)
			case kInt:
				n, ok := val.(json.Number)
				valid = ok && intRE.MatchString(string(n))
				if valid {
					_, err := strconv.ParseInt(string(n), 10, 64)
					valid = err == nil
				}
			case kNumber:
				_, valid = val.(json.Number)
			case kObject:
				_, valid = val.(map[string]any)
			case kPropTree:
				_, valid = val.(map[string]any)
				valid = valid && refDepth(val) <= maxPropDepth
			case kBool:
				_, valid = val.(bool)
			}
			if !valid {
				first(bad, name, i)
			}
		}
		switch t, ok := m["event_type"].(string); {
		case ok && t != "":
		case ok || m["event_type"] == nil:
			first(missing, "event_type", i)
		}
		dev, devOK := m["device_id"].(string)
		usr, usrOK := m["user_id"].(string)
		devBad := m["device_id"] != nil && !devOK
		usrBad := m["user_id"] != nil && !usrOK
		devShort, usrShort := false, false
		if devOK && dev != "" && strings.Trim(dev, "0-") == "" && strings.Contains(dev, "0") {
			first(bad, "device_id", i)
			devBad = true
		} else if devOK && dev != "" && utf8.RuneCountInString(dev) < minLen {
			devShort = true
		}
		if usrOK && usr != "" && utf8.RuneCountInString(usr) < minLen {
			usrShort = true
		}
		hasDev := devOK && dev != "" && !devShort && !devBad
		hasUsr := usrOK && usr != "" && !usrShort
		if !hasDev && !hasUsr && !devBad && !usrBad {
			if !devShort && !usrShort {
				first(missing, "user_id", i)
				first(missing, "device_id", i)
			}
			if devShort {
				first(bad, "device_id", i)
			}
			if usrShort {
				first(bad, "user_id", i)
			}
		}
		re := refEvent{obj: m}
		if hasDev {
			re.dev = &dev
		}
		if hasUsr {
			re.usr = &usr
		}
		refs = append(refs, re)
	}
	if len(bad) == 0 && len(missing) == 0 {
		return nil, refs
	}
	err := &Error{Status: 400, Msg: msgMissingField}
	if len(bad) > 0 {
		err.Msg = msgInvalidFields
		err.InvalidFields = bad
	}
	if len(missing) > 0 {
		err.MissingFields = missing
	}
	return err, nil
}

// refEvent is an accepted event as the oracle sees it: the decoded object
// and the ids Parse must report (nil: none).
type refEvent struct {
	obj      map[string]any
	dev, usr *string
}

var intRE = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

func refDepth(v any) int {
	d := 0
	switch v := v.(type) {
	case map[string]any:
		for _, c := range v {
			d = max(d, refDepth(c))
		}
		return d + 1
	case []any:
		for _, c := range v {
			d = max(d, refDepth(c))
		}
		return d + 1
	}
	return 0
}

// jsonString is how encoding/json decodes bytes that Parse keeps raw: each
// invalid UTF-8 byte becomes U+FFFD.
func jsonString(b []byte) string { return string([]rune(string(b))) }

func decodeObject(t testing.TB, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	if dec.More() {
		t.Fatalf("trailing data after %q", b)
	}
	return m
}

// checkParse runs Parse against the oracle and checks the rewrites.
func checkParse(t testing.TB, body []byte, req *Request) {
	t.Helper()
	got := Parse(body, req)
	want, evs := refParse(body)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Parse(%q):\n got %s\nwant %s", body, errJSON(got), errJSON(want))
	}
	if got != nil {
		return
	}
	if !json.Valid(body) {
		t.Fatalf("accepted invalid JSON %q", body)
	}
	if len(req.Events) != len(evs) {
		t.Fatalf("%d events, want %d", len(req.Events), len(evs))
	}
	env := decodeObject(t, body)
	if jsonString(req.APIKey) != env["api_key"].(string) {
		t.Fatalf("APIKey %q, want %q", req.APIKey, env["api_key"])
	}
	ids := testIDGen()
	remote := []byte(`10.0.0."1\`)
	for i := range req.Events {
		e := &req.Events[i]
		m := decodeObject(t, e.Raw)
		if !reflect.DeepEqual(m, evs[i].obj) {
			t.Fatalf("event %d Raw %q decodes to %v, want %v", i, e.Raw, m, evs[i].obj)
		}
		for _, c := range []struct {
			name string
			got  []byte
			want *string
		}{{"device_id", e.DeviceID, evs[i].dev}, {"user_id", e.UserID, evs[i].usr}} {
			if (c.want != nil) != (c.got != nil) || c.want != nil && jsonString(c.got) != *c.want {
				t.Fatalf("event %d %s = %q, want %v", i, c.name, c.got, c.want)
			}
		}
		if len(e.OrderKey(nil)) < 3 {
			t.Fatalf("event %d: short OrderKey %q", i, e.OrderKey(nil))
		}
		if e.HasInsertID != (m["insert_id"] != nil) || e.HasTime != (m["time"] != nil) {
			t.Fatalf("event %d: HasInsertID %v HasTime %v for %v", i, e.HasInsertID, e.HasTime, m)
		}
		out := e.AppendRewritten(nil, ids, []byte("1234"), remote)
		rm := decodeObject(t, out)
		if m["insert_id"] == nil {
			id, ok := rm["insert_id"].(string)
			if !ok || !strings.HasPrefix(id, string(ids.prefix[:])) {
				t.Fatalf("event %d: rewritten insert_id %v in %s", i, rm["insert_id"], out)
			}
			m["insert_id"] = id
		}
		if m["time"] == nil {
			m["time"] = json.Number("1234")
		}
		if m["ip"] == "$remote" {
			m["ip"] = string(remote)
		}
		if !reflect.DeepEqual(rm, m) {
			t.Fatalf("event %d: rewritten %s decodes to\n%v\nwant\n%v", i, out, rm, m)
		}
	}
}

func errJSON(e *Error) string {
	if e == nil {
		return "<accepted>"
	}
	return fmt.Sprintf("%d %s", e.Status, e.AppendJSON(nil))
}

func FuzzParse(f *testing.F) {
	for _, tc := range parseCases {
		f.Add([]byte(tc.body))
	}
	f.Add([]byte(envelope(realisticEvents(3)...)))
	f.Add([]byte(`{"api_key":"k","events":[{"event_type":"e","user_id":"u\ud800\udc00xyz","insert\u005fid":null,"time":null,"ip":"\u0024remote"}]}`))
	f.Add([]byte(`{"api_key":"k\"","events":[{"event_type":"e","device_id":"\u00e9\u00e9\u00e9\u00e9\u00e9","ip":"$remote","time":null,"time":null}],"options":{"min_id_length":5}}`))
	f.Add([]byte("{\"api_key\":\"k\",\"events\":[{\"event_type\":\"\xff\",\"user_id\":\"\xff\xfe\xfd\xfc\xfb\"}]}"))
	var req Request
	f.Fuzz(func(t *testing.T, body []byte) {
		checkParse(t, body, &req)
	})
}

// FuzzParseEvents fuzzes the events and options inside a fixed envelope,
// so that mutations are spent on event fields rather than on the framing.
func FuzzParseEvents(f *testing.F) {
	f.Add([]byte(realisticEvent(1)), []byte(`{"min_id_length":5}`))
	f.Add([]byte(realisticEvent(2)+","+ev(`"time":null,"insert_id":null`)), []byte(`null`))
	f.Add([]byte(`{"event_type":"e","user_id":"\u00e9\ud83d\ude00\u00e9","device_id":"0-0"},{"event_type":"e","device_id":"ab\ud800c"}`), []byte(`{"min_id_length":3}`))
	f.Add([]byte(`{"event_type":"$identify","user_id":"u\"ser1","user_properties":{"$set":{"a":[1,2,{"b":null}]}},"ip":"$remote","price":-1.5e3,"quantity":2}`), []byte(`{}`))
	var req Request
	f.Fuzz(func(t *testing.T, events, options []byte) {
		body := make([]byte, 0, len(events)+len(options)+64)
		body = append(body, `{"api_key":"k","events":[`...)
		body = append(body, events...)
		body = append(body, `],"options":`...)
		body = append(body, options...)
		body = append(body, '}')
		checkParse(t, body, &req)
	})
}

// FuzzPropMembers: with PlanMembers, Parse reaches the same verdict and
// events as without, and the members it records are the property
// objects' own, each key a string and each value ending where skipValue
// ends it.
func FuzzPropMembers(f *testing.F) {
	f.Add([]byte(realisticEvent(1)))
	f.Add([]byte(realisticEvent(2) + "," + ev(`"event_properties":{ "a" : [1,{"b":2}] , "c":"d" },"user_properties":{}`)))
	f.Add([]byte(`{"event_type":"$identify","user_id":"u\"ser1","user_properties":{"$set":{"a":[1,2,{"b":null}]}},"ip":"$remote","price":-1.5e3,"quantity":2}`))
	f.Add([]byte(ev(`"event_properties":{"a":1,}`)))
	f.Add([]byte(ev(`"event_properties":{"a":1},"event_properties":{"b":2}`)))
	f.Add([]byte(ev(`"event_properties":` + strings.Repeat(`{"a":`, 40) + `1` + strings.Repeat(`}`, 40))))
	f.Add([]byte(ev(`"event_properties":` + strings.Repeat(`{"a":`, 41) + `1` + strings.Repeat(`}`, 41))))
	var plain, rec Request
	rec.PlanMembers = true
	f.Fuzz(func(t *testing.T, events []byte) {
		body := append(append([]byte(`{"api_key":"k","events":[`), events...), "]}"...)
		e1, e2 := Parse(body, &plain), Parse(body, &rec)
		if errJSON(e1) != errJSON(e2) {
			t.Fatalf("without members %s, with %s\n%s", errJSON(e1), errJSON(e2), body)
		}
		if e1 != nil {
			return
		}
		if len(plain.Events) != len(rec.Events) {
			t.Fatalf("%d events, %d with members", len(plain.Events), len(rec.Events))
		}
		var sk skipper
		for i := range rec.Events {
			e := &rec.Events[i]
			if !bytes.Equal(e.Raw, plain.Events[i].Raw) {
				t.Fatalf("event %d: %s, with members %s", i, plain.Events[i].Raw, e.Raw)
			}
			for k := range 2 {
				ms, ok := rec.PropMembers(e, k)
				if _, ok1 := plain.PropMembers(&plain.Events[i], k); ok1 {
					t.Fatal("members recorded without PlanMembers")
				}
				if !ok {
					continue
				}
				at := e.PlanKeys()[k+1]
				prev := int(at)
				for _, m := range ms {
					if int(m.Key) <= prev || e.Raw[m.Key] != '"' {
						t.Fatalf("event %d: member key at %d after %d: %s", i, m.Key, prev, e.Raw)
					}
					if end, _ := sk.skipValue(e.Raw, int(m.From), 4); end != int(m.To) {
						t.Fatalf("event %d: member value %d-%d, skipValue ends it at %d: %s", i, m.From, m.To, end, e.Raw)
					}
					prev = int(m.To)
				}
			}
		}
	})
}
