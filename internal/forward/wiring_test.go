package forward_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/forward"
	ft "github.com/svcrelay/relay/internal/forward/forwardtest"
)

// TestWiredOnAdminListener registers the four APIs on the real admin
// listener (as cmd/relay does) with one registry: no route or metric
// clashes, the token check of ModeForward applies, and each API reaches
// the simulator with the right scheme.
func TestWiredOnAdminListener(t *testing.T) {
	env := ft.Start(t, forward.Config{})
	c := forward.APIConfig{URL: baseurl.NewRef(env.SimURL)}
	reg := prometheus.NewRegistry()
	base := ft.ServeWired(t, reg, env.Creds, forward.Experiments(forward.APIConfig{URL: baseurl.NewRef(env.SimURL)}), forward.SCIM(c), forward.Classifiers(forward.APIConfig{URL: baseurl.NewRef(env.SimURL)}), forward.Taxonomy(c))

	for _, c := range []struct{ method, path, auth string }{
		{"GET", "/api/1/experiments", "bearer"},
		{"GET", "/scim/1/Users", "bearer"},
		{"GET", "/api/2/channel-classifiers", "basic"},
		{"GET", "/api/2/taxonomy/event", "basic"},
	} {
		n := env.Calls()
		if r := ft.Do(t, c.method, base+c.path, "", ft.Injected()...); r.Status != 200 {
			t.Errorf("%s %s: %v", c.method, c.path, r)
		}
		if got := env.LastCall(t, n+1); got.Path != c.path || got.Auth != c.auth {
			t.Errorf("%s %s: sim saw %+v", c.method, c.path, got)
		}
		if r := ft.Do(t, c.method, base+c.path, ""); r.Status != 401 {
			t.Errorf("%s %s without token: %v", c.method, c.path, r)
		}
		if r := ft.Do(t, c.method, base+c.path, "", "Proxy-Authorization", "Bearer wrong"); r.Status != 403 {
			t.Errorf("%s %s wrong token: %v", c.method, c.path, r)
		}
	}
	if r := ft.Do(t, "GET", base+"/scim/1/Other", "", ft.Injected()...); r.Status != 404 {
		t.Errorf("unrouted path: %v", r)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	for _, want := range []string{"relay_forward_requests_total", "relay_client_limit_admitted_total"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("metric %s missing from %v", want, names)
		}
	}
}
