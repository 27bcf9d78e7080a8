package forms

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
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
		r := newIntake(t, 4200*time.Millisecond)
		rejected := r.rejected
		w := httptest.NewRecorder()
		r.SpoolFailed(w, tc.err)
		if got := w.Code; got != 503 {
			t.Errorf("%v: status %d, want 503", tc.err, got)
		}
		if got := w.Header().Get("Retry-After"); got != "5" {
			t.Errorf("%v: Retry-After %q, want 5 (4.2 s rounded up)", tc.err, got)
		}
		if got := w.Body.String(); got != tc.msg {
			t.Errorf("%v: body %s, want %s", tc.err, got, tc.msg)
		}
		if n := count(t, rejected.WithLabelValues(tc.reason)); n != 1 {
			t.Errorf("%v: rejected{reason=%s} = %v, want 1", tc.err, tc.reason, n)
		}
	}
}

func TestReject(t *testing.T) {
	r := newIntake(t, time.Second)
	rejected := r.rejected
	w := httptest.NewRecorder()
	r.Reject(w, Bad("missing_field", "api_key: %s", `missing "x"`))
	if w.Code != 400 || w.Header().Get("Content-Type") != "application/json" ||
		w.Body.String() != `{"code":400,"error":"api_key: missing \"x\""}` {
		t.Errorf("answer %d %s %s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	if n := count(t, rejected.WithLabelValues("missing_field")); n != 1 {
		t.Errorf("rejected{missing_field} = %v, want 1", n)
	}
}

// appendFunc is a storage.Appender.
type appendFunc func(context.Context, storage.Request) error

func (f appendFunc) Append(ctx context.Context, req storage.Request) error { return f(ctx, req) }

// newIntake returns an Intake with Retry-After retryAfter over a store
// that refuses every append.
func newIntake(t *testing.T, retryAfter time.Duration) *Intake {
	t.Helper()
	in, err := NewIntake(IntakeConfig{Name: "test", Kind: storage.KindUserMap, Field: "n", RetryAfter: retryAfter},
		appendFunc(func(context.Context, storage.Request) error { return spool.ErrClosed }), nil, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return in
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

func TestReadForm(t *testing.T) {
	r := httptest.NewRequest("POST", "/x?api_key=q&both=query", strings.NewReader("api_key=b&both=body&bad=%zz"))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	f, err := ReadForm(r)
	if err != nil {
		t.Fatal(err)
	}
	if v := First("both", f.Post, f.Query); v != "body" {
		t.Errorf("post both = %q", v)
	}
	if v := First("both", f.Query, f.Post); v != "query" {
		t.Errorf("query both = %q", v)
	}
	if v := First("api_key", url.Values{}, f.Post); v != "b" {
		t.Errorf("api_key after an empty set = %q", v)
	}
	if v := First("missing", f.Post, f.Query); v != "" {
		t.Errorf("missing field found: %q", v)
	}
	r = httptest.NewRequest("POST", "/x", strings.NewReader("api_key=b"))
	r.Header.Set("Content-Type", "application/json")
	if f, _ := ReadForm(r); len(f.Post) != 0 || string(f.Body) != "api_key=b" {
		t.Errorf("a JSON body parsed as a form: %v", f.Post)
	}
}

func TestItems(t *testing.T) {
	tests := []struct {
		in      string
		n       int    // items, when accepted
		reason  string // when refused
		message string
	}{
		{` {"a":1} `, 1, "", ""},
		{`[{"a":1},{"b":2}]`, 2, "", ""},
		{"  ", 0, "missing_field", "mapping: missing or empty"},
		{"[]", 0, "missing_field", "mapping: empty array"},
		{"[1]", 1, "", ""}, // an item that is no object is the kind's to refuse (parseOne)
		{"[{]", 0, "invalid_json", "mapping: invalid JSON array of objects: syntax error at byte 3"},
		{"{", 0, "invalid_json", "mapping: invalid JSON object"},
		{`"x"`, 0, "invalid_json", "mapping: must be a JSON array of objects (or one object)"},
		{`[{},{},{}]`, 0, "too_many", "mapping: 3 mappings; at most 2 per request"},
	}
	for _, tt := range tests {
		raws, err := Items("mapping", []byte(tt.in), 2, "too_many", "mappings")
		if tt.reason == "" {
			if err != nil || len(raws) != tt.n {
				t.Errorf("Items(%q) = %d items, %v; want %d", tt.in, len(raws), err, tt.n)
			}
			continue
		}
		if err == nil || err.Status != 400 || err.Reason != tt.reason || err.Msg != tt.message {
			t.Errorf("Items(%q) = %+v, want 400 %s %q", tt.in, err, tt.reason, tt.message)
		}
	}
}
