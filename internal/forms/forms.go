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

	"go.uber.org/zap"

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
