package formreq

import (
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/event"
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
