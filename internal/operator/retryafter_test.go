package operator

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestRetryAfterDate: a 429 whose Retry-After is an HTTP date (as the API
// reference allows) is waited out, not retried at the backoff's pace.
func TestRetryAfterDate(t *testing.T) {
	var calls atomic.Int32
	var until atomic.Int64 // Unix nanoseconds of the date sent
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 1 {
			u := time.Now().Add(3 * time.Second).Truncate(time.Second)
			until.Store(u.UnixNano())
			w.Header().Set("Retry-After", u.UTC().Format(http.TimeFormat))
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		if time.Now().UnixNano() < until.Load() {
			t.Errorf("retried before the Retry-After date: %d calls", calls.Load())
		}
	}))
	defer srv.Close()
	c := &common{retryInitial: time.Millisecond, retryMax: time.Minute, retryTime: time.Minute, timeout: time.Minute}
	resp, err := c.newClient("Bearer x").do(context.Background(), http.MethodGet, srv.URL, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := calls.Load(); n != 2 {
		t.Errorf("%d calls, want 2", n)
	}
}
