package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/sim/wiretest"
)

func umForm(key, mapping string) []byte {
	return []byte(url.Values{"api_key": {key}, "mapping": {mapping}}.Encode())
}

func TestUserMapValidationAndState(t *testing.T) {
	s, base := start(t, Config{})
	many := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = fmt.Sprintf(`{"user_id":"u%d","global_user_id":"g"}`, i)
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	s.Knobs(func(k *Knobs) { k.UserMapLimit = 1_000_000 })
	tests := []struct {
		name   string
		body   []byte
		status int
		err    string // and missing_field after a '/'
	}{
		{"map", umForm("k", `[{"user_id":"a","global_user_id":"g1"},{"user_id":"b","global_user_id":"g1"}]`), 200, ""},
		{"one object", umForm("k", `{"user_id":"c","global_user_id":"g2"}`), 200, ""},
		{"unmap", umForm("k", `{"user_id":"c","unmap":true}`), 200, ""},
		{"missing global", umForm("k", `{"user_id":"d"}`), 400, ""},
		{"missing user", umForm("k", `{"global_user_id":"d"}`), 400, ""},
		{"unmap not bool", umForm("k", `{"user_id":"d","unmap":"yes"}`), 400, ""},
		{"missing api_key", umForm("", `{"user_id":"d","unmap":true}`), 400, ErrTextMissingField + "/api_key"},
		{"missing mapping", umForm("k", ""), 400, ErrTextMissingField + "/mapping"},
		{"bad json", umForm("k", `[{`), 400, ErrTextInvalidJSON},
		{"empty array", umForm("k", `[]`), 400, ErrTextInvalidJSON},
		// "at most 2000 requests/events per batch and 1 MB"
		{"2000", umForm("k2", many(2000)), 200, ""},
		{"2001", umForm("k2", many(2001)), 400, ErrTextInvalidMapping},
		{"1 MB", umForm("k", `{"user_id":"`+strings.Repeat("x", 1_000_000)+`","unmap":true}`), 413, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := wiretest.Post(t, base+"/usermap", tc.body, "Content-Type", formCT)
			if a.Status != tc.status {
				t.Fatalf("status %d, want %d: %s", a.Status, tc.status, a.Body)
			}
			if errText, missing, _ := strings.Cut(tc.err, "/"); tc.err != "" && (a.JSON["error"] != errText || missing != "" && a.JSON["missing_field"] != missing) {
				t.Fatalf("answer %s, want %q", a.Body, tc.err)
			}
		})
	}
	mapped := readOut[UserMapState](t, s, "/sim/usermap").Mapped["key:"+KeyLabel("k")]
	if g, ok := mapped["a"]; !ok || g != "g1" {
		t.Fatalf("a -> %q %v", g, ok)
	}
	if _, ok := mapped["c"]; ok {
		t.Fatal("c still mapped after unmap")
	}
	// Query parameters work as well as the form body.
	q := url.Values{"api_key": {"k"}, "mapping": {`{"user_id":"e","global_user_id":"g1"}`}}.Encode()
	if a := wiretest.Post(t, base+"/usermap?"+q, nil, "Content-Type", formCT); a.Status != 200 {
		t.Fatalf("query: %d %s", a.Status, a.Body)
	}

	// Reading: Basic auth required; unknown users yield empty arrays.
	s.Knobs(func(k *Knobs) { k.UserMapSecrets["k"] = "sec" })
	get := func(auth bool, pass, ids string) (int, map[string]userMapping) {
		req, _ := http.NewRequest("GET", base+"/api/2/usermap?user_ids="+url.QueryEscape(ids), nil)
		if auth {
			req.SetBasicAuth("k", pass)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var out map[string]userMapping
		json.Unmarshal(b, &out)
		return resp.StatusCode, out
	}
	if st, _ := get(false, "", "a"); st != 401 {
		t.Fatalf("no auth: %d", st)
	}
	if st, _ := get(true, "wrong", "a"); st != 401 {
		t.Fatalf("wrong secret: %d", st)
	}
	st, out := get(true, "sec", `["a","g1","zz"]`)
	if st != 200 {
		t.Fatalf("read: %d", st)
	}
	if len(out["a"].MappedTo) != 1 || out["a"].MappedTo[0].UserID != "g1" || len(out["a"].MappedFrom) != 0 {
		t.Fatalf("a: %+v", out["a"])
	}
	if len(out["g1"].MappedFrom) != 3 || out["g1"].MappedFrom[0].UserID != "a" {
		t.Fatalf("g1: %+v", out["g1"])
	}
	if out["zz"].MappedFrom == nil || len(out["zz"].MappedFrom)+len(out["zz"].MappedTo) != 0 {
		t.Fatalf("unknown: %+v", out["zz"])
	}
	if st, out := get(true, "sec", "a,b"); st != 200 || len(out) != 2 {
		t.Fatalf("comma list: %d %v", st, out)
	}
	ids := make([]string, 101)
	for i := range ids {
		ids[i] = fmt.Sprint("u", i)
	}
	if st, _ := get(true, "sec", strings.Join(ids, ",")); st != 400 {
		t.Fatalf("101 ids: %d", st)
	}
	if st, _ := get(true, "sec", strings.Join(ids[:100], ",")); st != 200 {
		t.Fatalf("100 ids: %d", st)
	}
}

