package upstream

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		err    error
		want   Kind
		check  func(t *testing.T, r Result)
	}{
		{name: "ok", status: 200, body: `{"code":200,"events_ingested":3}`, want: OK},
		{name: "ok non-json", status: 200, body: `fine`, want: OK},
		{name: "429 devices users events", status: 429,
			body: `{"code":429,"error":"Too many requests for some devices and users","eps_threshold":30,"throttled_devices":{"d2":41,"d1":31},"throttled_users":{"u1":33.5},"throttled_events":[0,3]}`,
			want: Throttled, check: func(t *testing.T, r Result) {
				eq(t, r.ThrottledDevices, []string{"d1", "d2"})
				eq(t, r.ThrottledUsers, []string{"u1"})
				eq(t, r.ThrottledEvents, []int{0, 3})
				eq(t, r.EPSThreshold, 30)
			}},
		{name: "429 non-json", status: 429, body: `<html>slow down</html>`, want: Throttled},
		{name: "429 empty", status: 429, want: Throttled},
		{name: "silenced", status: 400,
			body: `{"code":400,"error":"Some devices are silenced","eps_threshold":30,"exceeded_daily_quota_devices":{"dq":500001},"silenced_devices":["ds"],"silenced_events":[1,2],"throttled_devices":{},"throttled_events":[]}`,
			want: Silenced, check: func(t *testing.T, r Result) {
				eq(t, r.SilencedDevices, []string{"ds"})
				eq(t, r.SilencedEvents, []int{1, 2})
				eq(t, r.QuotaDevices, []string{"dq"})
			}},
		{name: "quota only", status: 400, body: `{"code":400,"exceeded_daily_quota_devices":{"dq":7}}`, want: Silenced},
		{name: "invalid and missing", status: 400,
			body: `{"code":400,"error":"Request missing required field","events_with_invalid_fields":{"time":[4]},"events_with_missing_fields":{"event_type":[2],"user_id":[4]}}`,
			want: Invalid, check: func(t *testing.T, r Result) {
				eq(t, r.InvalidEvents, map[int]string{2: "missing_fields", 4: "invalid_fields"})
			}},
		{name: "invalid api key", status: 400, body: `{"code":400,"error":"Invalid API key"}`, want: InvalidAPIKey},
		{name: "invalid api key 401", status: 401, body: `{"code":401,"error":"Invalid API key"}`, want: InvalidAPIKey},
		{name: "401 other", status: 401, body: `nope`, want: Fatal},
		{name: "invalid request path", status: 400, body: `{"code":400,"error":"Invalid request path"}`, want: Fatal},
		{name: "404", status: 404, body: `not found`, want: Fatal},
		{name: "400 invalid event json", status: 400, body: `{"code":400,"error":"Invalid event JSON"}`, want: BadRequest},
		{name: "400 non-json", status: 400, body: `Bad Request`, want: BadRequest},
		{name: "400 empty", status: 400, want: BadRequest},
		{name: "400 wrong types tolerated", status: 400, body: `{"code":"400","error":"Some devices are silenced","silenced_devices":["x"],"eps_threshold":"30"}`, want: Silenced},
		{name: "400 one field of the wrong type", status: 400, body: `{"code":400,"throttled_events":"oops","silenced_devices":["x"]}`,
			want: Silenced, check: func(t *testing.T, r Result) { eq(t, r.SilencedDevices, []string{"x"}) }},
		{name: "413", status: 413, body: `{"code":413,"error":"Payload too large"}`, want: TooLarge},
		{name: "413 html", status: 413, body: `<html>too big</html>`, want: TooLarge},
		{name: "500", status: 500, body: `{"code":500}`, want: Retryable},
		{name: "502 html", status: 502, body: `<html>bad gateway</html>`, want: Retryable},
		{name: "503 retry-after", status: 503, body: ``, want: Retryable},
		{name: "504", status: 504, want: Retryable},
		{name: "403 waf", status: 403, body: `{"code":403,"error":"Forbidden"}`, want: Retryable},
		{name: "418 unknown", status: 418, body: `teapot`, want: Retryable},
		{name: "unknown status, body code 429", status: 499, body: `{"code":429,"throttled_devices":{"d":40}}`, want: Throttled},
		{name: "unknown status, body code 400 invalid", status: 422, body: `{"code":400,"events_with_invalid_fields":{"time":[0]}}`, want: Invalid},
		{name: "unknown status, body code 500", status: 499, body: `{"code":500}`, want: Retryable},
		{name: "200 with error code stays ok", status: 200, body: `{"code":400}`, want: OK},
		{name: "refused", err: &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, want: Retryable},
		{name: "reset", err: &net.OpError{Op: "read", Err: syscall.ECONNRESET}, want: Retryable},
		{name: "dns", err: &net.DNSError{Err: "no such host", Name: "x.invalid", IsNotFound: true}, want: Retryable},
		{name: "timeout", err: fasthttp.ErrTimeout, want: Retryable, check: func(t *testing.T, r Result) {
			eq(t, r.StatusLabel(), "timeout")
		}},
		{name: "eof", err: io.EOF, want: Retryable, check: func(t *testing.T, r Result) {
			eq(t, r.StatusLabel(), "error")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Classify(tt.status, []byte(tt.body), "", tt.err)
			if r.Kind != tt.want {
				t.Fatalf("kind %v, want %v (answer %q)", r.Kind, tt.want, r.Answer)
			}
			if tt.err == nil && !strings.HasPrefix(string(r.Answer), fmt.Sprintf("HTTP %d: ", tt.status)) {
				t.Fatalf("answer %q", r.Answer)
			}
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}

func TestClassifyAnswerTruncated(t *testing.T) {
	r := Classify(500, []byte(strings.Repeat("x", 10*MaxAnswerBytes)), "", nil)
	if len(r.Answer) > MaxAnswerBytes+32 {
		t.Fatalf("answer %d bytes", len(r.Answer))
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tt := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0}, {"7", 7 * time.Second}, {" 2 ", 2 * time.Second}, {"-3", 0}, {"soon", 0},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0},
	} {
		if got := RetryAfter(tt.in, now); got != tt.want {
			t.Errorf("RetryAfter(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
	r := Classify(503, nil, "5", nil)
	if r.RetryAfter != 5*time.Second || r.Kind != Retryable {
		t.Fatalf("%+v", r)
	}
}

func FuzzClassify(f *testing.F) {
	f.Add(400, []byte(`{"code":400,"events_with_invalid_fields":{"time":[1]}}`), "3")
	f.Add(429, []byte(`{"throttled_devices":{"a":1},"throttled_events":[0]}`), "")
	f.Add(499, []byte(`{"code":413}`), "Wed, 21 Oct 2015 07:28:00 GMT")
	f.Fuzz(func(t *testing.T, status int, body []byte, ra string) {
		r := Classify(status, body, ra, nil)
		if r.Kind > Fatal {
			t.Fatalf("kind %d", r.Kind)
		}
		if status == 200 && r.Kind != OK {
			t.Fatalf("200 classified %v", r.Kind)
		}
		if r.RetryAfter < 0 {
			t.Fatal("negative retry-after")
		}
	})
}

func eq(t *testing.T, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}
