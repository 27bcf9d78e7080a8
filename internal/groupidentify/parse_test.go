package groupidentify

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/forms"
)

func FuzzParse(f *testing.F) {
	f.Add([]byte(`[{"group_type":"org","group_value":"acme","group_properties":{"$set":{"a":1},"b":2}}]`))
	f.Add([]byte(`{"group_type":"org","group_value":"acme","group_properties":{"$unset":{"a":"-"}}}`))
	f.Add([]byte(`[{"group_type":"","group_value":1}]`))
	f.Add([]byte(`[[],{}]`))
	f.Fuzz(func(t *testing.T, in []byte) {
		ids, err := parse(shape, "key", in)
		if err != nil {
			if err.Status != 400 && err.Status != 413 || err.Msg == "" || err.Reason == "" {
				t.Fatalf("bad error %+v", err)
			}
			return
		}
		if len(ids) == 0 || len(ids) > MaxIdentifies {
			t.Fatalf("%d identifications accepted", len(ids))
		}
		total := 0
		for _, id := range ids {
			if id.GroupType == "" || id.GroupValue == "" || !json.Valid(id.Data) {
				t.Fatalf("accepted %+v", id)
			}
			if Properties(id.Data) != id.Properties {
				t.Fatalf("Properties(%s) = %d, parse counted %d", id.Data, Properties(id.Data), id.Properties)
			}
			total += id.Properties
		}
		if total > MaxProperties {
			t.Fatalf("%d properties accepted", total)
		}
	})
}

func TestProperties(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{`{"group_properties":{}}`, 0},
		{`{"group_properties":{"a":1,"b":{"c":2}}}`, 2},
		{`{"group_properties":{"$set":{"a":1,"b":2},"$unset":{"c":"-"},"d":[1,2]}}`, 4},
		{`not json`, 0},
	}
	for _, tc := range tests {
		if got := Properties([]byte(tc.in)); got != tc.want {
			t.Errorf("Properties(%s) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"minimal", Config{URL: baseurl.NewRef("http://x")}, true},
		{"no url", Config{}, false},
		{"not http", Config{URL: baseurl.NewRef("ftp://x")}, false},
		{"negative age", Config{URL: baseurl.NewRef("http://x"), Spooling: forms.Spooling{FormTiming: delivery.FormTiming{MaxAge: -1}}}, false},
		{"negative retry after", Config{URL: baseurl.NewRef("http://x"), Spooling: forms.Spooling{RetryAfter: -1}}, false},
	}
	for _, tc := range tests {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func BenchmarkParse100(b *testing.B) {
	parts := make([]string, 100)
	for i := range parts {
		parts[i] = fmt.Sprintf(`{"group_type":"org","group_value":"v%d","group_properties":{"$set":{"plan":"pro","seats":%d},"region":"eu"}}`, i, i)
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

// An identification is refused as too large exactly when the form body
// carrying it alone would reach MaxBodyBytes, measured escaped as it is
// sent.
func TestParseTooLarge(t *testing.T) {
	const key = "k y"
	for _, n := range []int{0, 1, 7, 40} {
		in := `{"group_type":"t","group_value":"` + strings.Repeat(`\"`, n) + `v","group_properties":{"a":1}}`
		body := "api_key=" + url.QueryEscape(key) + "&identification=" + url.QueryEscape("["+in+"]")
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
