package forms

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// Form is a form request read in full: its body, the body's fields (for
// an application/x-www-form-urlencoded body) and the query's.
type Form struct {
	Body        []byte
	Post, Query url.Values
}

// ReadForm reads r's body (bounded by the admin listener) and its form
// fields. Malformed fields are skipped, as fasthttp's args parser did.
func ReadForm(r *http.Request) (Form, error) {
	f := Form{Query: r.URL.Query(), Post: url.Values{}}
	if r.Body != nil {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return f, fmt.Errorf("read body: %w", err)
		}
		f.Body = b
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct == "application/x-www-form-urlencoded" {
		f.Post, _ = url.ParseQuery(string(f.Body))
	}
	return f, nil
}

// First returns the first value of name in the first of vss that has it
// ("" when none has): each route says whether the body or the query wins.
func First(name string, vss ...url.Values) string {
	for _, vs := range vss {
		if v := vs[name]; len(v) > 0 {
			return v[0]
		}
	}
	return ""
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
	return &ValidationError{Status: http.StatusBadRequest, Msg: fmt.Sprintf(format, args...), Reason: reason}
}

// Items parses the form field name holding one JSON object or a JSON array
// of objects (group identify's identification, usermap's mapping) and
// returns its items: at least one, at most max. A refusal is a 400 naming
// the field: missing_field (missing, empty, an empty array), invalid_json,
// or tooMany (the count of noun and the bound).
func Items(name string, v []byte, max int, tooMany, noun string) ([]json.RawMessage, *ValidationError) {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return nil, Bad("missing_field", "%s: missing or empty", name)
	}
	var raws []json.RawMessage
	switch v[0] {
	case '[':
		if err := json.Unmarshal(v, &raws); err != nil {
			return nil, Bad("invalid_json", "%s: invalid JSON array of objects: %s", name, jsonErr(err))
		}
	case '{':
		if !json.Valid(v) {
			return nil, Bad("invalid_json", "%s: invalid JSON object", name)
		}
		raws = []json.RawMessage{v}
	default:
		return nil, Bad("invalid_json", "%s: must be a JSON array of objects (or one object)", name)
	}
	if len(raws) == 0 {
		return nil, Bad("missing_field", "%s: empty array", name)
	}
	if len(raws) > max {
		return nil, Bad(tooMany, "%s: %d %s; at most %d per request", name, len(raws), noun, max)
	}
	return raws, nil
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

// WriteError answers {"code":status,"error":msg}.
func WriteError(w http.ResponseWriter, status int, msg string) {
	b, _ := json.Marshal(struct {
		Code  int    `json:"code"`
		Error string `json:"error"`
	}{status, msg})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
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
// failures with Retry-After retryAfter rounded up to whole seconds; its log
// lines are sampled (a few a second). log and rejected must not be nil.
func NewRejecter(name string, log *zap.Logger, rejected *prometheus.CounterVec, retryAfter time.Duration) *Rejecter {
	// Every request can fail the same way while the spool does: a few
	// lines a second, the counter has them all.
	log = log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Second, 5, 0)
	}))
	return &Rejecter{name: name, log: log, rejected: rejected,
		retryAfter: strconv.Itoa(int((retryAfter + time.Second - 1) / time.Second))}
}

// Reject counts e by its Reason and answers it.
func (r *Rejecter) Reject(w http.ResponseWriter, e *ValidationError) {
	r.rejected.WithLabelValues(e.Reason).Inc()
	WriteError(w, e.Status, e.Msg)
}

// SpoolFailed answers a failed spool append: 503 with Retry-After, reason
// spool_full, disk_low, shutting_down or (logged) spool_error.
func (r *Rejecter) SpoolFailed(w http.ResponseWriter, err error) {
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
		r.log.Error(r.name+": spool append failed", zap.Error(err))
	}
	w.Header().Set("Retry-After", r.retryAfter)
	r.Reject(w, &ValidationError{Status: http.StatusServiceUnavailable, Msg: msg, Reason: reason})
}
