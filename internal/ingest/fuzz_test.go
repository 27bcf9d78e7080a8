package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/netip"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/svcrelay/relay/internal/event"
	"github.com/valyala/fasthttp"
)

func TestReadCapped(t *testing.T) {
	for _, tc := range []struct {
		n, limit int
		tooLarge bool
	}{
		{0, 0, false}, {1, 0, true}, {10, 10, false}, {11, 10, true},
		{100 << 10, 100 << 10, false}, {100<<10 + 1, 100 << 10, true}, {5 << 20, 1 << 20, true},
	} {
		src := bytes.Repeat([]byte{'a'}, tc.n)
		for _, r := range []io.Reader{bytes.NewReader(src), iotest.OneByteReader(bytes.NewReader(src)), iotest.DataErrReader(bytes.NewReader(src))} {
			got, err := readCapped([]byte("pre"), r, tc.limit)
			if tc.tooLarge {
				if !errors.Is(err, errTooLarge) {
					t.Fatalf("n=%d limit=%d: err %v, want errTooLarge", tc.n, tc.limit, err)
				}
				if len(got) > 3+tc.limit+1 || cap(got) > 3+tc.limit+1 {
					t.Fatalf("n=%d limit=%d: held %d bytes (cap %d)", tc.n, tc.limit, len(got), cap(got))
				}
				continue
			}
			if err != nil || !bytes.Equal(got, append([]byte("pre"), src...)) {
				t.Fatalf("n=%d limit=%d: %d bytes, err %v", tc.n, tc.limit, len(got), err)
			}
		}
	}
	boom := errors.New("boom")
	if _, err := readCapped(nil, iotest.ErrReader(boom), 10); !errors.Is(err, boom) {
		t.Fatalf("read error lost: %v", err)
	}
}

// FuzzClientAddr: the walk never panics and returns the peer or one of the
// header's addresses.
func FuzzClientAddr(f *testing.F) {
	f.Add("10.0.0.1", "1.2.3.4, 10.0.0.2", "")
	f.Add("10.0.0.1", "[::1]:80,,  ,2001:db8::1", "10.9.9.9")
	f.Add("192.0.2.1", "1.1.1.1", "")
	f.Add("10.0.0.1", "fe80::1%eth0, bogus", ",")
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	f.Fuzz(func(t *testing.T, peer, h1, h2 string) {
		p, err := netip.ParseAddr(peer)
		if err != nil {
			return
		}
		got := clientAddr(p, [][]byte{[]byte(h1), []byte(h2)}, trusted)
		if got == p.Unmap() {
			return
		}
		for _, e := range strings.Split(h1+","+h2, ",") {
			if a, ok := parseForwardedAddr([]byte(strings.Trim(e, " \t"))); ok && a == got {
				return
			}
		}
		t.Fatalf("clientAddr(%s, %q, %q) = %s: neither the peer nor a header entry", peer, h1, h2, got)
	})
}

// FuzzHandler feeds arbitrary bodies (plain and gzip) through the handler with
// a real spool: it never panics, every answer is one of the documented ones
// with a JSON body, and a 200 counts exactly the events event.Parse sees.
func FuzzHandler(f *testing.F) {
	f.Add([]byte(`{"api_key":"k","events":[{"user_id":"user-00001","event_type":"a","ip":"$remote"}]}`), false)
	f.Add([]byte(`{"api_key":"k","events":[{"device_id":"00000000","event_type":"a"}],"options":{"min_id_length":3}}`), false)
	f.Add([]byte(`{"api_key":"k","events":[{"user_id":"u","event_type":"a","time":"x"}]}`), false)
	f.Add([]byte(`{"api_key":"k","events":[{"user_id":"user-1","insert_id":null,"time":null}]}`), true)
	f.Add([]byte("\x1f\x8b\x08\x00garbage"), true)
	f.Add([]byte(``), false)

	s, _ := newServer(f, Config{MaxRequestBytes: 1 << 16}, true, nil)
	f.Fuzz(func(t *testing.T, body []byte, zip bool) {
		var header []string
		if zip {
			header = []string{"Content-Encoding", "gzip"}
			body = gz(t, body)
		}
		var ctx fasthttp.RequestCtx
		callInProcess(s.strictHandle, inProcessRequest("/2/httpapi", body, header...), &ctx)

		status := ctx.Response.StatusCode()
		var ans struct {
			Code           int `json:"code"`
			EventsIngested int `json:"events_ingested"`
		}
		if err := json.Unmarshal(ctx.Response.Body(), &ans); err != nil || ans.Code != status {
			t.Fatalf("status %d body %q", status, ctx.Response.Body())
		}
		switch status {
		case 200:
			plain := body
			if zip {
				plain, _ = io.ReadAll(must(gzipReader(body)))
			}
			var r event.Request
			if e := event.Parse(plain, &r); e != nil || len(r.Events) != ans.EventsIngested {
				t.Fatalf("200 with %d events for a body Parse answers %v / %d events", ans.EventsIngested, e, len(r.Events))
			}
		case 400, 413:
		default:
			t.Fatalf("unexpected status %d: %s", status, ctx.Response.Body())
		}
	})
}
