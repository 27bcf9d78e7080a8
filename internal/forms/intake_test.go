package forms

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/upstream"
)

func TestAPIKey(t *testing.T) {
	creds, err := credentials.Parse([]byte(`
projects:
  - name: web
    api_key: "key-web"
    secret_key: "s1"
`))
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("k", event.MaxAPIKeyBytes+1)
	for _, tc := range []struct {
		project, apiKey, want, reason string
	}{
		{"", "key-1", "key-1", ""},
		{"web", "", "key-web", ""},
		{"web", "key-1", "", "conflict"},
		{"nope", "", "", "unknown_project"},
		{"", "", "", "missing_field"},
		{"", long, "", "invalid_api_key"},
	} {
		got, verr := APIKey(creds, tc.project, tc.apiKey)
		reason := ""
		if verr != nil {
			reason = verr.Reason
		}
		if got != tc.want || reason != tc.reason {
			t.Errorf("APIKey(%q, %q) = %q, %q; want %q, %q", tc.project, tc.apiKey, got, reason, tc.want, tc.reason)
		}
	}
	// Without a credentials file every project is unknown.
	if _, verr := APIKey(nil, "web", ""); verr == nil || verr.Reason != "unknown_project" {
		t.Errorf("nil creds: %v", verr)
	}
}

// NewSpooled makes both halves of one kind: the intake appends to the
// lanes of the kind the delivery runs, answers 503 with the default
// Retry-After when the spool refuses, and configuration errors name the
// route.
func TestSpooled(t *testing.T) {
	sp, err := spool.Open(spool.Config{Dir: t.TempDir(), NoSync: true, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	cli, err := upstream.New(upstream.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := delivery.FormConfig{Name: "usermap", Lanes: storage.KindUserMap, URL: func(string) string { return "http://127.0.0.1:1/usermap" },
		Kind: &delivery.Form{Field: "mapping", MaxItems: 10, MaxBodyBytes: 1000}}
	s, err := NewSpooled(out, IntakeConfig{Field: "mappings_accepted"}, Spooling{Store: spool.NewBackend(sp)}, cli, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Pipeline == nil || s.In == nil {
		t.Fatal("a half is missing")
	}
	w := accept(s.In)
	if w.Code != 200 || w.Body.String() != `{"code":200,"mappings_accepted":1}` {
		t.Fatalf("accept: %d %s", w.Code, w.Body)
	}
	lanes := sp.Lanes()
	if len(lanes) != 1 || lanes[0].Key() != (storage.LaneKey{Kind: storage.KindUserMap, APIKey: "key-1"}) {
		t.Fatalf("lanes %v: want one user mapping lane of key-1", lanes)
	}
	sp.Close()
	if w = accept(s.In); w.Code != 503 || w.Header().Get("Retry-After") != "5" {
		t.Fatalf("closed spool: %d, Retry-After %q; want 503 and 5", w.Code, w.Header().Get("Retry-After"))
	}

	out.Kind = nil
	if _, err := NewSpooled(out, IntakeConfig{Field: "f"}, Spooling{Store: spool.NewBackend(sp)}, cli, nil, nil, nil); err == nil || !strings.HasPrefix(err.Error(), "usermap: ") {
		t.Fatalf("bad delivery config: %v", err)
	}
}

// The intake appends to the store it is given (the records as given; no
// request id: the fleet makes a fresh one for each); a full store answers
// 503 with Retry-After and stores nothing.
func TestSpooledStore(t *testing.T) {
	open := func(cfg spool.Config) *spool.Spool {
		cfg.Dir, cfg.NoSync, cfg.MinFreeBytes = t.TempDir(), true, -1
		sp, err := spool.Open(cfg, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sp.Close() })
		return sp
	}
	cli, err := upstream.New(upstream.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	stored := open(spool.Config{})
	st := &swapStore{Backend: spool.NewBackend(stored)}
	out := delivery.FormConfig{Name: "usermap", Lanes: storage.KindUserMap, URL: func(string) string { return "http://127.0.0.1:1/usermap" },
		Kind: &delivery.Form{Field: "mapping", MaxItems: 10, MaxBodyBytes: 1000}}
	s, err := NewSpooled(out, IntakeConfig{Field: "mappings_accepted"}, Spooling{Store: st}, cli, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if w := accept(s.In); w.Code != 200 || w.Body.String() != `{"code":200,"mappings_accepted":1}` {
			t.Fatalf("accept: %d %s", w.Code, w.Body)
		}
	}
	lanes := stored.Lanes()
	if len(lanes) != 1 || lanes[0].Key() != (storage.LaneKey{Kind: storage.KindUserMap, APIKey: "key-1"}) || lanes[0].Stats().Records != 2 {
		t.Fatalf("store lanes %v: want one user mapping lane of key-1 with 2 records", lanes)
	}
	full := open(spool.Config{MaxBytes: 16}) // under one record
	st.Backend = spool.NewBackend(full)
	if w := accept(s.In); w.Code != 503 || w.Header().Get("Retry-After") != "5" {
		t.Fatalf("full store: %d, Retry-After %q; want 503 and 5", w.Code, w.Header().Get("Retry-After"))
	}
	if n := full.Stats().LiveBytes; n != 0 {
		t.Fatalf("full store holds %d bytes", n)
	}
}

// swapStore is a store the test can swap.
type swapStore struct{ *spool.Backend }

// accept sends one user mapping of key-1 through in's Handler.
func accept(in *Intake) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	Handler(in, Shape{Field: "mapping", MaxBodyBytes: 1000}, func(Shape, string, []byte) ([]mapping, *ValidationError) {
		return []mapping{{}}, nil
	}).ServeHTTP(w, httptest.NewRequest("POST", "/usermap?api_key=key-1", nil))
	return w
}

type mapping struct{}

func (mapping) Record() storage.Record {
	return storage.Record{OrderKey: []byte("u"), UserID: []byte("u"), Data: []byte(`{"user_id":"u","global_user_id":"g"}`)}
}
