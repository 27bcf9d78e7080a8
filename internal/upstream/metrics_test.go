package upstream

import (
	"context"
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
)

// TestKindLabelAndLast: requests are counted by their Kind ("other" when
// none), and Last says whether the latest one reached the upstream.
func TestKindLabelAndLast(t *testing.T) {
	_, url := startSim(t, sim.Config{})
	reg := prometheus.NewRegistry()
	c, err := New(Config{Timeout: polltest.Max}, reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Last(); ok {
		t.Fatal("Last before any request")
	}
	ctx := context.Background()
	for _, kind := range []string{"events", "events", ""} {
		if r := c.Do(ctx, &Request{URL: url + "/2/httpapi", Body: []byte(testBody), Kind: kind}); r.Status != 200 {
			t.Fatalf("%+v", r)
		}
	}
	if o, ok := c.Last(); !ok || !o.Reached || o.Status != "200" || o.At.IsZero() {
		t.Fatalf("Last after a 200: %+v %v", o, ok)
	}
	if n := counterValue(t, reg, "events", "200"); n != 2 {
		t.Fatalf("kind=events status=200: %v, want 2", n)
	}
	if n := counterValue(t, reg, "other", "200"); n != 1 {
		t.Fatalf("kind=other status=200: %v, want 1", n)
	}

	// A port nothing listens on: refused, not reached.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	if r := c.Do(ctx, &Request{URL: dead + "/usermap", Body: []byte("x"), Kind: "usermap"}); r.Status != 0 {
		t.Fatalf("%+v", r)
	}
	if o, ok := c.Last(); !ok || o.Reached || o.Status != "error" {
		t.Fatalf("Last after a refused connection: %+v %v", o, ok)
	}
	if n := counterValue(t, reg, "usermap", "error"); n != 1 {
		t.Fatalf("kind=usermap status=error: %v, want 1", n)
	}
}

// counterValue is relay_upstream_requests_total{kind,status} in reg.
func counterValue(t *testing.T, reg *prometheus.Registry, kind, status string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "relay_upstream_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["kind"] == kind && l["status"] == status {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
