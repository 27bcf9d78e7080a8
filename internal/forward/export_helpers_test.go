package forward_test

import (
	"testing"

	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/forward/forwardtest"
)

// exportNewAPI is an API of upstream with forwardtest.WebCreds, forwarding with
// a default Forwarder.
func exportNewAPI(t testing.TB, upstream string) forwardtest.Built {
	t.Helper()
	return forwardtest.Build(t, forward.Config{}, forwardtest.WebCreds(t), forward.Export(forward.APIConfig{URL: baseurl.NewRef(upstream)}))
}
