package formreq

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/spool"
)

// Route is one route of the admin listener.
type Route struct {
	Method, Path string
	Handler      fasthttp.RequestHandler
	// Forward is true when the caller's own Authorization may be passed to
	// the upstream (the admin token then travels in Proxy-Authorization);
	// false when Authorization: Bearer is the admin token.
	Forward bool
}

// ValidationError is a request the relay refuses locally.
type ValidationError struct {
	Status int // 400, 413 or 503
	Msg    string
	Reason string // metric label
}

func (e *ValidationError) Error() string { return e.Msg }

// Bad returns a 400 ValidationError with reason and a formatted message.
func Bad(reason, format string, args ...any) *ValidationError {
	return &ValidationError{Status: fasthttp.StatusBadRequest, Msg: fmt.Sprintf(format, args...), Reason: reason}
}

// WriteError answers {"code":status,"error":msg}.
func WriteError(ctx *fasthttp.RequestCtx, status int, msg string) {
	b, _ := json.Marshal(struct {
		Code  int    `json:"code"`
		Error string `json:"error"`
	}{status, msg})
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// Rejecter answers and counts the requests a route refuses. Build it with
// NewRejecter.
type Rejecter struct {
	name       string
	log        *zap.Logger
	rejected   *prometheus.CounterVec
	retryAfter string
}

// NewRejecter returns a Rejecter that counts refusals in rejected (label
// "reason"), logs as name (e.g. "groupidentify") to log, and answers spool
// failures with Retry-After retryAfter rounded up to whole seconds. log and
// rejected must not be nil.
func NewRejecter(name string, log *zap.Logger, rejected *prometheus.CounterVec, retryAfter time.Duration) *Rejecter {
	return &Rejecter{name: name, log: log, rejected: rejected,
		retryAfter: strconv.Itoa(int((retryAfter + time.Second - 1) / time.Second))}
}

// Reject counts e by its Reason and answers it.
func (r *Rejecter) Reject(ctx *fasthttp.RequestCtx, e *ValidationError) {
	r.rejected.WithLabelValues(e.Reason).Inc()
	WriteError(ctx, e.Status, e.Msg)
}

// SpoolFailed answers a failed spool append: 503 with Retry-After, reason
// spool_full, disk_low, shutting_down or (logged) spool_error.
func (r *Rejecter) SpoolFailed(ctx *fasthttp.RequestCtx, err error) {
	msg, reason := "Service unavailable", "spool_error"
	switch {
	case errors.Is(err, spool.ErrFull):
		msg, reason = "Spool full, retry later", "spool_full"
	case errors.Is(err, spool.ErrDiskLow):
		msg, reason = "Disk space low, retry later", "disk_low"
	case errors.Is(err, spool.ErrTooManyLanes): // --max-lanes (issue 19)
		msg, reason = "Too many lanes, retry later", "too_many_lanes"
	case errors.Is(err, spool.ErrClosed):
		msg, reason = "Service is shutting down", "shutting_down"
	default:
		r.log.Error(r.name+": spool append failed", zap.Error(err))
	}
	ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, r.retryAfter)
	r.Reject(ctx, &ValidationError{Status: fasthttp.StatusServiceUnavailable, Msg: msg, Reason: reason})
}
