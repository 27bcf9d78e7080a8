package forward_test

import (
	"testing"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward/forwardtest"
)

// The admin listener, simulator and client helpers are forwardtest's
// (ServeAdmin, StartSim, Call); these are the package's own.

func dsarTestCreds(t testing.TB) *credentials.Store {
	return forwardtest.ParseCreds(t, forwardtest.WebOrgCredsYAML)
}
