package adminapi

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzDecodeBulk: the replay/purge body parser never panics, and what it
// accepts selects by ids or by a filter (never both, never neither), within
// the limits, with an api_key only for replay and only a clean one. An error
// never quotes the api_key given.
func FuzzDecodeBulk(f *testing.F) {
	for _, s := range []string{
		`{"ids":[1,2]}`, `{"filter":{}}`, `{"filter":{"lane":"events-1a2b3c4d","reason":"silenced"},"limit":5}`,
		`{"ids":[1],"api_key":"k"}`, `{"ids":[1],"api_key":"a\nb"}`, `{}`, `null`, `[]`, `{"ids":[1]} x`,
		`{"ids":[18446744073709551615]}`, `{"ids":[-1]}`, `{"filter":null,"ids":null}`, `{"limit":1e9,"filter":{}}`,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, replay bool) {
		r := httptest.NewRequest("POST", "/relay/v1/deadletters/replay", bytes.NewReader(body))
		b, err := decodeBulk(r, replay)
		if err != nil {
			if b.APIKey != "" && len(b.APIKey) > 3 && strings.Contains(err.Error(), b.APIKey) {
				t.Fatalf("error %q quotes the api_key", err)
			}
			return
		}
		if (len(b.IDs) > 0) == (b.Filter != nil) {
			t.Fatalf("accepted %q: ids %v filter %v", body, b.IDs, b.Filter)
		}
		if b.Limit < 1 || b.Limit > MaxBulkLimit || len(b.IDs) > MaxBulkLimit {
			t.Fatalf("accepted %q: limit %d, %d ids", body, b.Limit, len(b.IDs))
		}
		if b.APIKey != "" {
			if !replay || len(b.APIKey) > MaxAPIKeyLen || strings.TrimSpace(b.APIKey) != b.APIKey ||
				strings.ContainsFunc(b.APIKey, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
				t.Fatalf("accepted api_key %q (replay %v)", b.APIKey, replay)
			}
		}
	})
}

// TestDecodeBulkTooLarge: a body over the route's bound is refused as such,
// not as invalid JSON.
func TestDecodeBulkTooLarge(t *testing.T) {
	r := httptest.NewRequest("POST", "/relay/v1/deadletters/purge", strings.NewReader(`{"ids":[`+strings.Repeat("1,", 100)+`1]}`))
	r.Body = http.MaxBytesReader(httptest.NewRecorder(), r.Body, 64)
	if _, err := decodeBulk(r, false); err == nil || !strings.Contains(err.Error(), "request body too large") {
		t.Fatalf("error %v, want the body's size", err)
	}
}
