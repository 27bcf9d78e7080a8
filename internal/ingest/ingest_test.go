package ingest

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/valyala/fasthttp"
)

var fixedNow = time.UnixMilli(1763712345678)

func fixedClock() time.Time { return fixedNow }

func TestConfigChecked(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero", Config{}, true},
		{"full", Config{MaxRequestBytes: 1 << 20, RetryAfter: 3 * time.Second,
			TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, true},
		{"negative max", Config{MaxRequestBytes: -1}, false},
		{"huge max", Config{MaxRequestBytes: 1 << 50}, false},
		{"negative retry", Config{RetryAfter: -time.Second}, false},
		{"negative timeout", Config{ReadTimeout: -1}, false},
		{"invalid prefix", Config{TrustedProxies: []netip.Prefix{{}}}, false},
		{"invalid origin", Config{Open: Open{CORSOrigins: []string{"example.com"}}}, false},
		{"negative rate", Config{Open: Open{ClientRateLimit: -1}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			if _, err := New(tc.cfg, spool.NewBackend(openSpool(t, true)), event.NewIDGen(), nil, reg); (err == nil) != tc.ok {
				t.Fatalf("New = %v, want ok=%v", err, tc.ok)
			}
			// A refused Config leaves nothing registered: a corrected one
			// registers on the same registry.
			if _, err := New(Config{}, spool.NewBackend(openSpool(t, true)), event.NewIDGen(), nil, reg); err != nil && !tc.ok {
				t.Fatalf("New after a refused Config: %v", err)
			}
		})
	}
}

// fields decodes one spooled event into its raw field values.
func fields(t *testing.T, data []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("spooled event is not JSON: %v\n%s", err, data)
	}
	return m
}

// TestAcceptRewritesAndSpools posts one envelope and checks the answer and
// what is in the spool: every byte as sent except the three rewrites.
func TestAcceptRewritesAndSpools(t *testing.T) {
	for _, path := range []string{"/2/httpapi", "/batch"} {
		t.Run(path, func(t *testing.T) {
			r := startRelay(t, Config{Now: fixedClock}, spool.Config{NoSync: true})
			events := []string{
				// complete: spooled byte for byte
				`{"user_id":"user-00001","device_id":"device-0001","event_type":"a","time":1700000000000,"insert_id":"keep-me","ip":"1.2.3.4", "x" : {"deep":[1, 2.50, "\u00e9"]}}`,
				// nothing to keep: insert_id and time filled, ip replaced
				`{"device_id":"device-0002","event_type":"b","ip":"$remote","event_properties":{"k":"v"},"unknown_field":[true,null]}`,
				// insert_id filled, time kept
				`{"user_id":"user-00003","event_type":"c","time":1700000000123}`,
				// time filled, insert_id kept
				`{"user_id":"user-00004","event_type":"d","insert_id":"mine-4","ip":"$remote"}`,
			}
			body := envelope("key-accept", `{"min_id_length":5}`, events...)
			a := r.post(path, body)
			want := fmt.Sprintf(`{"code":200,"events_ingested":4,"payload_size_bytes":%d,"server_upload_time":%d}`, len(body), fixedNow.UnixMilli())
			if a.status != 200 || string(a.body) != want {
				t.Fatalf("answer %d %s, want 200 %s", a.status, a.body, want)
			}
			if ct := a.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}

			// min_id_length 5 is the upstream's default: the canonical
			// options are none.
			recs := r.drain("key-accept", "")
			if len(recs) != 4 {
				t.Fatalf("spooled %d records, want 4", len(recs))
			}
			for _, rec := range recs {
				if rec.chunk != recs[0].chunk || rec.chunkRecordsCount != 4 {
					t.Fatalf("the request was not spooled as one chunk: %+v", recs)
				}
			}
			// Order keys and user ids as the event package computes them.
			var req event.Request
			if e := event.Parse(body, &req); e != nil {
				t.Fatal(e)
			}
			for i := range req.Events {
				if got, want := recs[i].orderKey, string(req.Events[i].OrderKey(nil)); got != want {
					t.Errorf("event %d: OrderKey %q, want %q", i, got, want)
				}
				if got, want := recs[i].userID, string(req.Events[i].UserID); got != want {
					t.Errorf("event %d: UserID %q, want %q", i, got, want)
				}
			}

			if string(recs[0].data) != events[0] {
				t.Errorf("complete event changed:\n got %s\nwant %s", recs[0].data, events[0])
			}
			nowField := strconv.FormatInt(fixedNow.UnixMilli(), 10)
			ids := map[string]bool{}
			for i, rec := range recs[1:] {
				i++
				got, orig := fields(t, rec.data), fields(t, []byte(events[i]))
				for k, v := range orig {
					switch {
					case k == "ip" && string(v) == `"$remote"`:
						if string(got[k]) != `"127.0.0.1"` {
							t.Errorf("event %d: ip %s, want \"127.0.0.1\"", i, got[k])
						}
					case !bytes.Equal(got[k], v):
						t.Errorf("event %d: field %s = %s, want %s (byte for byte)", i, k, got[k], v)
					}
				}
				if _, ok := orig["time"]; !ok && string(got["time"]) != nowField {
					t.Errorf("event %d: filled time %s, want %s", i, got["time"], nowField)
				}
				if _, ok := orig["insert_id"]; !ok {
					var id string
					if err := json.Unmarshal(got["insert_id"], &id); err != nil || id == "" || ids[id] {
						t.Errorf("event %d: filled insert_id %s not a fresh non-empty string", i, got["insert_id"])
					}
					ids[id] = true
				}
				if extra := len(got) - len(orig); extra < 0 || extra > 2 {
					t.Errorf("event %d: %d fields added", i, extra)
				}
			}
			if got := r.counter("relay_ingest_events_accepted_total"); got != 4 {
				t.Errorf("relay_ingest_events_accepted_total = %v, want 4", got)
			}
			if got := r.counter("relay_ingest_requests_total", "path", path, "code", "200"); got != 1 {
				t.Errorf("relay_ingest_requests_total{%s,200} = %v, want 1", path, got)
			}
		})
	}
}

