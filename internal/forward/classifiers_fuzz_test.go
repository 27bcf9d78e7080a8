package forward_test

import (
	"testing"

	"github.com/svcrelay/relay/internal/forward"
)

// FuzzClassifierCheckBody: never panics; an accepted body has a csvDefinition object
// with a string csvText within the limit.
func FuzzClassifierCheckBody(f *testing.F) {
	f.Add(classifierDef)
	f.Add(`{"csvDefinition":null}`)
	f.Add(`{"csvDefinition":{"csvText":1}}`)
	f.Add(`{"csvDefinition":[]}`)
	f.Fuzz(func(t *testing.T, body string) {
		if p := forward.CheckClassifier([]byte(body)); p != nil && (p.Status == 0 || p.Msg == "") {
			t.Fatalf("status %d with message %q", p.Status, p.Msg)
		}
		forward.ValidClassifierName(body)
	})
}
