package forms

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// ValidationError is a request the relay refuses locally.
type ValidationError struct {
	Status int // 400, 413 or 503
	Msg    string
	Reason string // metric label
}

func (e *ValidationError) Error() string { return e.Msg }

// Bad returns a 400 ValidationError with reason and a formatted message.
func Bad(reason, format string, args ...any) *ValidationError {
	return &ValidationError{Status: http.StatusBadRequest, Msg: fmt.Sprintf(format, args...), Reason: reason}
}

// jsonErr says where a JSON array did not parse, without echoing it.
func jsonErr(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("an element is %s, not an object", te.Value)
	}
	return "malformed"
}

// Reject counts e by its Reason and answers it: {"code":STATUS,"error":"..."}.
func (in *Intake) Reject(w http.ResponseWriter, e *ValidationError) {
	in.rejected.WithLabelValues(e.Reason).Inc()
	b, _ := json.Marshal(struct {
		Code  int    `json:"code"`
		Error string `json:"error"`
	}{e.Status, e.Msg})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	w.Write(b)
}

// SpoolFailed answers a failed spool append: 503 with Retry-After, reason
// spool_full, disk_low, shutting_down or (logged) spool_error.
func (in *Intake) SpoolFailed(w http.ResponseWriter, err error) {
	msg, reason := "Service unavailable", "spool_error"
	switch {
	case errors.Is(err, spool.ErrFull):
		msg, reason = "Spool full, retry later", "spool_full"
	case errors.Is(err, spool.ErrDiskLow):
		msg, reason = "Disk space low, retry later", "disk_low"
	case errors.Is(err, spool.ErrTooManyKeyLanes): // --max-lanes-per-key, before ErrTooManyLanes, which it wraps
		msg, reason = "Too many lanes for this api_key, retry later", "too_many_key_lanes"
	case errors.Is(err, spool.ErrTooManyLanes): // --max-lanes
		msg, reason = "Too many lanes, retry later", "too_many_lanes"
	case errors.Is(err, storage.ErrFull): // fleet mode
		msg, reason = "Spool full, retry later", "spool_full"
	case errors.Is(err, spool.ErrClosed): // before: the local store's is also unavailable
		msg, reason = "Service is shutting down", "shutting_down"
	case errors.Is(err, storage.ErrUnavailable):
		msg, reason = "Spool unavailable, retry later", "spool_unavailable"
	default:
		in.log.Error(in.cfg.Name+": spool append failed", zap.Error(err))
	}
	w.Header().Set("Retry-After", in.retryAfter)
	in.Reject(w, &ValidationError{Status: http.StatusServiceUnavailable, Msg: msg, Reason: reason})
}
