package event

import (
	"fmt"
	"strings"
	"testing"
)

// TestEventKey checks eventKey against ScanString and lookupField (the
// slow path it shortcuts) for every field name, names one byte off, and
// escaped names, with the key's end at every distance from the end of the
// buffer (so that both the word path and the fallback run).
func TestEventKey(t *testing.T) {
	keys := []string{``, `a`, `ip`, `IP`, `tim`, `timE`, `times`, `event_propertieS`, `event_propertiesx`,
		`0123456789abcdef`, `0123456789abcde`, `0123456789abcdefg`, `user\u005fid`, `\u0075ser_id`,
		`event_propertie\u0073`, `us"er_id`, `user_id\\`, "user\x01id", `\uZZZZ`}
	for _, name := range fieldNames {
		keys = append(keys, name, name[:len(name)-1], name+"_", "_"+name, strings.ToUpper(name[:1])+name[1:])
		for _, k := range []int{0, len(name) / 2, len(name) - 1} {
			// the same name with one byte escaped
			keys = append(keys, name[:k]+fmt.Sprintf(`\u%04x`, name[k])+name[k+1:])
		}
	}
	for _, key := range keys {
		for pad := range 24 {
			b := []byte(`"` + key + `"` + strings.Repeat(":", pad))
			end, f := eventKey(b, 0)
			wantEnd, esc := ScanString(b, 0)
			wantF := -1
			if wantEnd >= 0 {
				k := b[1 : wantEnd-1]
				if esc {
					k = appendUnescaped(nil, k)
				}
				wantF = lookupField(k)
			}
			if end != wantEnd || (end >= 0 && f != wantF) {
				t.Errorf("eventKey(%q) = %d, %d; want %d, %d", b, end, f, wantEnd, wantF)
			}
		}
	}
}

// TestWordTable makes sure the word table holds every name it can (a field
// it missed would only be found by the slow path, silently), and that a key
// that hashes to a field's slot but differs in either word is no field.
func TestWordTable(t *testing.T) {
	collisions := 0
	for f, name := range fieldNames {
		lo, hi := nameWords(name)
		got := byWords.lookup(lo, hi)
		if len(name) <= shortFieldLen && got != f || len(name) > shortFieldLen && got != -1 {
			t.Errorf("byWords.lookup(%q) = %d, want %d", name, got, f)
		}
		if len(name) > shortFieldLen {
			continue
		}
		for _, k := range []int{0, len(name) - 1} { // in lo, and in hi if the name has 9 bytes or more
			for c := byte(' '); c <= '~'; c++ {
				other := name[:k] + string(c) + name[k+1:]
				olo, ohi := nameWords(other)
				if other == name || byWords.hash(olo, ohi) != byWords.hash(lo, hi) {
					continue
				}
				collisions++
				if got := byWords.lookup(olo, ohi); got != lookupField([]byte(other)) {
					t.Errorf("byWords.lookup(%q) = %d, want %d", other, got, lookupField([]byte(other)))
				}
			}
		}
	}
	if collisions < 20 {
		t.Errorf("only %d keys collided with a field name: the test is too weak", collisions)
	}
}

func TestPlanFields(t *testing.T) {
	for f, name := range map[int]string{fEventType: "event_type", fEventProps: "event_properties", fUserProps: "user_properties"} {
		if fieldNames[f] != name {
			t.Errorf("field %d is %q, want %q", f, fieldNames[f], name)
		}
	}
}

// TestPlanKeys: PlanKeys finds the keys of event_type, event_properties
// and user_properties where they are, 0 when absent, -1 when repeated.
func TestPlanKeys(t *testing.T) {
	for _, tc := range []struct {
		ev   string
		want [3]string // the bytes at each offset, "" for 0, "dup" for -1
	}{
		{`{"device_id":"d-12345","event_type":"a","event_properties":{"x":1},"user_properties":{"y":2}}`,
			[3]string{`"event_type"`, `"event_properties"`, `"user_properties"`}},
		{`{"user_properties":{},"event_type":"a", "event_properties" :null,"device_id":"d-12345"}`,
			[3]string{`"event_type"`, `"event_properties"`, `"user_properties"`}},
		{`{"device_id":"d-12345","event_type":"a"}`, [3]string{`"event_type"`, "", ""}},
		{`{"device_id":"d-12345","event_type":"a","event_properties":{},"event_properties":{}}`, [3]string{`"event_type"`, "dup", ""}},
		{`{"device_id":"d-12345","event\u005ftype":"a","user_properties":{"event_type":1}}`, [3]string{`"event\u005ftype"`, "", `"user_properties"`}},
		{`{"device_id":"d-12345","event_type":"a","event_type":"b","user_properties":{},"user_properties":{}}`, [3]string{"dup", "", "dup"}},
	} {
		var req Request
		if err := Parse([]byte(`{"api_key":"k","events":[`+tc.ev+`]}`), &req); err != nil {
			t.Fatalf("%s: %v", tc.ev, err)
		}
		e := &req.Events[0]
		for k, at := range e.PlanKeys() {
			got := ""
			switch {
			case at < 0:
				got = "dup"
			case at > 0:
				got = string(e.Raw[at:])
			}
			if !strings.HasPrefix(got, tc.want[k]) || (tc.want[k] == "") != (got == "") {
				t.Errorf("%s: key %d at %d (%.20q), want %q", tc.ev, k, at, got, tc.want[k])
			}
		}
	}
}
