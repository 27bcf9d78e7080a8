package classifiers

import "testing"

// FuzzCheckBody: never panics; an accepted body has a csvDefinition object
// with a string csvText within the limit.
func FuzzCheckBody(f *testing.F) {
	f.Add(def)
	f.Add(`{"csvDefinition":null}`)
	f.Add(`{"csvDefinition":{"csvText":1}}`)
	f.Add(`{"csvDefinition":[]}`)
	f.Fuzz(func(t *testing.T, body string) {
		status, msg := CheckBody([]byte(body))
		if (status == 0) != (msg == "") {
			t.Fatalf("status %d with message %q", status, msg)
		}
		ValidName(body)
	})
}
