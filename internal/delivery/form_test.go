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
	})
}

// packAll packs recs as a lane runner does: each request as full as the
// frame lets it be (at least one record).
func packAll(f *Frame, recs []storage.Record) (bodies []string, counts []int) {
	for start := 0; start < len(recs); {
		p := f.Open(nil)
		for _, r := range recs[start:] {
			rec, w := f.Record(nil, r.Data)
			if !f.Fits(&p, rec, w) {
				break
			}
			f.Add(&p, rec, w)
		}
		bodies, counts = append(bodies, string(f.Close(&p))), append(counts, p.N)
		start += p.N
	}
	return bodies, counts
}

// TestPack: a Form's requests fill up to each limit and never pass it, and
// each body decodes to its records.
func TestPack(t *testing.T) {
	weight := func(b []byte) int { return len(b) % 7 }
	var recs []storage.Record
	for i := range 50 {
		recs = append(recs, storage.Record{Data: []byte(`{"user_id":"u` + strings.Repeat("x", i) + `"}`)})
	}
	key := storage.LaneKey{APIKey: "k y"}
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
			f := (&Form{MaxItems: tc.maxItems, MaxBodyBytes: tc.maxBody, MaxWeight: tc.maxWeigh, Weight: weight, Field: "mapping"}).Frame(key)
			bodies, counts := packAll(&f, recs)
			start := 0
			for i, body := range bodies {
				n, end := counts[i], start+counts[i]
				w := 0
				for _, r := range recs[start:end] {
					w += weight(r.Data)
				}
				if n < 1 || (n > 1 && (n > tc.maxItems || len(body) >= tc.maxBody || (tc.maxWeigh > 0 && w > tc.maxWeigh))) {
					t.Fatalf("request [%d,%d): %d items, %d bytes, weight %d", start, end, n, len(body), w)
				}
				if end < len(recs) && n < tc.maxItems {
					// the next record must not have fitted
					more, _ := packAll(&f, recs[start:end+1])
					if len(more) == 1 {
						t.Fatalf("request [%d,%d) stopped early (%q with the next)", start, end, more[0])
					}
				}
				v, err := url.ParseQuery(body)
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
			if start != len(recs) {
				t.Fatalf("packed %d of %d", start, len(recs))
			}
		})
	}
}

// A Form's bodies byte for byte (what Form.Pack and Form.Body produced
// before the Frame), and TooLarge at its boundary.
func TestFormFrame(t *testing.T) {
	f := (&Form{Field: "mapping", MaxItems: 2, MaxBodyBytes: 1 << 20}).Frame(storage.LaneKey{APIKey: "k y&=é"})
	recs := []storage.Record{{Data: []byte(`{"user_id":"a b","global_user_id":"ü~-_.*"}`)}, {Data: []byte(`{"x":[1,2],"y":"%2C+"}`)}, {Data: []byte(`{}`)}}
	bodies, _ := packAll(&f, recs)
	want := []string{
		"api_key=k+y%26%3D%C3%A9&mapping=%5B%7B%22user_id%22%3A%22a+b%22%2C%22global_user_id%22%3A%22%C3%BC~-_.%2A%22%7D%2C%7B%22x%22%3A%5B1%2C2%5D%2C%22y%22%3A%22%252C%2B%22%7D%5D",
		"api_key=k+y%26%3D%C3%A9&mapping=%5B%7B%7D%5D",
	}
	if strings.Join(bodies, "\n") != strings.Join(want, "\n") {
		t.Fatalf("bodies\n%s\nwant\n%s", strings.Join(bodies, "\n"), strings.Join(want, "\n"))
	}
	if f.ContentType != "application/x-www-form-urlencoded" {
		t.Fatal(f.ContentType)
	}
	// "api_key=k&mapping=%5B%7B%7D%5D" is 30 bytes: too large at 30, not at 31.
	for max, want := range map[int]bool{30: true, 31: false} {
		f := (&Form{Field: "mapping", MaxItems: 1, MaxBodyBytes: max}).Frame(storage.LaneKey{APIKey: "k"})
		if rec, _ := f.Record(nil, []byte("{}")); f.TooLarge(rec) != want {
			t.Errorf("MaxBodyBytes %d: TooLarge %v", max, !want)
		}
	}
}

func TestFormConfigValidate(t *testing.T) {
	ok := FormConfig{Name: "x", Lanes: storage.KindUserMap, URL: func(string) string { return "" }, Kind: &Form{Field: "f", MaxItems: 1, MaxBodyBytes: 1},
		Store: spool.NewBackend(nil)}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*FormConfig){
		"name":   func(c *FormConfig) { c.Name = "" },
		"lanes":  func(c *FormConfig) { c.Lanes = storage.KindEvents },
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
