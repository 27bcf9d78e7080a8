package forward

import (
	"net/http/httptest"
	"testing"
)

// FuzzSCIMChecks: the body validators never panic on any input.
func FuzzSCIMChecks(f *testing.F) {
	f.Add(`{"schemas":["` + SCIMPatchOpSchema + `"],"Operations":[{"op":"add","path":"members","value":[{"value":"a@b.co"}]}]}`)
	f.Add(`{"id":"a@b.co","userName":"a@b.co"}`)
	f.Add(`{"displayName":"g","members":null}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest("PATCH", "/scim/1/Groups/1", nil)
		r.SetPathValue("id", "1")
		scimPatch(r, []byte(body))
		scimUser(r, []byte(body))
		scimGroup(r, []byte(body))
		ValidEmail(body)
	})
}
