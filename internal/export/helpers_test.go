package export

import (
	"testing"

	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/forward/forwardtest"
)

// newAPI is an API of upstream with forwardtest.WebCreds, forwarding with
// a default Forwarder.
func newAPI(t testing.TB, upstream string) forwardtest.Built {
	t.Helper()
	return forwardtest.Build(t, forward.Config{}, forwardtest.WebCreds(t), API(upstream))
}
