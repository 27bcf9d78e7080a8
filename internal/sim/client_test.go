package sim

import (
	"context"
	"testing"
)

func TestControlClient(t *testing.T) {
	s, url := start(t, Config{})
	ctx := context.Background()
	c := &Control{Base: url}
	body := "oops"
	if err := c.Inject(ctx, FaultSpec{Status: 500, Body: &body}); err != nil {
		t.Fatal(err)
	}
	if a := post(t, url+"/2/httpapi", env("k", ev("device1", "a"))); a.Status != 500 || string(a.Body) != "oops" {
		t.Fatalf("%d %s", a.Status, a.Body)
	}
	if err := c.Inject(ctx, FaultSpec{Drop: "sideways"}); err == nil {
		t.Fatal("bad spec accepted")
	}
	post(t, url+"/2/httpapi", env("k", ev("device1", "a")))
	evs, err := c.Events(ctx, "k", 0)
	if err != nil || len(evs) != 1 || string(evs[0].Raw) != ev("device1", "a") {
		t.Fatalf("events %+v %v", evs, err)
	}
	reqs, err := c.Requests(ctx, 1)
	if err != nil || len(reqs) != 1 || reqs[0].Status != 200 {
		t.Fatalf("requests %+v %v", reqs, err)
	}
	if err := c.Silence(ctx, "device1"); err != nil {
		t.Fatal(err)
	}
	if got := s.SilencedDevices(); len(got) != 1 {
		t.Fatalf("silenced %v", got)
	}
	if err := c.Unsilence(ctx, "device1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Down(ctx, Down503, 0); err != nil || s.IsDown() != Down503 {
		t.Fatalf("down %v %q", err, s.IsDown())
	}
	if err := c.Up(ctx); err != nil || s.IsDown() != "" {
		t.Fatal(err)
	}
	if err := c.SetLatency(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.SetDailyQuota(ctx, 0); err != nil {
		t.Fatal(err)
	}
	st, err := c.Stats(ctx)
	if err != nil || st.Ingested != 1 || st.ByStatus[500] != 1 {
		t.Fatalf("stats %+v %v", st, err)
	}
	if err := c.Reset(ctx); err != nil || s.Count() != 0 {
		t.Fatal(err)
	}
	if err := c.ClearFaults(ctx); err != nil {
		t.Fatal(err)
	}
}