// TestLanes: requests with different api_key or options go to different
// lanes; equal ones share a lane (found by the spool's index of live lanes).
func TestLanes(t *testing.T) {
	r := startRelay(t, Config{}, spool.Config{NoSync: true})
	ev := `{"user_id":"user-00001","event_type":"a","insert_id":"x","time":1}`
	for _, c := range []struct{ key, opts string }{
		{"k1", ""}, {"k1", ""}, {"k2", ""}, {"k1", `{"min_id_length":3}`}, {"k1", `{"min_id_length":3}`},
	} {
		if a := r.post("/2/httpapi", envelope(c.key, c.opts, ev)); a.status != 200 {
			t.Fatalf("%v: %d %s", c, a.status, a.body)
		}
	}
	if n := len(r.sp.Lanes()); n != 3 {
		t.Fatalf("%d lanes, want 3", n)
	}
	for _, c := range []struct {
		key, opts string
		n         int
	}{{"k1", "", 2}, {"k2", "", 1}, {"k1", `{"min_id_length":3}`, 2}} {
		if got := len(r.drain(c.key, c.opts)); got != c.n {
			t.Errorf("lane %q %q: %d records, want %d", c.key, c.opts, got, c.n)
		}
	}
}

func TestXForwardedForOverHTTP(t *testing.T) {
	ev := `{"user_id":"user-00001","event_type":"a","insert_id":"x","time":1,"ip":"$remote"}`
	for _, tc := range []struct {
		name    string
		trusted []string
		xff     []string
		want    string
	}{
		{"untrusted peer ignores header", nil, []string{"203.0.113.9"}, "127.0.0.1"},
		{"no header", []string{"127.0.0.0/8"}, nil, "127.0.0.1"},
		{"trusted peer", []string{"127.0.0.0/8"}, []string{"203.0.113.9"}, "203.0.113.9"},
		{"rightmost untrusted wins", []string{"127.0.0.0/8"}, []string{"198.51.100.1, 203.0.113.9"}, "203.0.113.9"},
		{"trusted hops skipped", []string{"127.0.0.0/8", "10.0.0.0/8"}, []string{"198.51.100.1, 10.1.1.1,10.2.2.2"}, "198.51.100.1"},
		{"several headers", []string{"127.0.0.0/8", "10.0.0.0/8"}, []string{"198.51.100.1", "10.1.1.1"}, "198.51.100.1"},
		{"garbage stops", []string{"127.0.0.0/8"}, []string{"bogus"}, "127.0.0.1"},
		{"ipv6 with port", []string{"127.0.0.0/8"}, []string{"[2001:db8::7]:443"}, "2001:db8::7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg Config
			for _, p := range tc.trusted {
				cfg.TrustedProxies = append(cfg.TrustedProxies, netip.MustParsePrefix(p))
			}
			r := startRelay(t, cfg, spool.Config{NoSync: true})
			var hdr []string
			for _, v := range tc.xff {
				hdr = append(hdr, "X-Forwarded-For", v)
			}
			if a := r.post("/2/httpapi", envelope("k", "", ev), hdr...); a.status != 200 {
				t.Fatalf("%d %s", a.status, a.body)
			}
			recs := r.drain("k", "")
			if len(recs) != 1 {
				t.Fatalf("%d records", len(recs))
			}
			if got := string(fields(t, recs[0].data)["ip"]); got != strconv.Quote(tc.want) {
				t.Fatalf("ip = %s, want %q", got, tc.want)
			}
		})
	}
}

