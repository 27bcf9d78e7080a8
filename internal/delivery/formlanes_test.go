package delivery

import (
	"net/url"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/spool"
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
// built is exactly what pack counted, and it decodes to the records.
func TestPack(t *testing.T) {
	rec := func(s string, w int) item {
		return item{rec: spool.Record{Data: []byte(s)}, esc: escLen([]byte(s)), weight: w}
	}
	var items []item
	for i := range 50 {
		items = append(items, rec(`{"user_id":"u`+strings.Repeat("x", i)+`"}`, i%7))
	}
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
			lr := &laneRun{d: &FormLanes{cfg: FormConfig{MaxItems: tc.maxItems, MaxBodyBytes: tc.maxBody, MaxWeight: tc.maxWeigh, Field: "mapping"}},
				prefix: []byte("api_key=k%20y&mapping=")}
			for start := 0; start < len(items); {
				end := lr.pack(items, start)
				if end <= start {
					t.Fatalf("no progress at %d", start)
				}
				body := lr.body(items[start:end])
				n := end - start
				w := 0
				for _, it := range items[start:end] {
					w += it.weight
				}
				if n > 1 && (n > tc.maxItems || len(body) >= tc.maxBody || (tc.maxWeigh > 0 && w > tc.maxWeigh)) {
					t.Fatalf("request [%d,%d): %d items, %d bytes, weight %d", start, end, n, len(body), w)
				}
				if end < len(items) && n < tc.maxItems {
					// the next record must not have fitted
					more := lr.body(items[start : end+1])
					if len(more) < tc.maxBody && (tc.maxWeigh == 0 || w+items[end].weight <= tc.maxWeigh) {
						t.Fatalf("request [%d,%d) stopped early (%d bytes with the next)", start, end, len(more))
					}
				}
				v, err := url.ParseQuery(string(body))
				if err != nil || v.Get("api_key") != "k y" {
					t.Fatalf("body %q: %v", body, err)
				}
				var parts []string
				for _, it := range items[start:end] {
					parts = append(parts, string(it.rec.Data))
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
	lr := &laneRun{prefix: []byte("api_key=" + url.QueryEscape("k&=y") + "&identification=")}
	body := lr.body([]item{{rec: spool.Record{Data: []byte("{}")}, esc: 6}})
	if got := BodyOverhead("k&=y", "identification") + 6; got != len(body) {
		t.Fatalf("BodyOverhead+record = %d, body %d", got, len(body))
	}
}

func TestConfigValidate(t *testing.T) {
	ok := FormConfig{Name: "x", Kind: spool.KindUserMap, URL: func(string) string { return "" }, Field: "f", MaxItems: 1, MaxBodyBytes: 1}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*FormConfig){
		"name":   func(c *FormConfig) { c.Name = "" },
		"kind":   func(c *FormConfig) { c.Kind = spool.KindEvents },
		"url":    func(c *FormConfig) { c.URL = nil },
		"field":  func(c *FormConfig) { c.Field = "" },
		"items":  func(c *FormConfig) { c.MaxItems = 0 },
		"body":   func(c *FormConfig) { c.MaxBodyBytes = 0 },
		"maxage": func(c *FormConfig) { c.MaxAge = -1 },
	} {
		c := ok
		mut(&c)
		if c.Validate() == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
