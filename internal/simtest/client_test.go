package simtest

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/sim/wiretest"
)

func TestControlClient(t *testing.T) {
	s, url := start(t, sim.Config{})
	ctx := context.Background()
	c := &Control{Base: url}
	body := "oops"
	if err := c.Inject(ctx, FaultSpec{Status: 500, Body: &body}); err != nil {
		t.Fatal(err)
	}
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a"))); a.Status != 500 || string(a.Body) != "oops" {
		t.Fatalf("%d %s", a.Status, a.Body)
	}
	if err := c.Inject(ctx, FaultSpec{Drop: "sideways"}); err == nil {
		t.Fatal("bad spec accepted")
	}
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a")))
	evs, err := c.Events(ctx, "k", 0)
	if err != nil || len(evs) != 1 || string(evs[0].Raw) != wiretest.Event("device1", "a") {
		t.Fatalf("events %+v %v", evs, err)
	}
	reqs, err := c.Requests(ctx, 1)
	if err != nil || len(reqs) != 1 || reqs[0].Status != 200 {
		t.Fatalf("requests %+v %v", reqs, err)
	}
	if err := c.Silence(ctx, "device1"); err != nil {
		t.Fatal(err)
	}
	if got := SilencedDevices(s); len(got) != 1 {
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

const formCT = "application/x-www-form-urlencoded"

func umForm(key, mapping string) []byte {
	return []byte(url.Values{"api_key": {key}, "mapping": {mapping}}.Encode())
}

func giForm(key, ident string) []byte {
	return []byte(url.Values{"api_key": {key}, "identification": {ident}}.Encode())
}

// TestUserMapControl: the control route and its Go client, for a sim in
// another process.
func TestUserMapControl(t *testing.T) {
	s, base := start(t, sim.Config{})
	c := &Control{Base: base}
	ctx := context.Background()
	if err := c.SetUserMapRate(ctx, 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.SetUserMapOrg(ctx, "k1", "o"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetUserMapOrg(ctx, "k2", "o"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetSecretKey(ctx, "k1", "s"); err != nil {
		t.Fatal(err)
	}
	wiretest.Post(t, base+"/usermap", umForm("k1", `[{"user_id":"a","global_user_id":"g"},{"user_id":"b","global_user_id":"g"}]`), "Content-Type", formCT)
	if a := wiretest.Post(t, base+"/usermap", umForm("k2", `[{"user_id":"c","global_user_id":"g"},{"user_id":"d","global_user_id":"g"}]`), "Content-Type", formCT); a.Status != 429 {
		t.Fatalf("shared org limit 3: %d", a.Status)
	}
	st, err := c.UserMap(ctx)
	if err != nil || len(st.Calls) != 2 || len(st.Batches) != 1 || st.Throttled != 1 || st.Batches[0].Org != "o" {
		t.Fatalf("%+v %v", st, err)
	}
	wiretest.Post(t, base+"/groupidentify", giForm("k1", `[{"group_type":"a","group_value":"b"}]`), "Content-Type", formCT)
	gis, err := c.GroupIdentifies(ctx, "k1")
	if err != nil || len(gis) != 1 || gis[0].GroupValue != "b" {
		t.Fatalf("%+v %v", gis, err)
	}
	if got := MappingCalls(s); len(got) != 2 {
		t.Fatalf("%d calls", len(got))
	}
}