func TestClientAddr(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:1::/48")}
	for _, tc := range []struct {
		peer string
		xff  []string
		want string
	}{
		{"192.0.2.1", []string{"1.1.1.1"}, "192.0.2.1"},
		{"10.0.0.1", nil, "10.0.0.1"},
		{"10.0.0.1", []string{""}, "10.0.0.1"},
		{"10.0.0.1", []string{" , ,"}, "10.0.0.1"},
		{"10.0.0.1", []string{"1.1.1.1"}, "1.1.1.1"},
		{"::ffff:10.0.0.1", []string{"1.1.1.1"}, "1.1.1.1"},
		{"10.0.0.1", []string{"::ffff:1.1.1.1"}, "1.1.1.1"},
		{"10.0.0.1", []string{"1.1.1.1, 10.9.9.9"}, "1.1.1.1"},
		{"10.0.0.1", []string{"6.6.6.6, 1.1.1.1, 10.9.9.9"}, "1.1.1.1"},
		{"10.0.0.1", []string{"10.3.3.3, 10.9.9.9"}, "10.3.3.3"},
		{"10.0.0.1", []string{"1.1.1.1, junk, 10.9.9.9"}, "10.9.9.9"},
		{"10.0.0.1", []string{"1.1.1.1:8080"}, "1.1.1.1"},
		{"2001:db8:1::5", []string{"fe80::1%eth0"}, "fe80::1"},
		{"2001:db8:1::5", []string{"2001:db8:2::9", "2001:db8:1::7"}, "2001:db8:2::9"},
		{"10.0.0.1", []string{strings.Repeat("1", 100)}, "10.0.0.1"},
	} {
		var xff [][]byte
		for _, v := range tc.xff {
			xff = append(xff, []byte(v))
		}
		got := clientAddr(netip.MustParseAddr(tc.peer), xff, trusted)
		if got.String() != tc.want {
			t.Errorf("clientAddr(%s, %q) = %s, want %s", tc.peer, tc.xff, got, tc.want)
		}
	}
	// 4-in-6 trusted prefixes are normalised to IPv4.
	cfg := Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}}.withDefaults()
	if got := clientAddr(netip.MustParseAddr("10.1.2.3"), [][]byte{[]byte("1.1.1.1")}, cfg.TrustedProxies); got.String() != "1.1.1.1" {
		t.Errorf("4-in-6 prefix not honoured: %s", got)
	}
}

