package usermap

import (
	"github.com/svcrelay/relay/internal/baseurl"

	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

func FuzzParseMappings(f *testing.F) {
	f.Add([]byte(`[{"user_id":"a","global_user_id":"g"},{"user_id":"b","unmap":true}]`))
	f.Add([]byte(`{"user_id":"a","unmap":false}`))
	f.Add([]byte(`[1,"x",null]`))
	f.Fuzz(func(t *testing.T, in []byte) {
		ms, err := parse(shape, "key", in)
		if err != nil {
			if err.Status != 400 && err.Status != 413 || err.Msg == "" {
				t.Fatalf("bad error %+v", err)
			}
			return
		}
		if len(ms) == 0 || len(ms) > MaxMappings {
			t.Fatalf("%d mappings", len(ms))
		}
		for _, m := range ms {
			if m.UserID == "" || (m.GlobalUserID == "" && !m.Unmap) || !json.Valid(m.Data) {
				t.Fatalf("accepted %+v", m)
			}
		}
	})
}

func FuzzParseUserIDs(f *testing.F) {
	f.Add([]byte(`["a","b"]`))
	f.Add([]byte(`a,b,c`))
	f.Add([]byte(`[1]`))
	f.Fuzz(func(t *testing.T, in []byte) {
		ids, err := ParseUserIDs(in)
		if err != nil {
			if err.Status != 400 {
				t.Fatalf("status %d", err.Status)
			}
			return
		}
		if len(ids) < 1 || len(ids) > MaxUserIDs {
			t.Fatalf("%d ids", len(ids))
		}
		for _, id := range ids {
			if strings.TrimSpace(id) == "" {
				t.Fatal("empty id accepted")
			}
		}
	})
}

func TestConfigValidate(t *testing.T) {
	base := Config{AliasURL: baseurl.NewRef("http://a"), AnalyticsURL: baseurl.NewRef("https://b")}
	tests := []struct {
		name string
		mut  func(*Config)
		ok   bool
	}{
		{"minimal", func(*Config) {}, true},
		{"no alias", func(c *Config) { c.AliasURL = baseurl.NewRef("") }, false},
		{"no analytics", func(c *Config) { c.AnalyticsURL = baseurl.NewRef("x") }, false},
		{"negative rate", func(c *Config) { c.RateLimit = -1 }, false},
		{"negative window", func(c *Config) { c.RateWindow = -1 }, false},
		{"negative retry after", func(c *Config) { c.RetryAfter = -1 }, false},
		{"negative age", func(c *Config) { c.MaxAge = -1 }, false},
		{"shrunk window", func(c *Config) { c.RateLimit, c.RateWindow = 10, 1 }, true},
	}
	for _, tc := range tests {
		c := base
		tc.mut(&c)
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func BenchmarkParseMappings2000(b *testing.B) {
	parts := make([]string, 2000)
	for i := range parts {
		parts[i] = fmt.Sprintf(`{"user_id":"user-%d","global_user_id":"global-%d"}`, i, i/3)
	}
	in := []byte("[" + strings.Join(parts, ",") + "]")
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if _, err := parse(shape, "key", in); err != nil {
			b.Fatal(err)
		}
	}
}

// A mapping is refused as too large exactly when the form body carrying it
// alone would reach MaxBodyBytes, measured escaped as it is sent.
func TestParseMappingsTooLarge(t *testing.T) {
	const key = "k y"
	for _, n := range []int{0, 1, 7, 40} {
		in := `{"user_id":"` + strings.Repeat(`\"`, n) + `u","global_user_id":"g"}`
		body := "api_key=" + url.QueryEscape(key) + "&mapping=" + url.QueryEscape("["+in+"]")
		for _, max := range []int{len(body), len(body) + 1} {
			s := shape
			s.MaxBodyBytes = max
			_, err := parse(s, key, []byte(in))
			if tooLarge := err != nil && err.Reason == "too_large"; tooLarge != (len(body) >= max) || (err != nil && !tooLarge) {
				t.Errorf("%d quotes, body %d bytes, MaxBodyBytes %d: %v", n, len(body), max, err)
			}
		}
	}
}
