package export

import (
	"testing"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/forward/forwardtest"
)

// The admin listener, simulator and client helpers are forwardtest's
// (ServeAdmin, StartSim, Call); these are the package's own.

const credsYAML = `
projects:
  - name: web
    api_key: "proj"
    secret_key: "proj-secret"
`

func testCreds(t testing.TB) *credentials.Store { return forwardtest.ParseCreds(t, credsYAML) }

func newAPI(t testing.TB, upstream string) *API {
	t.Helper()
	fwd, err := forward.New(forward.Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{URL: upstream}, testCreds(t), fwd, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
