package ingest

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/valyala/fasthttp"
)

// Tests of the settings for browsers and the open internet: CORS, text/plain bodies, the api_key allow-list,
// per-client rate limits, IP anonymization.

const (
	shopOrigin  = "https://shop.example"
	localOrigin = "http://127.0.0.1:3000"
	evilOrigin  = "https://evil.example"
)

func oneEvent(i int) string {
	return `{"event_type":"page_view","device_id":"device-` + strings.Repeat("x", 4) + string(rune('a'+i%26)) + `","ip":"$remote"}`
}

func TestOpenValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Open
		ok   bool
	}{
		{"zero", Open{}, true},
		{"full", Open{CORSOrigins: []string{shopOrigin, localOrigin}, AllowedAPIKeys: []string{"k"}, ClientRateLimit: 0.5, AnonymizeIP: true}, true},
		{"star", Open{CORSOrigins: []string{"*"}}, true},
		{"star and more", Open{CORSOrigins: []string{"*", shopOrigin}}, false},
		{"origin with path", Open{CORSOrigins: []string{"https://shop.example/app"}}, false},
		{"origin without scheme", Open{CORSOrigins: []string{"shop.example"}}, false},
		{"null origin", Open{CORSOrigins: []string{"null"}}, false},
		{"negative rate", Open{ClientRateLimit: -1}, false},
		{"huge rate", Open{ClientRateLimit: 2e9}, false},
		{"empty key", Open{AllowedAPIKeys: []string{""}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(Config{Open: tc.o}, spool.NewBackend(openSpool(t, true)), event.NewIDGen(), nil, nil); (err == nil) != tc.ok {
				t.Fatalf("New = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestNormalizeOrigin(t *testing.T) {
	for in, want := range map[string]string{
		"https://shop.example":       "https://shop.example",
		"HTTPS://Shop.Example/":      "https://shop.example",
		"https://shop.example:443":   "https://shop.example",
		"http://shop.example:80":     "http://shop.example",
		"https://shop.example:8443":  "https://shop.example:8443",
		"http://127.0.0.1:3000":      "http://127.0.0.1:3000",
		"http://[::1]:3000":          "http://[::1]:3000",
		" chrome-extension://abcdef": "chrome-extension://abcdef",
	} {
		got, err := NormalizeOrigin(in)
		if err != nil || got != want {
			t.Errorf("NormalizeOrigin(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "null", "shop.example", "https://shop.example/x", "https://u@shop.example", "https://shop.example?a", "https://shop.example#f", "mailto:a@b"} {
		if got, err := NormalizeOrigin(in); err == nil {
			t.Errorf("NormalizeOrigin(%q) = %q, want an error", in, got)
		}
	}
}

// TestCORS checks preflights and actual requests from allowed and other
// origins, with the policy on (a list, or "*") and off.
func TestCORS(t *testing.T) {
	type want struct {
		status  int
		acao    string // Access-Control-Allow-Origin; "" none
		vary    bool
		spooled bool
	}
	body := envelope("cors-key", "", oneEvent(0))
	preflight := func(origin string) []string {
		return []string{"Origin", origin, "Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "content-type,content-encoding"}
	}
	for _, tc := range []struct {
		name    string
		origins []string
		method  string
		header  []string
		want    want
	}{
		{"preflight allowed", []string{shopOrigin, localOrigin}, http.MethodOptions, preflight(shopOrigin), want{204, shopOrigin, true, false}},
		{"preflight allowed second", []string{shopOrigin, localOrigin}, http.MethodOptions, preflight(localOrigin), want{204, localOrigin, true, false}},
		{"preflight other origin", []string{shopOrigin}, http.MethodOptions, preflight(evilOrigin), want{403, "", true, false}},
		{"options without origin", []string{shopOrigin}, http.MethodOptions, nil, want{204, "", true, false}},
		{"request method without origin", []string{shopOrigin}, http.MethodOptions, []string{"Access-Control-Request-Method", "POST"}, want{204, "", true, false}},
		{"post allowed", []string{shopOrigin}, http.MethodPost, []string{"Origin", shopOrigin}, want{200, shopOrigin, true, true}},
		{"post other origin", []string{shopOrigin}, http.MethodPost, []string{"Origin", evilOrigin}, want{403, "", true, false}},
		{"beacon other origin", []string{shopOrigin}, http.MethodPost, []string{"Origin", evilOrigin, "Content-Type", "text/plain;charset=UTF-8"}, want{403, "", true, false}},
		{"origin differs by port", []string{shopOrigin}, http.MethodPost, []string{"Origin", shopOrigin + ":8443"}, want{403, "", true, false}},
		{"post without origin", []string{shopOrigin}, http.MethodPost, nil, want{200, "", true, true}},
		{"star preflight", []string{"*"}, http.MethodOptions, preflight(evilOrigin), want{204, "*", true, false}},
		{"star post", []string{"*"}, http.MethodPost, []string{"Origin", evilOrigin}, want{200, "*", true, true}},
		{"off: options", nil, http.MethodOptions, preflight(shopOrigin), want{405, "", false, false}},
		{"off: post with origin", nil, http.MethodPost, []string{"Origin", evilOrigin}, want{200, "", false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRelay(t, Config{Now: fixedClock, Open: Open{CORSOrigins: tc.origins}}, spool.Config{NoSync: true})
			var b []byte
			if tc.method == http.MethodPost {
				b = body
			}
			a := r.do(tc.method, "/2/httpapi", b, tc.header...)
			if a.status != tc.want.status {
				t.Fatalf("status %d (%s), want %d", a.status, a.body, tc.want.status)
			}
			if got := a.header.Get("Access-Control-Allow-Origin"); got != tc.want.acao {
				t.Errorf("Access-Control-Allow-Origin %q, want %q", got, tc.want.acao)
			}
			if got := a.header.Get("Vary") == "Origin"; got != tc.want.vary {
				t.Errorf("Vary %q, want Origin: %v", a.header.Get("Vary"), tc.want.vary)
			}
			if c := a.header.Get("Access-Control-Allow-Credentials"); c != "" {
				t.Errorf("Access-Control-Allow-Credentials %q: credentials must never be allowed", c)
			}
			if a.status == 204 && tc.want.acao != "" {
				if m := a.header.Get("Access-Control-Allow-Methods"); m != "POST" {
					t.Errorf("Access-Control-Allow-Methods %q, want POST", m)
				}
				h := strings.ToLower(a.header.Get("Access-Control-Allow-Headers"))
				for _, need := range []string{"content-type", "content-encoding"} {
					if !strings.Contains(h, need) {
						t.Errorf("Access-Control-Allow-Headers %q lacks %s", h, need)
					}
				}
				if ma := a.header.Get("Access-Control-Max-Age"); ma != "7200" {
					t.Errorf("Access-Control-Max-Age %q, want 7200", ma)
				}
			} else if m := a.header.Get("Access-Control-Allow-Methods"); m != "" {
				t.Errorf("Access-Control-Allow-Methods %q on a non-preflight or refused answer", m)
			}
			if a.status == 403 {
				if string(a.body) != `{"code":403,"error":"Origin not allowed"}` {
					t.Errorf("body %s", a.body)
				}
				if n := r.counter("relay_ingest_rejected_requests_total", "reason", "origin_not_allowed"); n != 1 {
					t.Errorf("origin_not_allowed counted %v times, want 1", n)
				}
			}
			if recs := r.drain("cors-key", ""); (len(recs) > 0) != tc.want.spooled {
				t.Errorf("%d records spooled, want spooled=%v", len(recs), tc.want.spooled)
			}
		})
	}
}

// TestCORSOnErrors: a browser must be able to read every answer of an
// allowed origin, errors included, or the SDK cannot act on them.
func TestCORSOnErrors(t *testing.T) {
	r := startRelay(t, Config{Now: fixedClock, Open: Open{CORSOrigins: []string{shopOrigin}, AllowedAPIKeys: []string{"good"}}},
		spool.Config{NoSync: true})
	for _, tc := range []struct {
		body   []byte
		status int
	}{
		{[]byte(`{"api_key":"good","events":[{"event_type":"e"}]}`), 400},
		{envelope("bad", "", oneEvent(1)), 403},
		{[]byte(`{`), 400},
	} {
		a := r.post("/batch", tc.body, "Origin", shopOrigin)
		if a.status != tc.status || a.header.Get("Access-Control-Allow-Origin") != shopOrigin {
			t.Errorf("%s: %d with Access-Control-Allow-Origin %q, want %d with %s", tc.body, a.status,
				a.header.Get("Access-Control-Allow-Origin"), tc.status, shopOrigin)
		}
	}
}

// TestTextPlainBody: what navigator.sendBeacon sends is the same envelope
// under another Content-Type, taken and validated alike.
func TestTextPlainBody(t *testing.T) {
	r := startRelay(t, Config{Now: fixedClock}, spool.Config{NoSync: true})
	for _, ct := range []string{"text/plain;charset=UTF-8", "text/plain"} {
		a := r.post("/2/httpapi", envelope("beacon", "", oneEvent(0), oneEvent(1)), "Content-Type", ct)
		if a.status != 200 || !strings.Contains(string(a.body), `"events_ingested":2`) {
			t.Errorf("%s: %d %s", ct, a.status, a.body)
		}
		bad := r.post("/2/httpapi", []byte(`{"api_key":"beacon","events":[{"event_type":"e"}]}`), "Content-Type", ct)
		want := `{"code":400,"error":"Request missing required field","missing_field":"events"}`
		if bad.status != 400 || !strings.Contains(string(bad.body), "events_with_missing_fields") {
			t.Errorf("%s invalid: %d %s, want 400 like %s", ct, bad.status, bad.body, want)
		}
	}
	if recs := r.drain("beacon", ""); len(recs) != 4 {
		t.Errorf("%d records spooled, want 4", len(recs))
	}
}

func TestAllowedAPIKeys(t *testing.T) {
	r := startRelay(t, Config{Now: fixedClock, Open: Open{AllowedAPIKeys: []string{"key-a", "key-b"}}}, spool.Config{NoSync: true})
	lanes0 := r.sp.Stats().Lanes
	if a := r.post("/2/httpapi", envelope("key-a", "", oneEvent(0))); a.status != 200 {
		t.Fatalf("allowed key: %d %s", a.status, a.body)
	}
	a := r.post("/2/httpapi", envelope("key-c", "", oneEvent(0), oneEvent(1)))
	if a.status != 403 || string(a.body) != `{"code":403,"error":"API key not allowed"}` {
		t.Fatalf("other key: %d %s", a.status, a.body)
	}
	if n := r.counter("relay_ingest_rejected_requests_total", "reason", "api_key_not_allowed"); n != 1 {
		t.Errorf("api_key_not_allowed requests %v, want 1", n)
	}
	if n := r.counter("relay_ingest_events_rejected_total", "reason", "api_key_not_allowed"); n != 2 {
		t.Errorf("api_key_not_allowed events %v, want 2", n)
	}
	// No lane was made for the refused key.
	if l := r.sp.Stats().Lanes; l != lanes0+1 {
		t.Errorf("%d lanes, want %d (the allowed key's only)", l, lanes0+1)
	}
	// An invalid request is answered as the upstream would, whatever its key.
	if a := r.post("/2/httpapi", []byte(`{"api_key":"key-c"}`)); a.status != 400 {
		t.Errorf("invalid request of another key: %d %s, want 400", a.status, a.body)
	}

	// Replaced at run time (a credentials reload).
	r.srv.SetOpen(Open{AllowedAPIKeys: []string{"key-c"}})
	if a := r.post("/2/httpapi", envelope("key-c", "", oneEvent(0))); a.status != 200 {
		t.Errorf("key-c after the swap: %d %s", a.status, a.body)
	}
	if a := r.post("/2/httpapi", envelope("key-a", "", oneEvent(0))); a.status != 403 {
		t.Errorf("key-a after the swap: %d %s", a.status, a.body)
	}
	r.srv.SetOpen(Open{AllowedAPIKeys: []string{}})
	if a := r.post("/2/httpapi", envelope("key-c", "", oneEvent(0))); a.status != 403 {
		t.Errorf("empty list: %d %s, want 403", a.status, a.body)
	}
	r.srv.SetOpen(Open{})
	if a := r.post("/2/httpapi", envelope("key-z", "", oneEvent(0))); a.status != 200 {
		t.Errorf("nil list: %d %s, want 200", a.status, a.body)
	}
	if recs := r.drain("key-a", ""); len(recs) != 1 {
		t.Errorf("key-a: %d records, want 1", len(recs))
	}
	if recs := r.drain("key-c", ""); len(recs) != 1 {
		t.Errorf("key-c: %d records, want 1", len(recs))
	}
}

// TestClientLimiter drives the token bucket on synctest's clock.
func TestClientLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newClientLimiter(2, limiterShards*limiterWays, time.Now) // 2/s, burst 4
		a := netip.MustParseAddr("203.0.113.9")
		for i := range 4 {
			if ok, _ := l.allow(a); !ok {
				t.Fatalf("request %d of the burst refused", i)
			}
		}
		ok, wait := l.allow(a)
		if ok || wait != 500*time.Millisecond {
			t.Fatalf("5th request: %v, wait %v; want refused, wait 500ms", ok, wait)
		}
		// Another client, and an IPv4-mapped form of the same, are apart
		// and alike respectively.
		if ok, _ := l.allow(netip.MustParseAddr("203.0.113.10")); !ok {
			t.Error("another client refused")
		}
		if ok, _ := l.allow(netip.MustParseAddr("::ffff:203.0.113.9")); ok {
			t.Error("the IPv4-mapped form of a limited client allowed")
		}
		time.Sleep(500 * time.Millisecond)
		if ok, _ := l.allow(a); !ok {
			t.Error("refused after one interval")
		}
		if ok, _ := l.allow(a); ok {
			t.Error("allowed twice after one interval")
		}
		time.Sleep(time.Minute)
		for i := range 4 {
			if ok, _ := l.allow(a); !ok {
				t.Fatalf("request %d of the burst refused after a minute", i)
			}
		}

		// IPv6 clients count by /64.
		v6 := netip.MustParseAddr("2001:db8:1:2::1")
		for range 4 {
			l.allow(v6)
		}
		if ok, _ := l.allow(netip.MustParseAddr("2001:db8:1:2:ffff::9")); ok {
			t.Error("another address of the same /64 allowed")
		}
		if ok, _ := l.allow(netip.MustParseAddr("2001:db8:1:3::1")); !ok {
			t.Error("another /64 refused")
		}

		// A rate below one a second still lets one request through.
		slow := newClientLimiter(0.1, limiterShards*limiterWays, time.Now)
		if ok, _ := slow.allow(a); !ok {
			t.Error("0.1/s: first request refused")
		}
		if ok, wait := slow.allow(a); ok || wait != 10*time.Second {
			t.Errorf("0.1/s: second request %v wait %v, want refused for 10s", ok, wait)
		}
	})
}

// TestClientLimiterBounded fills a small table with far more clients than
// it holds: memory stays the table's, a client is never refused because of
// others, and a limited client is the last of its set to be forgotten.
func TestClientLimiterBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const slots = limiterShards * limiterWays // 4 per shard
		l := newClientLimiter(1, slots, time.Now) // burst 2
		victim := netip.MustParseAddr("198.51.100.1")
		l.allow(victim)
		l.allow(victim)
		if ok, _ := l.allow(victim); ok {
			t.Fatal("victim not limited")
		}
		for i := range 20000 {
			a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
			if ok, _ := l.allow(a); !ok {
				t.Fatalf("client %v refused on its first request", a)
			}
		}
		n := 0
		for i := range l.shards {
			if len(l.shards[i].slots) != slots/limiterShards {
				t.Fatalf("shard %d grew to %d slots", i, len(l.shards[i].slots))
			}
			for _, s := range l.shards[i].slots {
				if s.tat != 0 {
					n++
				}
			}
		}
		if n > slots {
			t.Errorf("%d clients held, table of %d", n, slots)
		}
		// The victim's set saw hundreds of clients, each with a fuller
		// bucket than the victim's: they were forgotten first, and the
		// victim, held longest, is still limited.
		if ok, _ := l.allow(victim); ok {
			t.Error("a limited client was forgotten before clients with fuller buckets")
		}
		time.Sleep(2 * time.Second)
		if ok, _ := l.allow(victim); !ok {
			t.Error("victim still limited after its bucket refilled")
		}
	})
}

func TestPickVictim(t *testing.T) {
	// The eviction rule, on one set: the same client if there, else a free
	// slot, else the one with the oldest tat (the fullest bucket).
	synctest.Test(t, func(t *testing.T) {
		l := newClientLimiter(1, limiterShards*limiterWays, time.Now)
		a := netip.MustParseAddr("192.0.2.1")
		key := limiterKey(a)
		// Fill a's set with others at known tats, a not among them.
		sh, set := l.locate(key)
		for i := range limiterWays {
			sh.slots[set+i] = limiterSlot{key: [16]byte{byte(i + 1)}, tat: int64(10+i) * int64(time.Hour)}
		}
		sh.slots[set+2].tat = int64(time.Second) // oldest
		time.Sleep(2 * time.Hour)
		l.allow(a)
		if sh.slots[set+2].key != key {
			t.Errorf("a did not take the oldest slot: %+v", sh.slots[set:set+limiterWays])
		}
		for i := range limiterWays {
			if i != 2 && sh.slots[set+i].key != [16]byte{byte(i + 1)} {
				t.Errorf("slot %d was replaced", i)
			}
		}
	})
}

// TestClientRateLimitOverHTTP: 429 with Retry-After and throttled_events,
// nothing spooled; the client address is the one --trusted-proxies decide.
func TestClientRateLimitOverHTTP(t *testing.T) {
	var now atomic.Int64
	now.Store(fixedNow.UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	r := startRelay(t, Config{
		Now:            clock,
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Open:           Open{ClientRateLimit: 1},
	}, spool.Config{NoSync: true})
	xff := func(ip string) []string { return []string{"X-Forwarded-For", ip} }
	for i := range 2 {
		if a := r.post("/2/httpapi", envelope("rl", "", oneEvent(i)), xff("203.0.113.5")...); a.status != 200 {
			t.Fatalf("request %d: %d %s", i, a.status, a.body)
		}
	}
	a := r.post("/2/httpapi", envelope("rl", "", oneEvent(2), oneEvent(3), oneEvent(4)), xff("203.0.113.5")...)
	if a.status != 429 || a.header.Get("Retry-After") != "1" {
		t.Fatalf("over the rate: %d Retry-After %q %s", a.status, a.header.Get("Retry-After"), a.body)
	}
	var body struct {
		Code            int
		Error           string
		ThrottledEvents []int `json:"throttled_events"`
	}
	if err := json.Unmarshal(a.body, &body); err != nil || body.Code != 429 || len(body.ThrottledEvents) != 3 || body.ThrottledEvents[2] != 2 {
		t.Errorf("429 body %s (%v)", a.body, err)
	}
	if n := r.counter("relay_ingest_rejected_requests_total", "reason", "client_rate_limited"); n != 1 {
		t.Errorf("client_rate_limited counted %v, want 1", n)
	}
	// Another client behind the same proxy has its own bucket.
	if a := r.post("/2/httpapi", envelope("rl", "", oneEvent(5)), xff("203.0.113.6")...); a.status != 200 {
		t.Errorf("another client: %d %s", a.status, a.body)
	}
	now.Add(int64(time.Second))
	if a := r.post("/2/httpapi", envelope("rl", "", oneEvent(6)), xff("203.0.113.5")...); a.status != 200 {
		t.Errorf("a second later: %d %s", a.status, a.body)
	}
	if recs := r.drain("rl", ""); len(recs) != 4 {
		t.Errorf("%d records spooled, want 4 (none of the limited request)", len(recs))
	}
}

// TestAnonymizeIP: $remote and every ip an event gives lose their host
// part; an ip that is not an address is not forwarded.
func TestAnonymizeIP(t *testing.T) {
	events := []string{
		`{"event_type":"a","device_id":"device-0001","ip":"$remote"}`,
		`{"event_type":"b","device_id":"device-0002","ip":"198.51.100.200"}`,
		`{"event_type":"c","device_id":"device-0003","ip":"2001:db8:aaaa:bbbb:cccc::1"}`,
		`{"event_type":"d","device_id":"device-0004","ip":"not an address"}`,
		`{"event_type":"e","device_id":"device-0005","ip":"1.1.1.1","i\u0070":"::ffff:192.0.2.77"}`,
		`{"event_type":"f","device_id":"device-0006","event_properties":{"ip":"10.9.8.7"}}`,
	}
	for _, tc := range []struct {
		name string
		anon bool
		xff  string
		want []string // the ip field of each event, raw JSON ("" absent)
	}{
		{"on", true, "203.0.113.77", []string{`"203.0.113.0"`, `"198.51.100.0"`, `"2001:db8:aaaa::"`, `null`, `"192.0.2.0"`, ``}},
		{"on v6 client", true, "2001:db8:1:2:3:4:5:6", []string{`"2001:db8:1::"`, `"198.51.100.0"`, `"2001:db8:aaaa::"`, `null`, `"192.0.2.0"`, ``}},
		{"off", false, "203.0.113.77", []string{`"203.0.113.77"`, `"198.51.100.200"`, `"2001:db8:aaaa:bbbb:cccc::1"`, `"not an address"`, `"::ffff:192.0.2.77"`, ``}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRelay(t, Config{
				Now:            fixedClock,
				TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
				Open:           Open{AnonymizeIP: tc.anon},
			}, spool.Config{NoSync: true})
			if a := r.post("/2/httpapi", envelope("anon", "", events...), "X-Forwarded-For", tc.xff); a.status != 200 {
				t.Fatalf("%d %s", a.status, a.body)
			}
			recs := r.drain("anon", "")
			if len(recs) != len(events) {
				t.Fatalf("%d records", len(recs))
			}
			for i, rec := range recs {
				f := fields(t, rec.data)
				if got := string(f["ip"]); got != tc.want[i] {
					t.Errorf("event %d: ip %s, want %s (%s)", i, got, tc.want[i], rec.data)
				}
				// The anonymizing rewrite fills the time in as the plain one does.
				if got, want := string(f["time"]), strconv.FormatInt(fixedNow.UnixMilli(), 10); got != want {
					t.Errorf("event %d: time %s, want %s (%s)", i, got, want, rec.data)
				}
				if tc.anon && strings.Contains(string(rec.data), "192.0.2.77") {
					t.Errorf("event %d: the full address is still in %s", i, rec.data)
				}
			}
			if p := string(fields(t, recs[5].data)["event_properties"]); p != `{"ip":"10.9.8.7"}` {
				t.Errorf("event_properties changed: %s", p)
			}
		})
	}
}

func TestAnonymizeAddr(t *testing.T) {
	for in, want := range map[string]string{
		"203.0.113.77":           "203.0.113.0",
		"10.0.0.0":               "10.0.0.0",
		"::ffff:192.0.2.77":      "192.0.2.0",
		"2001:db8:1:2:3:4:5:6":   "2001:db8:1::",
		"fe80::1%eth0":           "fe80::",
		"::1":                    "::",
		"2001:db8:ffff:ffff::ff": "2001:db8:ffff::",
	} {
		if got := anonymizeAddr(netip.MustParseAddr(in)).String(); got != want {
			t.Errorf("anonymizeAddr(%s) = %s, want %s", in, got, want)
		}
	}
}

// FuzzHandlerOpen is FuzzHandler with every Open setting on (CORS,
// allow-list, rate limit, anonymization) and a fuzzed Origin: no panic,
// every answer documented, JSON where it has a body, and CORS headers only
// for the allowed origin.
func FuzzHandlerOpen(f *testing.F) {
	f.Add([]byte(`{"api_key":"k","events":[{"user_id":"user-00001","event_type":"a","ip":"$remote"}]}`), shopOrigin, false)
	f.Add([]byte(`{"api_key":"k","events":[{"user_id":"user-00001","event_type":"a","ip":"1.2.3.4","ip":"x"}]}`), evilOrigin, false)
	f.Add([]byte(`{"api_key":"other","events":[{"user_id":"user-00001","event_type":"a","i\u0070":"::1"}]}`), "", true)
	f.Add([]byte(``), "null", false)

	s, _ := newServer(f, Config{MaxRequestBytes: 1 << 16, Open: Open{
		CORSOrigins: []string{shopOrigin}, AllowedAPIKeys: []string{"k"}, ClientRateLimit: 1e6, AnonymizeIP: true,
	}}, true, nil)
	f.Fuzz(func(t *testing.T, body []byte, origin string, zip bool) {
		var header []string
		if origin != "" {
			header = append(header, "Origin", origin)
		}
		if zip {
			header = append(header, "Content-Encoding", "gzip")
			body = gz(t, body)
		}
		var ctx fasthttp.RequestCtx
		callInProcess(s.strictHandle, inProcessRequest("/batch", body, header...), &ctx)

		status := ctx.Response.StatusCode()
		var ans struct{ Code int }
		if err := json.Unmarshal(ctx.Response.Body(), &ans); err != nil || ans.Code != status {
			t.Fatalf("status %d body %q", status, ctx.Response.Body())
		}
		switch status {
		case 200, 400, 403, 413, 429:
		default:
			t.Fatalf("unexpected status %d: %s", status, ctx.Response.Body())
		}
		acao := string(ctx.Response.Header.Peek("Access-Control-Allow-Origin"))
		if (acao != "") != (origin == shopOrigin) || acao != "" && acao != shopOrigin {
			t.Fatalf("Origin %q answered with Access-Control-Allow-Origin %q", origin, acao)
		}
		if origin != "" && origin != shopOrigin && status != 403 {
			t.Fatalf("Origin %q answered %d, want 403", origin, status)
		}
	})
}

// FuzzParseIPv4: parseIPv4 agrees with netip.ParseAddr on IPv4 addresses and
// takes nothing else.
func FuzzParseIPv4(f *testing.F) {
	for _, s := range []string{"1.2.3.4", "0.0.0.0", "255.255.255.255", "01.2.3.4", "1.2.3", "1.2.3.4.", "256.1.1.1", "1..2.3", "", "::1", "1.2.3.4%x", ".1.2.3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := parseIPv4([]byte(s))
		want, err := netip.ParseAddr(s)
		wantOK := err == nil && want.Is4()
		if ok != wantOK || ok && got != want {
			t.Fatalf("parseIPv4(%q) = %v, %v; netip: %v, %v", s, got, ok, want, err)
		}
	})
}

func TestAnonymizedIPAllocs(t *testing.T) {
	ip := []byte(" 198.51.100.23")
	dst := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { dst = appendAnonymizedIP(dst[:0], ip) }); n != 0 {
		t.Errorf("%v allocations per IPv4 address", n)
	}
	if string(dst) != `"198.51.100.0"` {
		t.Errorf("got %s", dst)
	}
}
