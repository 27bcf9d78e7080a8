package scim

import (
	"net/http/httptest"
	"testing"
)

// FuzzChecks: the body validators never panic on any input.
func FuzzChecks(f *testing.F) {
	f.Add(`{"schemas":["` + PatchOpSchema + `"],"Operations":[{"op":"add","path":"members","value":[{"value":"a@b.co"}]}]}`)
	f.Add(`{"id":"a@b.co","userName":"a@b.co"}`)
	f.Add(`{"displayName":"g","members":null}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest("PATCH", "/scim/1/Groups/1", nil)
		r.SetPathValue("id", "1")
		checkPatch(r, []byte(body))
		checkUser(r, []byte(body))
		checkGroup(r, []byte(body))
		ValidEmail(body)
	})
}
