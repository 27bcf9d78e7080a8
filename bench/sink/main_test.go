package main

import (
	"bytes"
	"compress/gzip"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func TestSinkCountsAndLag(t *testing.T) {
	s := &sink{}
	s.lagOn.Store(true)
	now := time.Now().UnixMicro()
	body := `{"api_key":"k","events":[{"event_type":"a","event_properties":{"sent_us":` +
		itoa(now-5000) + `}},{"event_type":"b","event_properties":{"sent_us":` + itoa(now-1000) + `}},{"event_type":"c"}]}`
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/2/httpapi")
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetBodyString(body)
	s.handle(&ctx)
	if ctx.Response.StatusCode() != 200 || !strings.Contains(string(ctx.Response.Body()), `"events_ingested":3`) {
		t.Fatalf("answer %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if s.counted.Load() != 3 || s.lag.Count() != 2 {
		t.Fatalf("counted %d, lag samples %d; want 3, 2", s.counted.Load(), s.lag.Count())
	}
	if m := s.lag.Max(); m < 5000 || m > 5000+uint64(time.Minute/time.Microsecond) {
		t.Fatalf("max lag %d us, want >= 5000", m)
	}

	// Lag recording off (POST /lag?on=0): counted, no lag sample.
	var off fasthttp.RequestCtx
	off.Request.SetRequestURI("/lag?on=0")
	off.Request.Header.SetMethod("POST")
	s.handle(&off)
	var plain fasthttp.RequestCtx
	plain.Request.SetRequestURI("/2/httpapi")
	plain.Request.Header.SetMethod("POST")
	plain.Request.SetBodyString(body)
	s.handle(&plain)
	if s.counted.Load() != 6 || s.lag.Count() != 2 {
		t.Fatalf("lag off: counted %d, lag samples %d; want 6, 2", s.counted.Load(), s.lag.Count())
	}

	s.down.Store(true)
	var down fasthttp.RequestCtx
	down.Request.SetRequestURI("/2/httpapi")
	down.Request.SetBodyString(body)
	s.handle(&down)
	if down.Response.StatusCode() != 503 || s.counted.Load() != 6 {
		t.Fatalf("down: status %d, counted %d", down.Response.StatusCode(), s.counted.Load())
	}
}

func itoa(v int64) string {
	var b [20]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[i:])
}

// TestSinkGzip: a gzip-encoded body (the relay's --upstream-gzip) is counted
// decoded, stamps included; one that does not decode is answered 400 and
// not counted.
func TestSinkGzip(t *testing.T) {
	s := &sink{}
	s.lagOn.Store(true)
	now := time.Now().UnixMicro()
	body := `{"api_key":"k","events":[{"event_type":"a","event_properties":{"sent_us":` + itoa(now-2000) +
		`}},{"event_type":"b"},{"event_type":"c"}]}`
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write([]byte(body))
	zw.Close()
	tests := []struct {
		name       string
		body       []byte
		status     int
		counted    int64
		lagSamples int
		gzipped    int64
		badBodies  int64
	}{
		{"gzip", zb.Bytes(), 200, 3, 1, 1, 0},
		{"not gzip", []byte(body), 400, 3, 1, 1, 1},
	}
	for _, tc := range tests {
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI("/2/httpapi")
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.Header.Set("Content-Encoding", "gzip")
		ctx.Request.SetBody(tc.body)
		s.handle(&ctx)
		if ctx.Response.StatusCode() != tc.status {
			t.Fatalf("%s: status %d, want %d (%s)", tc.name, ctx.Response.StatusCode(), tc.status, ctx.Response.Body())
		}
		if s.counted.Load() != tc.counted || s.lag.Count() != uint64(tc.lagSamples) ||
			s.gzipped.Load() != tc.gzipped || s.badBodies.Load() != tc.badBodies {
			t.Fatalf("%s: counted %d, lag samples %d, gzipped %d, bad %d; want %d, %d, %d, %d", tc.name,
				s.counted.Load(), s.lag.Count(), s.gzipped.Load(), s.badBodies.Load(),
				tc.counted, tc.lagSamples, tc.gzipped, tc.badBodies)
		}
	}
}