// TestRejections: representative validation classes pass through with the
// upstream's status and body, and nothing of a rejected request is spooled.
func TestRejections(t *testing.T) {
	r := startRelay(t, Config{}, spool.Config{NoSync: true})
	good := `{"user_id":"user-00001","event_type":"a"}`
	for _, tc := range []struct {
		name   string
		body   string
		reason string
		want   string // body, when given
	}{
		{"empty body", ``, reasonMissingBody, `{"code":400,"error":"Missing request body"}`},
		{"invalid json", `{"api_key":"k","events":[`, reasonInvalidJSON, `{"code":400,"error":"Invalid JSON request body"}`},
		{"missing api_key", `{"events":[` + good + `]}`, reasonMissingField,
			`{"code":400,"error":"Request missing required field","missing_field":"api_key"}`},
		{"missing events", `{"api_key":"k"}`, reasonMissingField,
			`{"code":400,"error":"Request missing required field","missing_field":"events"}`},
		{"missing event_type", string(envelope("k", "", good, `{"user_id":"user-00002"}`)), reasonMissingFields,
			`{"code":400,"error":"Request missing required field","events_with_missing_fields":{"event_type":[1]}}`},
		{"iso time", string(envelope("k", "", good, `{"user_id":"user-00002","event_type":"a","time":"2025-01-01T00:00:00Z"}`)),
			reasonInvalidFields, `{"code":400,"error":"Invalid field values on some events","events_with_invalid_fields":{"time":[1]}}`},
		{"event not an object", string(envelope("k", "", good, `17`)), "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := r.post("/2/httpapi", []byte(tc.body))
			var req event.Request
			e := event.Parse([]byte(tc.body), &req)
			if e == nil {
				t.Fatal("the event package accepts this body; the test case is wrong")
			}
			if a.status != e.Status || string(a.body) != string(e.AppendJSON(nil)) {
				t.Fatalf("answer %d %s, want %d %s", a.status, a.body, e.Status, e.AppendJSON(nil))
			}
			if tc.want != "" && string(a.body) != tc.want {
				t.Fatalf("body %s, want %s", a.body, tc.want)
			}
			if tc.reason != "" {
				if got := r.counter("relay_ingest_rejected_requests_total", "reason", tc.reason); got < 1 {
					t.Errorf("relay_ingest_rejected_requests_total{reason=%q} = %v", tc.reason, got)
				}
			}
		})
	}
	if st := r.sp.Stats(); st.Lanes != 0 || st.LiveBytes != 0 {
		t.Fatalf("rejected requests left %+v in the spool", st)
	}
	if got := r.counter("relay_ingest_events_accepted_total"); got != 0 {
		t.Fatalf("accepted %v events", got)
	}
}

func TestPathsAndMethods(t *testing.T) {
	r := startRelay(t, Config{}, spool.Config{NoSync: true})
	for _, tc := range []struct {
		method, path string
		status       int
		body, allow  string
	}{
		{"GET", "/healthz", 200, "ok\n", ""},
		{"HEAD", "/healthz", 200, "", ""},
		{"POST", "/healthz", 405, `{"code":405,"error":"Method not allowed"}`, "GET, HEAD"},
		{"GET", "/2/httpapi", 405, `{"code":405,"error":"Method not allowed"}`, "POST"},
		{"PUT", "/batch", 405, `{"code":405,"error":"Method not allowed"}`, "POST"},
		{"POST", "/2/httpapi/extra", 400, `{"code":400,"error":"Invalid request path"}`, ""},
		{"POST", "/httpapi", 400, `{"code":400,"error":"Invalid request path"}`, ""},
		{"GET", "/nothing", 404, `{"code":404,"error":"Not found"}`, ""},
	} {
		a := r.do(tc.method, tc.path, nil)
		if a.status != tc.status || string(a.body) != tc.body || a.header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d %q Allow=%q, want %d %q Allow=%q", tc.method, tc.path,
				a.status, a.body, a.header.Get("Allow"), tc.status, tc.body, tc.allow)
		}
	}
}

func TestGzipAccepted(t *testing.T) {
	r := startRelay(t, Config{}, spool.Config{NoSync: true})
	events := make([]string, 50)
	for i := range events {
		events[i] = realisticEvent(i)
	}
	plain := envelope("k", "", events...)
	for _, enc := range []string{"gzip", "x-gzip", " GZIP "} {
		body := gz(t, plain)
		a := r.post("/2/httpapi", body, "Content-Encoding", enc)
		want := fmt.Sprintf(`"events_ingested":50,"payload_size_bytes":%d,`, len(body))
		if a.status != 200 || !strings.Contains(string(a.body), want) {
			t.Fatalf("%q: %d %s, want 200 with %s", enc, a.status, a.body, want)
		}
	}
	// Two gzip members are one body (as gzip(1) concatenation makes).
	half := len(plain) / 2
	two := append(gz(t, plain[:half]), gz(t, plain[half:])...)
	if a := r.post("/batch", two, "Content-Encoding", "gzip"); a.status != 200 {
		t.Fatalf("multi-member gzip: %d %s", a.status, a.body)
	}
	recs := r.drain("k", "")
	if len(recs) != 200 {
		t.Fatalf("%d records spooled, want 200", len(recs))
	}
	for i, rec := range recs {
		if got, want := string(fields(t, rec.data)["insert_id"]), strconv.Quote(fmt.Sprintf("a1b2c3d4-%012d", i%50)); got != want {
			t.Fatalf("record %d: insert_id %s, want %s", i, got, want)
		}
	}
}

