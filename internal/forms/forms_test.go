package forms

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
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

// Handler reads the api_key and the items' field from a form body or the
// query (the body's first, or the query's with QueryFirst; a body of
// another type is no form), and counts the query in the size with
// QueryFirst.
func TestHandlerReadsForm(t *testing.T) {
	for _, tc := range []struct {
		queryFirst        bool
		query, body, ct   string
		wantKey, wantItem string
		status            int
	}{
		{false, "api_key=q&items=query", "api_key=b&items=body&bad=%zz", "application/x-www-form-urlencoded; charset=utf-8", "b", "body", 200},
		{true, "api_key=q&items=query", "api_key=b&items=body&bad=%zz", "application/x-www-form-urlencoded", "q", "query", 200},
		{false, "items=query", "api_key=b", "application/x-www-form-urlencoded", "b", "query", 200},
		{false, "api_key=q&items=query", "api_key=b&items=body", "application/json", "q", "query", 200},
		{false, "api_key=q&items=" + strings.Repeat("x", 50), "", "", "q", strings.Repeat("x", 50), 200},
		{false, "api_key=q&items=query", strings.Repeat("x", 50), "", "", "", 413},
		{true, "api_key=q&items=" + strings.Repeat("x", 50), "", "", "", "", 413},
	} {
		var key, item string
		var appended int
		in, err := NewIntake(IntakeConfig{Name: "test", Kind: storage.KindUserMap, Field: "n"},
			appendFunc(func(_ context.Context, req storage.Request) error { appended = req.Batch.Len(); return nil }), nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest("POST", "/x?"+tc.query, strings.NewReader(tc.body))
		r.Header.Set("Content-Type", tc.ct)
		w := httptest.NewRecorder()
		Handler(in, Shape{Field: "items", MaxBodyBytes: 50, QueryFirst: tc.queryFirst}, func(_ Shape, apiKey string, v []byte) ([]rec, *ValidationError) {
			key, item = apiKey, string(v)
			return []rec{{}}, nil
		}).ServeHTTP(w, r)
		if w.Code != tc.status || key != tc.wantKey || item != tc.wantItem || tc.status == 200 && appended != 1 {
			t.Errorf("%+v: %d %s, api_key %q, items %q, %d appended", tc, w.Code, w.Body, key, item, appended)
		}
	}
}

type rec struct{}

func (rec) Record() storage.Record { return storage.Record{Data: []byte("{}")} }

// Each reads one object or an array of 1 to MaxItems before it reads the
// items.
func TestEachItems(t *testing.T) {
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
		{"[1]", 0, "invalid_type", "mapping[0]: must be an object"},
		{"[{]", 0, "invalid_json", "mapping: invalid JSON array of objects: syntax error at byte 3"},
		{"{", 0, "invalid_json", "mapping: invalid JSON object"},
		{`"x"`, 0, "invalid_json", "mapping: must be a JSON array of objects (or one object)"},
		{`[{},{},{}]`, 0, "too_many", "mapping: 3 mappings; at most 2 per request"},
	}
	s := Shape{Field: "mapping", Noun: "mappings", TooMany: "too_many", MaxItems: 2, MaxBodyBytes: 1000, ItemFields: []string{"a", "b"}}
	for _, tt := range tests {
		items, err := Each(s, "k", []byte(tt.in), func(int, map[string]json.RawMessage, []byte) (int, *ValidationError) { return 0, nil })
		if tt.reason == "" {
			if err != nil || len(items) != tt.n {
				t.Errorf("Each(%q) = %d items, %v; want %d", tt.in, len(items), err, tt.n)
			}
			continue
		}
		if err == nil || err.Status != 400 || err.Reason != tt.reason || err.Msg != tt.message {
			t.Errorf("Each(%q) = %+v, want 400 %s %q", tt.in, err, tt.reason, tt.message)
		}
	}
}
