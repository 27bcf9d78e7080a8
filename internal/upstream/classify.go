package upstream

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// Kind is the class of an upstream answer.
type Kind uint8

const (
	// OK: 200, everything in the request was ingested.
	OK Kind = iota
	// Throttled: 429; the devices, users and event indexes it names are over
	// the rate limit (nothing of the request was ingested).
	Throttled
	// Silenced: 400 naming silenced, over-quota or throttled devices,
	// users or events.
	Silenced
	// Invalid: 400 naming events with invalid or missing fields
	// (InvalidEvents; the upstream names the first bad event per field).
	Invalid
	// BadRequest: 400 that names no event (the caller bisects).
	BadRequest
	// InvalidAPIKey: the api_key was refused; retrying cannot help.
	InvalidAPIKey
	// TooLarge: 413, the body is over the upstream's size limit.
	TooLarge
	// Retryable: 5xx, time-out, refused or broken connection, DNS failure,
	// or any unexpected status; RetryAfter may hint a wait.
	Retryable
	// Fatal: the request can never succeed as configured (404/405, 400
	// "Invalid request path", 401): the URL or credentials are wrong.
	Fatal
)

var kindNames = [...]string{"ok", "throttled", "silenced", "invalid", "bad_request", "invalid_api_key", "too_large", "retryable", "fatal"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// MaxAnswerBytes bounds the body kept in Result.Answer.
const MaxAnswerBytes = 2048

// Result is a classified upstream answer.
type Result struct {
	Kind Kind
	// Status is the HTTP status, 0 when no answer arrived (see Err).
	Status int
	// Err is the transport error when no answer arrived.
	Err error
	// RetryAfter is the answer's Retry-After, 0 when absent (unclamped).
	RetryAfter time.Duration
	// EPSThreshold is the body's eps_threshold (429 and silenced 400).
	EPSThreshold int
	// What the body names: throttled_devices, throttled_users,
	// throttled_events, silenced_devices, silenced_events and
	// exceeded_daily_quota_devices (the ids of a JSON object sorted).
	ThrottledDevices, ThrottledUsers []string
	ThrottledEvents                  []int
	SilencedDevices                  []string
	SilencedEvents                   []int
	QuotaDevices                     []string
	// InvalidEvents maps an event index to the reason "invalid_fields" or
	// "missing_fields" (from events_with_invalid_fields /
	// events_with_missing_fields).
	InvalidEvents map[int]string
	// Answer is "HTTP <status>: <body truncated to MaxAnswerBytes>", or
	// "error: <transport error>", for dead letters and logs.
	Answer []byte
}

// StatusLabel is the value of the status label of relay_upstream_requests_total:
// the HTTP status, or "timeout" / "error" when no answer arrived.
func (r *Result) StatusLabel() string {
	if r.Status != 0 {
		return strconv.Itoa(r.Status)
	}
	if isTimeout(r.Err) {
		return "timeout"
	}
	return "error"
}

// body is the union of the upstream's JSON answer fields. Maps whose values
// are rates or counts are kept raw: only their keys matter.
type body struct {
	Code             json.RawMessage            `json:"code"`
	Error            string                     `json:"error"`
	MissingField     string                     `json:"missing_field"`
	EPSThreshold     json.Number                `json:"eps_threshold"`
	ThrottledDevices map[string]json.RawMessage `json:"throttled_devices"`
	ThrottledUsers   map[string]json.RawMessage `json:"throttled_users"`
	ThrottledEvents  []int                      `json:"throttled_events"`
	SilencedDevices  []string                   `json:"silenced_devices"`
	SilencedEvents   []int                      `json:"silenced_events"`
	QuotaDevices     map[string]json.RawMessage `json:"exceeded_daily_quota_devices"`
	InvalidFields    map[string][]int           `json:"events_with_invalid_fields"`
	MissingFields    map[string][]int           `json:"events_with_missing_fields"`
}

// Classify classifies an answer: status, body, the Retry-After header ("" when
// absent) and the transport error (non-nil when no answer arrived). Unknown
// or malformed input is Retryable.
func Classify(status int, respBody []byte, retryAfter string, err error) Result {
	if err != nil {
		return Result{Kind: Retryable, Err: err, Answer: []byte("error: " + err.Error())}
	}
	r := Result{Status: status, Answer: answer(status, respBody)}
	if status == http.StatusOK {
		// Nothing of a 200's body changes what happens next (kindOf is OK
		// whatever it says): not decoded, on the delivery's hot path.
		r.Kind = OK
		return r
	}
	r.RetryAfter = RetryAfter(retryAfter, time.Now())
	// A type mismatch in one field still fills the others: only a body
	// that is not JSON at all (a SyntaxError, b untouched) is not parsed.
	var b body
	var se *json.SyntaxError
	parsed := len(respBody) > 0 && !errors.As(json.Unmarshal(respBody, &b), &se)
	if parsed {
		r.fill(&b)
	}
	r.Kind = kindOf(status, &b, parsed)
	return r
}

func (r *Result) fill(b *body) {
	if n, err := b.EPSThreshold.Int64(); err == nil {
		r.EPSThreshold = int(n)
	}
	r.ThrottledDevices = keys(b.ThrottledDevices)
	r.ThrottledUsers = keys(b.ThrottledUsers)
	r.ThrottledEvents = b.ThrottledEvents
	r.SilencedDevices = b.SilencedDevices
	r.SilencedEvents = b.SilencedEvents
	r.QuotaDevices = keys(b.QuotaDevices)
	for reason, m := range map[string]map[string][]int{"invalid_fields": b.InvalidFields, "missing_fields": b.MissingFields} {
		for _, idx := range m {
			for _, i := range idx {
				if r.InvalidEvents == nil {
					r.InvalidEvents = make(map[int]string)
				}
				if _, ok := r.InvalidEvents[i]; !ok || reason == "invalid_fields" {
					r.InvalidEvents[i] = reason
				}
			}
		}
	}
}

func kindOf(status int, b *body, parsed bool) Kind {
	switch {
	case status == http.StatusOK:
		return OK
	case status == http.StatusTooManyRequests:
		return Throttled
	case status == http.StatusRequestEntityTooLarge:
		return TooLarge
	case status == http.StatusBadRequest:
		return kind400(b)
	case status == http.StatusUnauthorized:
		if strings.EqualFold(b.Error, "Invalid API key") {
			return InvalidAPIKey
		}
		return Fatal
	case status == http.StatusNotFound, status == http.StatusMethodNotAllowed:
		return Fatal
	case status >= 500:
		return Retryable
	}
	// An unknown status: the body's code decides when it is a known one.
	if parsed {
		if code, err := strconv.Atoi(strings.TrimSpace(string(b.Code))); err == nil && code != status {
			switch code {
			case http.StatusOK, http.StatusTooManyRequests, http.StatusRequestEntityTooLarge, http.StatusBadRequest:
				return kindOf(code, b, parsed)
			}
		}
	}
	return Retryable
}

func kind400(b *body) Kind {
	switch {
	case strings.EqualFold(b.Error, "Invalid API key"):
		return InvalidAPIKey
	case len(b.SilencedDevices) > 0 || len(b.SilencedEvents) > 0 || len(b.QuotaDevices) > 0 ||
		len(b.ThrottledDevices) > 0 || len(b.ThrottledEvents) > 0 || len(b.ThrottledUsers) > 0:
		return Silenced
	case len(b.InvalidFields) > 0 || len(b.MissingFields) > 0:
		return Invalid
	case strings.EqualFold(b.Error, "Invalid request path"):
		return Fatal
	}
	return BadRequest
}

// keys returns m's keys sorted (nil when none).
func keys(m map[string]json.RawMessage) []string { return slices.Sorted(maps.Keys(m)) }

func answer(status int, b []byte) []byte {
	if len(b) > MaxAnswerBytes {
		b = b[:MaxAnswerBytes]
	}
	out := fmt.Appendf(nil, "HTTP %d: ", status)
	return append(out, b...)
}

// RetryAfter reads a Retry-After value: delay-seconds or an HTTP date
// (relative to now); 0 when absent, bad or past.
func RetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		return time.Duration(min(n, 1<<30)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) ||
		(errors.As(err, &te) && te.Timeout())
}