func TestEncodingErrors(t *testing.T) {
	r := startRelay(t, Config{}, spool.Config{NoSync: true})
	body := envelope("k", "", `{"user_id":"user-00001","event_type":"a"}`)
	zipped := gz(t, body)
	for _, tc := range []struct {
		name, enc string
		body      []byte
		status    int
		answer    string
	}{
		{"brotli", "br", body, 415, `{"code":415,"error":"Unsupported Content-Encoding"}`},
		{"stacked", "gzip, gzip", zipped, 415, `{"code":415,"error":"Unsupported Content-Encoding"}`},
		{"not gzip", "gzip", body, 400, `{"code":400,"error":"Invalid gzip request body"}`},
		{"truncated", "gzip", zipped[:len(zipped)-6], 400, `{"code":400,"error":"Invalid gzip request body"}`},
		{"bad crc", "gzip", append(bytes.Clone(zipped[:len(zipped)-8]), 1, 2, 3, 4, 5, 6, 7, 8), 400, `{"code":400,"error":"Invalid gzip request body"}`},
		{"trailing garbage", "gzip", append(bytes.Clone(zipped), "garbage"...), 400, `{"code":400,"error":"Invalid gzip request body"}`},
		{"empty gzip", "gzip", nil, 400, `{"code":400,"error":"Invalid gzip request body"}`},
		{"gzip of nothing", "gzip", gz(t, nil), 400, `{"code":400,"error":"Missing request body"}`},
	} {
		a := r.post("/2/httpapi", tc.body, "Content-Encoding", tc.enc)
		if a.status != tc.status || string(a.body) != tc.answer {
			t.Errorf("%s: %d %s, want %d %s", tc.name, a.status, a.body, tc.status, tc.answer)
		}
	}
	if st := r.sp.Stats(); st.Lanes != 0 {
		t.Fatalf("rejected requests created %d lanes", st.Lanes)
	}
}