func TestUserMapRateLimit(t *testing.T) {
	clk := newFakeClock()
	t0 := clk.Now()
	s, base := start(t, Config{Now: clk.Now})
	s.Knobs(func(k *Knobs) { k.UserMapOrgs["k1"] = "acme" })
	s.Knobs(func(k *Knobs) { k.UserMapOrgs["k2"] = "acme" })
	batch := func(n int, prefix string) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = fmt.Sprintf(`{"user_id":"%s%d","global_user_id":"g"}`, prefix, i)
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	// 1500 alias calls per 30 s per organization; above it everything is throttled.
	if a := wiretest.Post(t, base+"/usermap", umForm("k1", batch(1000, "a")), "Content-Type", formCT); a.Status != 200 {
		t.Fatal(a.Status)
	}
	clk.Advance(10 * time.Second)
	if a := wiretest.Post(t, base+"/usermap", umForm("k2", batch(500, "b")), "Content-Type", formCT); a.Status != 200 {
		t.Fatal(a.Status)
	}
	if a := wiretest.Post(t, base+"/usermap", umForm("k1", batch(1, "c")), "Content-Type", formCT); a.Status != 429 {
		t.Fatalf("over the limit: %d", a.Status)
	}
	if a := wiretest.Post(t, base+"/usermap", umForm("other", batch(1, "c")), "Content-Type", formCT); a.Status != 200 {
		t.Fatalf("another org: %d", a.Status)
	}
	clk.Advance(20 * time.Second) // the first 1000 leave the window
	if a := wiretest.Post(t, base+"/usermap", umForm("k1", batch(1000, "d")), "Content-Type", formCT); a.Status != 200 {
		t.Fatalf("after the window: %d", a.Status)
	}
	if readOut[UserMapState](t, s, "/sim/usermap").Throttled != 1 {
		t.Fatalf("throttled %d", readOut[UserMapState](t, s, "/sim/usermap").Throttled)
	}
	var got []string
	for _, b := range readOut[UserMapState](t, s, "/sim/usermap").Batches {
		got = append(got, fmt.Sprintf("%s:%d@%s", b.Org, b.N, b.Time.Sub(t0)))
	}
	if want := []string{"acme:1000@0s", "acme:500@10s", "key:" + KeyLabel("other") + ":1@10s", "acme:1000@30s"}; !slices.Equal(got, want) {
		t.Fatalf("batches %v, want %v", got, want)
	}
}
