package delivery

import (
	"net/url"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

func TestEscape(t *testing.T) {
	for _, s := range []string{"", "abc", `{"a":"b c"}`, "ü€\x00\xff", "-_.~+%&=", strings.Repeat("[,]", 10)} {
		if got, want := escLen([]byte(s)), len(url.QueryEscape(s)); got != want {
			t.Errorf("escLen(%q) = %d, want %d", s, got, want)
		}
		if got, want := string(appendEscaped(nil, []byte(s))), url.QueryEscape(s); got != want {
			t.Errorf("appendEscaped(%q) = %q, want %q", s, got, want)
		}
	}
}

func FuzzEscape(f *testing.F) {
	f.Add([]byte(`{"user_id":"a b","x":[1,2]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		want := url.QueryEscape(string(b))
		if got := string(appendEscaped(nil, b)); got != want {
			t.Fatalf("appendEscaped = %q, want %q", got, want)
		}
		if escLen(b) != len(want) {
			t.Fatalf("escLen = %d, want %d", escLen(b), len(want))
		}
	})
}

// TestPack: requests fill up to each limit and never pass it; the body
// built is exactly what Pack counted, and it decodes to the records.
func TestPack(t *testing.T) {
	weight := func(b []byte) int { return len(b) % 7 }
	var recs []spool.Record
	for i := range 50 {
		recs = append(recs, spool.Record{Data: []byte(`{"user_id":"u` + strings.Repeat("x", i) + `"}`)})
	}
	key := spool.LaneKey{APIKey: "k y"}
	tests := []struct {
		name                        string
		maxItems, maxBody, maxWeigh int
	}{
		{"items", 10, 1 << 20, 0},
		{"weight", 1000, 1 << 20, 20},
		{"body", 1000, 900, 0},
		{"all", 7, 700, 15},
		{"tiny body still one", 100, 10, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &Form{MaxItems: tc.maxItems, MaxBodyBytes: tc.maxBody, MaxWeight: tc.maxWeigh, Weight: weight, Field: "mapping"}
			for start := 0; start < len(recs); {
				n := f.Pack(key, recs[start:])
				if n <= 0 {
					t.Fatalf("no progress at %d", start)
				}
				end := start + n
				body := f.Body(nil, key, recs[start:end])
				w := 0
				for _, r := range recs[start:end] {
					w += weight(r.Data)
				}
				if n > 1 && (n > tc.maxItems || len(body) >= tc.maxBody || (tc.maxWeigh > 0 && w > tc.maxWeigh)) {
					t.Fatalf("request [%d,%d): %d items, %d bytes, weight %d", start, end, n, len(body), w)
				}
				if end < len(recs) && n < tc.maxItems {
					// the next record must not have fitted
					more := f.Body(nil, key, recs[start:end+1])
					if len(more) < tc.maxBody && (tc.maxWeigh == 0 || w+weight(recs[end].Data) <= tc.maxWeigh) {
						t.Fatalf("request [%d,%d) stopped early (%d bytes with the next)", start, end, len(more))
					}
				}
				v, err := url.ParseQuery(string(body))
				if err != nil || v.Get("api_key") != "k y" {
					t.Fatalf("body %q: %v", body, err)
				}
				var parts []string
				for _, r := range recs[start:end] {
					parts = append(parts, string(r.Data))
				}
				if v.Get("mapping") != "["+strings.Join(parts, ",")+"]" {
					t.Fatalf("mapping %q", v.Get("mapping"))
				}
				start = end
			}
		})
	}
}

func TestBodyOverhead(t *testing.T) {
	f := &Form{Field: "identification"}
	body := f.Body(nil, spool.LaneKey{APIKey: "k&=y"}, []spool.Record{{Data: []byte("{}")}})
	if got := BodyOverhead("k&=y", "identification") + 6; got != len(body) {
		t.Fatalf("BodyOverhead+record = %d, body %d", got, len(body))
	}
}

func TestConfigValidate(t *testing.T) {
	ok := FormConfig{Name: "x", Lanes: spool.KindUserMap, URL: func(string) string { return "" }, Kind: &Form{Field: "f", MaxItems: 1, MaxBodyBytes: 1},
		Store: storage.NewLocal(nil, nil)}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*FormConfig){
		"name":   func(c *FormConfig) { c.Name = "" },
		"lanes":  func(c *FormConfig) { c.Lanes = spool.KindEvents },
		"kind":   func(c *FormConfig) { c.Kind = nil },
		"url":    func(c *FormConfig) { c.URL = nil },
		"store":  func(c *FormConfig) { c.Store = nil },
		"field":  func(c *FormConfig) { c.Kind = &Form{MaxItems: 1, MaxBodyBytes: 1} },
		"items":  func(c *FormConfig) { c.Kind = &Form{Field: "f", MaxBodyBytes: 1} },
		"body":   func(c *FormConfig) { c.Kind = &Form{Field: "f", MaxItems: 1} },
		"maxage": func(c *FormConfig) { c.MaxAge = -1 },
	} {
		c := ok
		mut(&c)
		if c.Validate() == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