func TestGzipBombConstruction(t *testing.T) {
	zr, err := gzip.NewReader(bytes.NewReader(gzipBomb(t, 4)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil || len(b) != 4<<20 || bytes.ContainsFunc(b, func(r rune) bool { return r != 0 }) {
		t.Fatalf("bomb of 4 segments: %d bytes, err %v", len(b), err)
	}
}

// TestGzipBomb: a 1 GiB-of-zeros gzip body of about 1 MB is refused with 413
// after inflating no more than the limit.
func TestGzipBomb(t *testing.T) {
	r := startRelay(t, Config{}, spool.Config{NoSync: true}) // 20 MB limit
	bomb := gzipBomb(t, 1024)
	t.Logf("bomb: %d bytes compressed, 1 GiB inflated", len(bomb))
	if len(bomb) > 4<<20 {
		t.Fatalf("bomb too big: %d", len(bomb))
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	a := r.post("/2/httpapi", bomb, "Content-Encoding", "gzip")
	runtime.ReadMemStats(&after)
	if a.status != 413 || string(a.body) != `{"code":413,"error":"Payload too large"}` {
		t.Fatalf("answer %d %s, want 413", a.status, a.body)
	}
	// Allocated by the whole process (client included) while serving it: the
	// body (1 MB, buffered), the capped inflate buffer and its regrowth
	// (< 2 x 20 MB). Inflating the bomb would allocate over 1 GiB.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 128<<20 {
		t.Fatalf("serving the bomb allocated %d MiB", alloc>>20)
	} else {
		t.Logf("allocated %d MiB while refusing the bomb", alloc>>20)
	}
	if got := r.counter("relay_ingest_rejected_requests_total", "reason", reasonTooLarge); got != 1 {
		t.Errorf("too_large rejections = %v", got)
	}
}

// TestSizeLimits checks the limit at its boundary, plain and gzip.
func TestSizeLimits(t *testing.T) {
	const limit = 1000
	r := startRelay(t, Config{MaxRequestBytes: limit}, spool.Config{NoSync: true})
	base := envelope("k", "", `{"user_id":"user-00001","event_type":"a"}`)
	pad := func(n int) []byte { // a valid envelope of exactly n bytes
		return append(bytes.Clone(base), bytes.Repeat([]byte(" "), n-len(base))...)
	}
	tooLarge := `{"code":413,"error":"Payload too large"}`
	for _, tc := range []struct {
		name   string
		body   []byte
		gzip   bool
		status int
	}{
		{"plain at limit", pad(limit), false, 200},
		{"plain over limit", pad(limit + 1), false, 413},
		{"plain far over (fasthttp's limit)", pad(limit * 200), false, 413},
		{"gzip at limit", pad(limit), true, 200},
		{"gzip over limit", pad(limit + 1), true, 413},
	} {
		body := tc.body
		hdr := []string{}
		if tc.gzip {
			body = gz(t, body)
			hdr = []string{"Content-Encoding", "gzip"}
		}
		a := r.post("/2/httpapi", body, hdr...)
		if a.status != tc.status || (tc.status == 413 && string(a.body) != tooLarge) {
			t.Errorf("%s: %d %s, want %d", tc.name, a.status, a.body, tc.status)
		}
	}
	// The server still serves after refusing a body mid-stream.
	if a := r.do("GET", "/healthz", nil); a.status != 200 {
		t.Fatalf("healthz after 413s: %d", a.status)
	}
	if got := len(r.drain("k", "")); got != 2 {
		t.Fatalf("%d records spooled, want 2", got)
	}
}

// TestSpoolFull fills a small spool: 503 with Retry-After, and exactly the
// requests answered 200 are in the spool, each whole.
func TestSpoolFull(t *testing.T) {
	r := startRelay(t, Config{RetryAfter: 1500 * time.Millisecond}, spool.Config{NoSync: true, MaxBytes: 64 << 10})
	const perReq = 5
	var ok []int
	full := false
	for i := 0; i < 1000 && !full; i++ {
		evs := make([]string, perReq)
		for j := range evs {
			evs[j] = fmt.Sprintf(`{"user_id":"user-00001","event_type":"a","insert_id":"r%d-e%d","time":1,"pad":"%s"}`, i, j, strings.Repeat("x", 300))
		}
		a := r.post("/2/httpapi", envelope("k", "", evs...))
		switch a.status {
		case 200:
			ok = append(ok, i)
		case 503:
			full = true
			if ra := a.header.Get("Retry-After"); ra != "2" {
				t.Errorf("Retry-After %q, want \"2\"", ra)
			}
			var body struct {
				Code  int    `json:"code"`
				Error string `json:"error"`
			}
			if err := json.Unmarshal(a.body, &body); err != nil || body.Code != 503 || body.Error == "" {
				t.Errorf("503 body %s", a.body)
			}
		default:
			t.Fatalf("request %d: %d %s", i, a.status, a.body)
		}
	}
	if !full || len(ok) == 0 {
		t.Fatalf("full=%v after %d accepted requests", full, len(ok))
	}
	recs := r.drain("k", "")
	if len(recs) != perReq*len(ok) {
		t.Fatalf("%d records spooled for %d accepted requests of %d events", len(recs), len(ok), perReq)
	}
	for n, rec := range recs {
		i, j := ok[n/perReq], n%perReq
		want := fmt.Sprintf(`"r%d-e%d"`, i, j)
		if got := string(fields(t, rec.data)["insert_id"]); got != want || rec.chunkRecordsCount != perReq {
			t.Fatalf("record %d: insert_id %s (chunk of %d), want %s", n, got, rec.chunkRecordsCount, want)
		}
	}
	if got := r.counter("relay_ingest_rejected_requests_total", "reason", reasonSpoolFull); got != 1 {
		t.Errorf("spool_full rejections = %v", got)
	}
	if got := r.counter("relay_ingest_events_rejected_total", "reason", reasonSpoolFull); got != perReq {
		t.Errorf("spool_full rejected events = %v", got)
	}
}

// TestConcurrentClients: 32 clients at once, every event present exactly once
// and in order per device.
func TestConcurrentClients(t *testing.T) {
	r := startRelay(t, Config{}, spool.Config{})
	const clients, reqs, perReq = 32, 8, 5
	var wg sync.WaitGroup
	errs := make(chan string, clients*reqs)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for q := range reqs {
				evs := make([]string, perReq)
				for e := range evs {
					evs[e] = fmt.Sprintf(`{"device_id":"device-%03d","event_type":"a","insert_id":"c%d-%d","time":1}`, c, c, q*perReq+e)
				}
				a := r.post("/2/httpapi", envelope("k", "", evs...))
				if a.status != 200 {
					errs <- fmt.Sprintf("client %d request %d: %d %s", c, q, a.status, a.body)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	recs := r.drain("k", "")
	if len(recs) != clients*reqs*perReq {
		t.Fatalf("%d records, want %d", len(recs), clients*reqs*perReq)
	}
	next := make(map[string]int) // device -> next sequence number
	for _, rec := range recs {
		var ev struct {
			DeviceID string `json:"device_id"`
			InsertID string `json:"insert_id"`
		}
		if err := json.Unmarshal(rec.data, &ev); err != nil {
			t.Fatal(err)
		}
		var c, n int
		fmt.Sscanf(ev.InsertID, "c%d-%d", &c, &n)
		if ev.DeviceID != fmt.Sprintf("device-%03d", c) || n != next[ev.DeviceID] {
			t.Fatalf("record %s out of order or duplicated (want seq %d)", ev.InsertID, next[ev.DeviceID])
		}
		next[ev.DeviceID]++
	}
}

func TestPanicIsRecovered(t *testing.T) {
	r := startRelay(t, Config{}, spool.Config{NoSync: true})
	var once sync.Once
	r.srv.testHook = func(*fasthttp.RequestCtx) { once.Do(func() { panic("boom") }) }
	body := envelope("k", "", `{"user_id":"user-00001","event_type":"a","insert_id":"x","time":1}`)
	if a := r.post("/2/httpapi", body); a.status != 500 || string(a.body) != `{"code":500,"error":"Internal server error"}` {
		t.Fatalf("panicking request: %d %s", a.status, a.body)
	}
	if a := r.post("/2/httpapi", body); a.status != 200 {
		t.Fatalf("after a panic: %d %s", a.status, a.body)
	}
	if got := len(r.drain("k", "")); got != 1 {
		t.Fatalf("%d records, want 1 (the panicking request spooled nothing)", got)
	}
}

// holdRequest posts one event and holds it in the handler: it returns once
// the request is there, with the channel of its answer and the channel
// whose close lets it go on.
func holdRequest(r *testRelay) (got <-chan answer, release chan struct{}) {
	r.t.Helper()
	entered, release := make(chan struct{}), make(chan struct{})
	r.srv.testHook = func(*fasthttp.RequestCtx) {
		close(entered)
		<-release
	}
	answers := make(chan answer, 1)
	go func() {
		answers <- r.post("/2/httpapi", envelope("k", "", `{"user_id":"user-00001","event_type":"a"}`))
	}()
	select {
	case <-entered:
	case a := <-answers:
		r.t.Fatalf("answered %d %s without reaching the handler", a.status, a.body)
	case <-time.After(polltest.Max):
		r.t.Fatalf("the request did not reach the handler in %v", polltest.Max)
	}
	return answers, release
}

// TestShutdownWaitsForInFlight: a request inside the handler when Shutdown
// starts completes with 200; new connections are refused.
func TestShutdownWaitsForInFlight(t *testing.T) {
	r := startRelay(t, Config{}, spool.Config{NoSync: true})
	got, release := holdRequest(r)
	shut := make(chan error, 1)
	go func() { shut <- r.srv.Shutdown(context.Background()) }()
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a request in flight", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if a := <-got; a.status != 200 {
		t.Fatalf("in-flight request: %d %s", a.status, a.body)
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(polltest.Max):
		t.Fatal("Shutdown did not return after the request finished")
	}
	if c, err := net.DialTimeout("tcp", r.addr, time.Second); err == nil {
		c.Close()
		t.Fatal("connection accepted after Shutdown")
	}
	if got := len(r.drain("k", "")); got != 1 {
		t.Fatalf("%d records, want 1", got)
	}
}

// TestShutdownDeadline: Shutdown returns when its context ends even though a
// request is stuck.
func TestShutdownDeadline(t *testing.T) {
	r := startRelay(t, Config{}, spool.Config{NoSync: true})
	got, release := holdRequest(r)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := r.srv.Shutdown(ctx)
	if err == nil || !strings.Contains(err.Error(), context.DeadlineExceeded.Error()) {
		t.Fatalf("Shutdown = %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d > polltest.Max { // a wrong one waits for ever
		t.Fatalf("Shutdown took %v", d)
	}
	close(release)
	// The spool append runs under a cancelled context now: whatever it
	// answers, a 200 must mean the events are in the spool.
	a := <-got
	recs := r.drain("k", "")
	switch {
	case a.status == 200 && len(recs) != 1, a.status == 503 && len(recs) != 0, a.status != 200 && a.status != 503:
		t.Fatalf("answer %d %s with %d records spooled", a.status, a.body, len(recs))
	}
}

// TestSlowAndMalformedClients: a client that stalls mid-request is cut off by
// ReadTimeout, garbage gets 400, and neither stalls other clients.
func TestSlowAndMalformedClients(t *testing.T) {
	r := startRelay(t, Config{ReadTimeout: 300 * time.Millisecond}, spool.Config{NoSync: true})

	slow, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fmt.Fprintf(slow, "POST /2/httpapi HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"api_key\":")

	bad, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	fmt.Fprintf(bad, "\x00\x01 not http at all\r\n\r\n")

	// Others are served meanwhile.
	if a := r.post("/2/httpapi", envelope("k", "", `{"user_id":"user-00001","event_type":"a"}`)); a.status != 200 {
		t.Fatalf("good client: %d %s", a.status, a.body)
	}
	for name, c := range map[string]net.Conn{"slow": slow, "garbage": bad} {
		c.SetReadDeadline(time.Now().Add(polltest.Max))
		b, _ := io.ReadAll(c) // until the server closes the connection
		if !bytes.HasPrefix(b, []byte("HTTP/1.1 4")) {
			t.Errorf("%s client got %q", name, b)
		}
	}
}

// TestMetricsRegistered checks the metric names the contract promises.
func TestMetricsRegistered(t *testing.T) {
	r := startRelay(t, Config{}, spool.Config{NoSync: true})
	r.post("/2/httpapi", envelope("k", "", `{"user_id":"user-00001","event_type":"a"}`))
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"relay_ingest_requests_total", "relay_ingest_events_accepted_total",
		"relay_ingest_events_rejected_total", "relay_ingest_rejected_requests_total",
		"relay_ingest_request_seconds", "relay_ingest_request_bytes"} {
		if !names[n] {
			t.Errorf("metric %s not registered", n)
		}
	}
	// A second Server on the same registry is a configuration error.
	if _, err := New(Config{}, spool.NewBackend(r.sp), event.NewIDGen(), nil, r.reg); err == nil {
		t.Error("New registered the same metrics twice")
	}
}

// TestShutdownClosesWaitingConnections: a client connected without sending
// anything and an idle keep-alive client (the server's timeouts 10 minutes
// long) do not delay Shutdown, while a request in the handler still gets its
// 200 and is spooled.
func TestShutdownClosesWaitingConnections(t *testing.T) {
	r := startRelay(t, Config{ReadTimeout: 10 * time.Minute, IdleTimeout: 10 * time.Minute}, spool.Config{NoSync: true})
	dialWait := func() net.Conn {
		c, err := net.DialTimeout("tcp", r.addr, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	silent := dialWait()
	idle := dialWait()
	idle.SetDeadline(time.Now().Add(polltest.Max))
	io.WriteString(idle, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(idle), nil); err != nil || resp.StatusCode != 200 || resp.Close {
		t.Fatalf("keep-alive /healthz: %v %v", resp, err)
	}
	got, release := holdRequest(r)

	// The bounds are polltest.Max: a wrong Shutdown that left the waiting
	// connections to the read and idle timeouts, or waited for them, takes
	// 10 minutes; a loaded CI machine may take seconds where a quiet one
	// takes 100 ms (fasthttp polls its count of open connections every
	// 100 ms).
	shut := make(chan error, 1)
	go func() { shut <- r.srv.Shutdown(context.Background()) }()
	for name, c := range map[string]net.Conn{"silent": silent, "idle keep-alive": idle} {
		c.SetReadDeadline(time.Now().Add(polltest.Max))
		if n, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("%s connection still open %v after Shutdown began: read %d, %v", name, polltest.Max, n, err)
		}
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a request in flight", err)
	case <-time.After(50 * time.Millisecond): // can only miss a wrong return, never fail a right one
	}
	close(release)
	if a := <-got; a.status != 200 {
		t.Fatalf("in-flight request: %d %s", a.status, a.body)
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(polltest.Max):
		t.Fatalf("Shutdown did not return within %v after the request finished", polltest.Max)
	}
	if got := len(r.drain("k", "")); got != 1 {
		t.Fatalf("%d records, want 1", got)
	}
}
