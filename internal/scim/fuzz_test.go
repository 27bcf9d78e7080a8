package scim

import (
	"testing"

	"github.com/svcrelay/relay/internal/forward"
)

// FuzzChecks: the body validators never panic on any input.
func FuzzChecks(f *testing.F) {
	f.Add(`{"schemas":["` + PatchOpSchema + `"],"Operations":[{"op":"add","path":"members","value":[{"value":"a@b.co"}]}]}`)
	f.Add(`{"id":"a@b.co","userName":"a@b.co"}`)
	f.Add(`{"displayName":"g","members":null}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, body string) {
		p := forward.Params{"id": "1"}
		checkPatch(nil, p, []byte(body))
		checkUser(nil, p, []byte(body))
		checkGroup(nil, p, []byte(body))
		ValidEmail(body)
	})
}
