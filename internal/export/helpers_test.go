package export

import (
	"testing"

	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/forward/forwardtest"
)

// newAPI is an API of upstream with forwardtest.WebCreds, forwarding with
// a default Forwarder.
func newAPI(t testing.TB, upstream string) *API {
	t.Helper()
	fwd, err := forward.New(forward.Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{URL: upstream}, forwardtest.WebCreds(t), fwd, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
