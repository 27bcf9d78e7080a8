package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"
)

// replX replaces every ip by "X", recording what it saw.
func replX(seen *[]string) func(dst, ip []byte) []byte {
	return func(dst, ip []byte) []byte {
		*seen = append(*seen, string(ip))
		return append(dst, `"X"`...)
	}
}

func TestAppendIPsReplaced(t *testing.T) {
	cases := []struct {
		name, event string
		given       bool
		want        string
		seen        []string
	}{
		{"none", ev(``), false, ev(``), nil},
		{"remote only", ev(`"ip":"$remote"`), false, ev(`"ip":"X"`), []string{"$remote"}},
		{"given", ev(`"ip":"10.1.2.3"`), true, ev(`"ip":"X"`), []string{"10.1.2.3"}},
		{"empty string", ev(`"ip":""`), true, ev(`"ip":"X"`), []string{""}},
		{"null", ev(`"ip":null`), false, ev(`"ip":null`), nil},
		{"escaped key and value", ev(`"i\u0070" : "1\u002e2.3.4"`), true, ev(`"i\u0070" : "X"`), []string{"1.2.3.4"}},
		{"every duplicate", `{"ip":"1.1.1.1","event_type":"e","ip":"$remote","user_id":"user-1","ip":"2.2.2.2"}`, true,
			`{"ip":"X","event_type":"e","ip":"X","user_id":"user-1","ip":"X"}`, []string{"1.1.1.1", "$remote", "2.2.2.2"}},
		{"nested ip untouched", ev(`"event_properties":{"ip":"1.2.3.4","a":[{"ip":"5.6.7.8"}]},"user_properties":{"ip":"9.9.9.9"}`), false,
			ev(`"event_properties":{"ip":"1.2.3.4","a":[{"ip":"5.6.7.8"}]},"user_properties":{"ip":"9.9.9.9"}`), nil},
		{"whitespace", "{ \"event_type\" : \"e\" ,\n\t\"ip\" :\"1.2.3.4\" , \"user_id\":\"user-1\" }", true,
			"{ \"event_type\" : \"e\" ,\n\t\"ip\" :\"X\" , \"user_id\":\"user-1\" }", []string{"1.2.3.4"}},
		{"ip key in a value", ev(`"city":"\"ip\":\"1.2.3.4\""`), false, ev(`"city":"\"ip\":\"1.2.3.4\""`), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var req Request
			if err := Parse([]byte(envelope(tc.event)), &req); err != nil {
				t.Fatal(errJSON(err))
			}
			e := &req.Events[0]
			if e.HasGivenIP() != tc.given {
				t.Errorf("HasGivenIP = %v, want %v", e.HasGivenIP(), tc.given)
			}
			var seen []string
			got := AppendIPsReplaced([]byte("prefix:"), e.Raw, replX(&seen))
			if string(got) != "prefix:"+tc.want {
				t.Errorf("got  %s\nwant prefix:%s", got, tc.want)
			}
			if len(seen) != len(tc.seen) {
				t.Fatalf("repl saw %q, want %q", seen, tc.seen)
			}
			for i := range seen {
				if seen[i] != tc.seen[i] {
					t.Errorf("repl saw %q, want %q", seen, tc.seen)
				}
			}
		})
	}
}

func TestAppendIPsReplacedMalformed(t *testing.T) {
	for _, in := range []string{``, `[]`, `{`, `{"ip"`, `{"ip":`, `{"ip":"1.2`, `{"a":[1,`, `{"ip":"1" x`} {
		got := AppendIPsReplaced(nil, []byte(in), func(dst, _ []byte) []byte { return append(dst, `"X"`...) })
		// Nothing is lost or invented: the input comes back, or with a
		// complete ip string replaced.
		if string(got) != in && !bytes.Contains(got, []byte(`"X"`)) {
			t.Errorf("%q -> %q", in, got)
		}
	}
}

// topLevelIPs returns the values of every top-level "ip" member of obj, in
// order, as encoding/json decodes them.
func topLevelIPs(t testing.TB, obj []byte) []any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(obj))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("%q: not an object (%v)", obj, err)
	}
	var ips []any
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("%q: %v", obj, err)
		}
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%q: %v", obj, err)
		}
		if tok == "ip" {
			ips = append(ips, v)
		}
	}
	if _, err := dec.Token(); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("%q: %v", obj, err)
	}
	return ips
}

// FuzzAppendIPsReplaced checks, for every event Parse accepts, that
// HasGivenIP is true exactly when some top-level ip is a string other than
// "$remote", and that AppendIPsReplaced replaces every top-level ip string
// (and nothing else) in Raw and in AppendRewritten's output.
func FuzzAppendIPsReplaced(f *testing.F) {
	f.Add([]byte(ev(`"ip":"1.2.3.4"`)))
	f.Add([]byte(ev(`"ip":"$remote","ip":"1.2.3.4","ip":null`)))
	f.Add([]byte(ev(`"i\u0070":"\u0024remote","event_properties":{"ip":"x"}`)))
	f.Add([]byte(`{"ip":"::1","event_type":"e","device_id":"device-1","insert_id":null,"time":null}`))
	var req Request
	ids := testIDGen()
	f.Fuzz(func(t *testing.T, event []byte) {
		body := append(append([]byte(`{"api_key":"k","events":[`), event...), "]}"...)
		if Parse(body, &req) != nil {
			return
		}
		for i := range req.Events {
			e := &req.Events[i]
			before := topLevelIPs(t, e.Raw)
			given := false
			for _, v := range before {
				if s, ok := v.(string); ok && s != "$remote" {
					given = true
				}
			}
			if e.HasGivenIP() != given {
				t.Fatalf("%s: HasGivenIP %v, ips %q", e.Raw, e.HasGivenIP(), before)
			}
			for _, obj := range [][]byte{e.Raw, e.AppendRewritten(nil, ids, []byte("1"), []byte("192.0.2.1"))} {
				var seen []string
				out := AppendIPsReplaced(nil, obj, replX(&seen))
				want := decodeObject(t, obj)
				if _, ok := want["ip"].(string); ok {
					want["ip"] = "X"
				}
				if got := decodeObject(t, out); !jsonEqual(got, want) {
					t.Fatalf("%s -> %s", obj, out)
				}
				after := topLevelIPs(t, out)
				if len(after) != len(topLevelIPs(t, obj)) {
					t.Fatalf("%s -> %s: ip members changed in number", obj, out)
				}
				n := 0
				for _, v := range after {
					if _, ok := v.(string); ok {
						if v != "X" {
							t.Fatalf("%s -> %s: ip %v left", obj, out, v)
						}
						n++
					}
				}
				if n != len(seen) {
					t.Fatalf("%s: repl called %d times for %d ip strings", obj, len(seen), n)
				}
			}
		}
	})
}

func jsonEqual(a, b map[string]any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}
