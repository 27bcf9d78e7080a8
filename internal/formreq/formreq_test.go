package formreq

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/spool"
)

func TestSpoolFailed(t *testing.T) {
	for _, tc := range []struct {
		err    error
		reason string
		msg    string
	}{
		{fmt.Errorf("append: %w", spool.ErrFull), "spool_full", `{"code":503,"error":"Spool full, retry later"}`},
		{spool.ErrDiskLow, "disk_low", `{"code":503,"error":"Disk space low, retry later"}`},
		{spool.ErrClosed, "shutting_down", `{"code":503,"error":"Service is shutting down"}`},
		{errors.New("bbolt: broken"), "spool_error", `{"code":503,"error":"Service unavailable"}`},
	} {
		rejected := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"reason"})
		r := NewRejecter("test", zap.NewNop(), rejected, 4200*time.Millisecond)
		var ctx fasthttp.RequestCtx
		r.SpoolFailed(&ctx, tc.err)
		if got := ctx.Response.StatusCode(); got != 503 {
			t.Errorf("%v: status %d, want 503", tc.err, got)
		}
		if got := string(ctx.Response.Header.Peek(fasthttp.HeaderRetryAfter)); got != "5" {
			t.Errorf("%v: Retry-After %q, want 5 (4.2 s rounded up)", tc.err, got)
		}
		if got := string(ctx.Response.Body()); got != tc.msg {
			t.Errorf("%v: body %s, want %s", tc.err, got, tc.msg)
		}
		if n := count(t, rejected.WithLabelValues(tc.reason)); n != 1 {
			t.Errorf("%v: rejected{reason=%s} = %v, want 1", tc.err, tc.reason, n)
		}
	}
}

func TestReject(t *testing.T) {
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"reason"})
	r := NewRejecter("test", zap.NewNop(), rejected, time.Second)
	var ctx fasthttp.RequestCtx
	r.Reject(&ctx, Bad("missing_field", "api_key: %s", `missing "x"`))
	if ctx.Response.StatusCode() != 400 || string(ctx.Response.Header.ContentType()) != "application/json" ||
		string(ctx.Response.Body()) != `{"code":400,"error":"api_key: missing \"x\""}` {
		t.Errorf("answer %d %s %s", ctx.Response.StatusCode(), ctx.Response.Header.ContentType(), ctx.Response.Body())
	}
	if n := count(t, rejected.WithLabelValues("missing_field")); n != 1 {
		t.Errorf("rejected{missing_field} = %v, want 1", n)
	}
}

// count reads a counter's value.
func count(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
