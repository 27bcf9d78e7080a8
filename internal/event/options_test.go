package event

import (
	"strings"
	"testing"
)

// Options that mean the same make one lane (equal Options);
// options that differ in meaning stay apart.
func TestOptionsCanonical(t *testing.T) {
	parse := func(opts string) string {
		t.Helper()
		body := `{"api_key":"k","events":[{"event_type":"a","device_id":"device-1"}]`
		if opts != "-" {
			body += `,"options":` + opts
		}
		var req Request
		if err := Parse([]byte(body+"}"), &req); err != nil {
			t.Fatalf("%s: %v", opts, errJSON(err))
		}
		if req.Options == nil {
			return "<nil>"
		}
		return string(req.Options)
	}
	for _, tc := range []struct {
		want string
		in   []string
	}{
		{"<nil>", []string{"-", `null`, `{}`, ` { } `, `{"min_id_length":null}`, `{"min_id_length":5}`, `{"min_id_length" : 5 }`, `{"min_id_length":7,"min_id_length":5}`}},
		{`{"min_id_length":3}`, []string{`{"min_id_length":3}`, `{ "min_id_length":3 }`, `{"min_id_length":5,"min_id_length":3}`, `{"min_\u0069d_length":3}`}},
		{`{"junk":"1"}`, []string{`{"junk":"1"}`, `{"junk":"1" }`, `{ "junk" : "1"}`, `{"junk":"\u0031"}`, `{"junk":"1","min_id_length":5}`, `{"junk":"0","junk":"1"}`}},
		{`{"a":{"x":1,"y":[2,{"p":"<"}]},"b":true,"min_id_length":4}`, []string{
			`{"min_id_length":4,"b":true,"a":{"y":[2,{"p":"<"}],"x":1}}`,
			`{"b" :true,"a":{"x":1 ,"y":[ 2,{"p":"\u003c"}]},"min_id_length":4}`,
		}},
		{`{"n":1.0}`, []string{`{"n":1.0}`, `{ "n":1.0 }`}},
		{`{"n":1}`, []string{`{"n":1}`}},
	} {
		for _, in := range tc.in {
			if got := parse(in); got != tc.want {
				t.Errorf("options %s: canonical %s, want %s", in, got, tc.want)
			}
		}
	}
}

// An api_key longer than MaxAPIKeyBytes is refused as the
// upstream refuses a bad key, 400 "Invalid API key"; one at the bound is
// taken. An escaped key counts unescaped.
func TestAPIKeyBound(t *testing.T) {
	ev := `,"events":[{"event_type":"a","device_id":"device-1"}]}`
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{strings.Repeat("a", 32), true},
		{strings.Repeat("a", MaxAPIKeyBytes), true},
		{strings.Repeat("a", MaxAPIKeyBytes+1), false},
		{strings.Repeat(`\u0061`, MaxAPIKeyBytes), true},
		{strings.Repeat(`\u0061`, MaxAPIKeyBytes+1), false},
		{strings.Repeat("a", 5<<20), false},
	} {
		var req Request
		err := Parse([]byte(`{"api_key":"`+tc.key+`"`+ev), &req)
		switch {
		case tc.ok && err != nil:
			t.Errorf("key of %d bytes: %v", len(tc.key), errJSON(err))
		case !tc.ok && (err == nil || err.Status != 400 || err.Msg != msgInvalidAPIKey):
			t.Errorf("key of %d bytes: %v, want 400 Invalid API key", len(tc.key), err)
		}
	}
}

func BenchmarkParseWithOptions(b *testing.B) {
	for _, opts := range []string{`{"min_id_length":3}`, `{"platform":"web","min_id_length":3}`} {
		body := []byte(`{"api_key":"0123456789abcdef0123456789abcdef","options":` + opts +
			`,"events":[{"event_type":"a","device_id":"device-1","event_properties":{"x":1}}]}`)
		b.Run(opts, func(b *testing.B) {
			b.ReportAllocs()
			var req Request
			for b.Loop() {
				if err := Parse(body, &req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzOptionsCanonical: the canonical options are a fixed point (parsing a
// request with them gives them back) and keep min_id_length's meaning.
func FuzzOptionsCanonical(f *testing.F) {
	for _, s := range []string{`{}`, `{"min_id_length":3}`, `{"junk":"1" }`, `{"a":{"b":[1,{"c":null}]},"min_id_length":null}`,
		`{"x":"\u00e9\n","min_id_length":0}`, `{"n":1e3,"m":-0.5}`, `{"k":1,"k":2}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, opts string) {
		body := func(o string) []byte {
			return []byte(`{"api_key":"k","options":` + o + `,"events":[{"event_type":"a","device_id":"device-1"}]}`)
		}
		var req Request
		if Parse(body(opts), &req) != nil {
			return
		}
		canon, minLen := string(req.Options), req.MinIDLength
		again := canon
		if again == "" {
			again = "null"
		}
		var req2 Request
		if err := Parse(body(again), &req2); err != nil {
			t.Fatalf("canonical options %s of %s refused: %v", canon, opts, errJSON(err))
		}
		if string(req2.Options) != canon || req2.MinIDLength != minLen {
			t.Fatalf("options %s: canonical %s (min %d), then %s (min %d)", opts, canon, minLen, req2.Options, req2.MinIDLength)
		}
	})
}

// A reused Request canonicalizes a repeated options object once; the result
// still follows each request's own options.
func TestOptionsReusedRequest(t *testing.T) {
	var req Request
	for i, tc := range []struct{ opts, want string }{
		{`{"a":1,"b":2}`, `{"a":1,"b":2}`},
		{`{"a":1,"b":2}`, `{"a":1,"b":2}`},
		{"", ""},
		{`{"a":1,"b":2}`, `{"a":1,"b":2}`},
		{`{"min_id_length":3}`, `{"min_id_length":3}`},
		{`{"a":1,"b":2}`, `{"a":1,"b":2}`},
		{`{"b":2, "a":1}`, `{"a":1,"b":2}`},
		{`{"b":3,"a":1}`, `{"a":1,"b":3}`},
		{`{"b":3,"a":1,"min_id_length":7}`, `{"a":1,"b":3,"min_id_length":7}`},
	} {
		body := `{"api_key":"k","events":[{"event_type":"a","device_id":"device-1"}]`
		if tc.opts != "" {
			body += `,"options":` + tc.opts
		}
		if err := Parse([]byte(body+"}"), &req); err != nil {
			t.Fatal(errJSON(err))
		}
		if string(req.Options) != tc.want {
			t.Errorf("%d: options %s: %s, want %s", i, tc.opts, req.Options, tc.want)
		}
	}
}
