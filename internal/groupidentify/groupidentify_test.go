package groupidentify_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/forms"
	"github.com/svcrelay/relay/internal/forms/formstest"
	"github.com/svcrelay/relay/internal/groupidentify"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/upstream"
)

// env is formstest's relay slice around a GroupIdentify: a spool in a
// temp dir, the simulator upstream, the group identify routes served over
// real HTTP on 127.0.0.1.
type env = formstest.Env[*groupidentify.GroupIdentify]

func newEnv(t *testing.T, simCfg sim.Config, cfg groupidentify.Config) *env {
	t.Helper()
	return newEnvCreds(t, simCfg, cfg, nil)
}

func newEnvCreds(t *testing.T, simCfg sim.Config, cfg groupidentify.Config, creds *credentials.Store) *env {
	t.Helper()
	return formstest.New(t, simCfg, storage.KindGroupIdentify,
		func(simURL string, sp *spool.Spool, client *upstream.Client, reg *prometheus.Registry) (*groupidentify.GroupIdentify, error) {
			if cfg.URL == nil {
				cfg.URL = baseurl.NewRef(simURL)
			}
			if cfg.RetryInitial == 0 {
				cfg.RetryInitial = 5 * time.Millisecond
				cfg.RetryMax = 50 * time.Millisecond
			}
			cfg.Store = spool.NewBackend(sp)
			return groupidentify.New(cfg, client, credentials.NewRef(creds), nil, reg)
		})
}

type answer = formstest.Answer

func postForm(t *testing.T, u string, form url.Values) answer {
	t.Helper()
	return formstest.Do(t, "POST", u, form)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	formstest.WaitFor(t, 10*time.Second, what, cond)
}

func ident(gt, gv string, nprops int) string {
	kv := make([]string, nprops)
	for i := range kv {
		kv[i] = fmt.Sprintf(`"p%d":%d`, i, i)
	}
	return fmt.Sprintf(`{"group_type":%q,"group_value":%q,"group_properties":{"$set":{%s}}}`, gt, gv, strings.Join(kv, ","))
}

func idents(prefix string, n, nprops int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = ident("org", fmt.Sprintf("%s%d", prefix, i), nprops)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// TestValidation: one case per rule of the API reference's "Group
// identification object" ("The identification parameter is a JSON array of
// objects with group_type (string), group_value (string) and
// group_properties (object of properties)") and Limits ("Group identify |
// per request | at most 1024 group identifies, 1024 group properties, 1 MB").
func TestValidation(t *testing.T) {
	e := newEnv(t, sim.Config{}, groupidentify.Config{})
	tests := []struct {
		name    string
		form    url.Values
		status  int
		errPart string // the error must name the field and index
	}{
		{"missing api_key", url.Values{"identification": {idents("a", 1, 1)}}, 400, "api_key"},
		{"empty api_key", url.Values{"api_key": {""}, "identification": {idents("a", 1, 1)}}, 400, "api_key"},
		{"missing identification", url.Values{"api_key": {"k"}}, 400, "identification"},
		{"bad json", url.Values{"api_key": {"k"}, "identification": {`[{"group_type":`}}, 400, "invalid JSON"},
		{"not an array", url.Values{"api_key": {"k"}, "identification": {`"x"`}}, 400, "JSON array"},
		{"element not object", url.Values{"api_key": {"k"}, "identification": {`[` + ident("a", "b", 1) + `,3]`}}, 400, "identification[1]: must be an object"},
		{"missing group_type", url.Values{"api_key": {"k"}, "identification": {`[` + ident("a", "b", 1) + `,{"group_value":"v","group_properties":{}}]`}}, 400, "identification[1].group_type"},
		{"missing group_value", url.Values{"api_key": {"k"}, "identification": {`[{"group_type":"t","group_properties":{}}]`}}, 400, "identification[0].group_value"},
		{"group_value number", url.Values{"api_key": {"k"}, "identification": {`[{"group_type":"t","group_value":5,"group_properties":{}}]`}}, 400, "identification[0].group_value: must be a string"},
		{"group_properties array", url.Values{"api_key": {"k"}, "identification": {`[{"group_type":"t","group_value":"v","group_properties":[]}]`}}, 400, "identification[0].group_properties: must be an object"},
		{"missing group_properties", url.Values{"api_key": {"k"}, "identification": {`[{"group_type":"t","group_value":"v"}]`}}, 400, "identification[0].group_properties"},
		{"unknown operation", url.Values{"api_key": {"k"}, "identification": {`[{"group_type":"t","group_value":"v","group_properties":{"$inc":{"a":1}}}]`}}, 400, "identification[0].group_properties.$inc"},
		{"operation not object", url.Values{"api_key": {"k"}, "identification": {`[{"group_type":"t","group_value":"v","group_properties":{"$set":5}}]`}}, 400, "identification[0].group_properties.$set: must be an object"},
		{"unknown field", url.Values{"api_key": {"k"}, "identification": {`[{"group_type":"t","group_value":"v","group_properties":{},"grp":1}]`}}, 400, "identification[0].grp"},
		{"empty array", url.Values{"api_key": {"k"}, "identification": {`[]`}}, 400, "identification"},
		{"1025 identifies", url.Values{"api_key": {"k"}, "identification": {idents("a", 1025, 0)}}, 400, "1025 group identifies; at most 1024"},
		{"1025 properties", url.Values{"api_key": {"k"}, "identification": {idents("a", 5, 205)}}, 400, "more than 1024 group properties"},
		{"1 MB body", url.Values{"api_key": {"k"}, "identification": {`[{"group_type":"t","group_value":"` + strings.Repeat("x", 1_000_000) + `","group_properties":{}}]`}}, 413, "Payload too large"},
		{"ok: 1024 identifies", url.Values{"api_key": {"k"}, "identification": {idents("a", 1024, 1)}}, 200, ""},
		{"ok: 1024 properties", url.Values{"api_key": {"k"}, "identification": {idents("b", 4, 256)}}, 200, ""},
		{"ok: one object, plain and all operations", url.Values{"api_key": {"k"}, "identification": {`{"group_type":"t","group_value":"v","group_properties":{"plain":1,"$set":{"a":1},"$setOnce":{"b":1},"$add":{"c":1},"$append":{"d":1},"$unset":{"e":"-"}}}`}}, 200, ""},
	}
	want := int64(0)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := postForm(t, e.Base+"/groupidentify", tc.form)
			if a.Status != tc.status {
				t.Fatalf("status %d, want %d: %s", a.Status, tc.status, a.Body)
			}
			if code, _ := a.JSON["code"].(float64); int(code) != tc.status {
				t.Fatalf("body code %v: %s", a.JSON["code"], a.Body)
			}
			if tc.status != 200 {
				if msg, _ := a.JSON["error"].(string); !strings.Contains(msg, tc.errPart) {
					t.Fatalf("error %q does not name %q", msg, tc.errPart)
				}
			} else {
				n, _ := a.JSON["identifications_accepted"].(float64)
				want += int64(n)
			}
			if got := e.LaneRecords("k"); got != want {
				t.Fatalf("spooled %d records, want %d", got, want)
			}
		})
	}
	if want != 1024+4+1 {
		t.Fatalf("accepted %d", want)
	}
}

// TestMergedDeliveredOnce: identifications of many concurrent callers are
// merged into few upstream requests within the limits, each delivered
// exactly once, in acceptance order.
func TestMergedDeliveredOnce(t *testing.T) {
	e := newEnv(t, sim.Config{}, groupidentify.Config{})
	const callers, per, props = 40, 30, 9 // 1200 identifies, 10800 properties
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := postForm(t, e.Base+"/groupidentify", url.Values{"api_key": {"k"}, "identification": {idents(fmt.Sprintf("c%d-", c), per, props)}})
			if a.Status != 200 || a.JSON["identifications_accepted"] != float64(per) {
				t.Errorf("caller %d: %d %s", c, a.Status, a.Body)
			}
		}()
	}
	wg.Wait()
	e.Run()
	waitFor(t, "delivery", func() bool { return len(simtest.GroupIdentifies(e.Sim, "k")) >= callers*per })
	time.Sleep(50 * time.Millisecond) // a duplicate would show by now (can only miss one, never fail a right run)
	got := simtest.GroupIdentifies(e.Sim, "k")
	if len(got) != callers*per {
		t.Fatalf("delivered %d, want %d", len(got), callers*per)
	}
	seen := map[string]int{}
	for _, g := range got {
		seen[g.GroupValue]++
	}
	for v, n := range seen {
		if n != 1 {
			t.Fatalf("%s delivered %d times", v, n)
		}
	}
	// 10800 properties at most 1024 per request: 113 identifies (1017
	// properties) per request, so 11 requests when one read takes the
	// lane's records. A read ends where the spool's memory ends and its
	// file begins, and a read's last request goes out partial: while a
	// checkpoint moves chunks to the file (a slow machine) there are one
	// or two more. Unmerged, the 40 callers' requests would be 40 or more.
	reqs := simtest.GroupIdentifyRequests(e.Sim)
	if reqs < 11 || reqs > 13 {
		t.Fatalf("%d upstream requests, want 11-13 (1200 identifies of 9 properties, 1024 properties each)", reqs)
	}
	// Every caller's identifications arrive in its order.
	last := map[string]int{}
	for _, g := range got {
		var c, i int
		fmt.Sscanf(g.GroupValue, "c%d-%d", &c, &i)
		k := fmt.Sprint(c)
		if prev, ok := last[k]; ok && i != prev+1 {
			t.Fatalf("caller %d: %d after %d", c, i, prev)
		}
		last[k] = i
	}
	waitFor(t, "acks", func() bool { return e.LaneRecords("k") == 0 })
	if v := metricValue(e.Reg, "relay_groupidentify_delivered_total"); v != callers*per {
		t.Fatalf("delivered metric %v", v)
	}
}

// TestIdentifiesLimit: 3000 identifies with one property go out as
// requests of at most 1024.
func TestIdentifiesLimit(t *testing.T) {
	e := newEnv(t, sim.Config{}, groupidentify.Config{})
	for c := range 3 {
		a := postForm(t, e.Base+"/groupidentify", url.Values{"api_key": {"k"}, "identification": {idents(fmt.Sprintf("c%d-", c), 1000, 1)}})
		if a.Status != 200 {
			t.Fatal(a.Status, a.Body)
		}
	}
	e.Run()
	waitFor(t, "delivery", func() bool { return len(simtest.GroupIdentifies(e.Sim, "k")) == 3000 })
	for _, r := range e.Sim.Requests() {
		if r.Path == "/groupidentify" && (r.Events > 1024 || r.BodyBytes >= 1_000_000) {
			t.Fatalf("request of %d identifies, %d bytes", r.Events, r.BodyBytes)
		}
	}
	if n := simtest.GroupIdentifyRequests(e.Sim); n != 3 {
		t.Fatalf("%d requests, want 3 (1024+1024+952)", n)
	}
}

// TestBodyLimitSplit: identifications with large properties are packed under
// 1 MB per request, and a 413 of a smaller upstream limit splits.
func TestBodyLimitSplit(t *testing.T) {
	e := newEnv(t, sim.Config{MaxBodyBytes: 200_000}, groupidentify.Config{})
	big := strings.Repeat("y", 50_000)
	var parts []string
	for i := range 40 {
		parts = append(parts, fmt.Sprintf(`{"group_type":"org","group_value":"v%d","group_properties":{"blob":%q}}`, i, big))
	}
	for _, p := range [][]string{parts[:15], parts[15:30], parts[30:]} {
		if a := postForm(t, e.Base+"/groupidentify", url.Values{"api_key": {"k"}, "identification": {"[" + strings.Join(p, ",") + "]"}}); a.Status != 200 {
			t.Fatal(a.Body)
		}
	}
	e.Run()
	waitFor(t, "delivery", func() bool { return len(simtest.GroupIdentifies(e.Sim, "k")) == 40 })
	waitFor(t, "acks", func() bool { return e.LaneRecords("k") == 0 })
	n413 := 0
	for _, r := range e.Sim.Requests() {
		if r.Status == 413 {
			n413++
		}
	}
	if n413 == 0 {
		t.Fatal("expected 413s from the smaller upstream limit")
	}
	dead, _ := e.Spool.ListDead(context.Background(), storage.DeadFilter{}, 0, 0)
	if len(dead) != 0 {
		t.Fatalf("%d dead letters", len(dead))
	}
	for _, r := range e.Sim.Requests() {
		if r.Path == "/groupidentify" && r.BodyBytes >= 1_000_000 {
			t.Fatalf("request of %d bytes", r.BodyBytes)
		}
	}
}

// TestRetry5xx: 500/502/503/504 and a dropped connection are retried;
// everything is delivered once.
func TestRetry5xx(t *testing.T) {
	e := newEnv(t, sim.Config{}, groupidentify.Config{})
	for _, st := range []int{500, 502, 503, 504} {
		e.Sim.FailNext(1, st)
	}
	e.Sim.DropNext(1, simtest.DropNoAnswer)
	a := postForm(t, e.Base+"/groupidentify", url.Values{"api_key": {"k"}, "identification": {idents("v", 10, 2)}})
	if a.Status != 200 {
		t.Fatal(a.Body)
	}
	e.Run()
	waitFor(t, "delivery", func() bool { return len(simtest.GroupIdentifies(e.Sim, "k")) == 10 })
	waitFor(t, "acks", func() bool { return e.LaneRecords("k") == 0 })
	if e.Sim.PendingFaults() != 0 {
		t.Fatal("faults left")
	}
	if got := len(simtest.GroupIdentifies(e.Sim, "k")); got != 10 {
		t.Fatalf("delivered %d", got)
	}
	if v := metricValue(e.Reg, "relay_groupidentify_retries_total"); v < 5 {
		t.Fatalf("retries %v, want >= 5", v)
	}
}

// TestBadRequestBisect: a 400 naming nothing is bisected; the one bad
// identification becomes a dead letter, the rest is delivered.
func TestBadRequestBisect(t *testing.T) {
	e := newEnv(t, sim.Config{}, groupidentify.Config{})
	simtest.RejectGroupValue(e.Sim, "v7")
	a := postForm(t, e.Base+"/groupidentify", url.Values{"api_key": {"k"}, "identification": {idents("v", 20, 1)}})
	if a.Status != 200 {
		t.Fatal(a.Body)
	}
	e.Run()
	waitFor(t, "acks", func() bool { return e.LaneRecords("k") == 0 })
	got := simtest.GroupIdentifies(e.Sim, "k")
	if len(got) != 19 {
		t.Fatalf("delivered %d, want 19", len(got))
	}
	dead, err := e.Spool.ListDead(context.Background(), storage.DeadFilter{}, 0, 0)
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead %d %v", len(dead), err)
	}
	d := dead[0]
	if d.Reason != "bad_request" || !strings.Contains(string(d.Record.Data), `"v7"`) || d.Lane.Kind != storage.KindGroupIdentify {
		t.Fatalf("dead letter %+v %s", d, d.Record.Data)
	}
	if !strings.Contains(string(d.Answer), "Invalid group identification") {
		t.Fatalf("answer %q", d.Answer)
	}
}

// TestInvalidAPIKeyStopsLane: the lane of a refused api_key stops after one
// request (no loop) and keeps its records; another lane keeps flowing;
// ResumeLane sends the refused request once more.
func TestInvalidAPIKeyStopsLane(t *testing.T) {
	e := newEnv(t, sim.Config{APIKeys: []string{"good"}}, groupidentify.Config{})
	e.Run()
	if a := postForm(t, e.Base+"/groupidentify", url.Values{"api_key": {"bad"}, "identification": {idents("v", 3, 1)}}); a.Status != 200 {
		t.Fatal(a.Body)
	}
	waitFor(t, "stopped gauge", func() bool { return metricValue(e.Reg, "relay_groupidentify_lanes_stopped") == 1 })
	// relay_lane_stopped{lane} covers this kind too.
	if v := metricValue(e.Reg, "relay_lane_stopped"); v != 1 {
		t.Fatalf("relay_lane_stopped sums to %v, want 1", v)
	}
	if a := postForm(t, e.Base+"/groupidentify", url.Values{"api_key": {"good"}, "identification": {idents("v", 3, 1)}}); a.Status != 200 {
		t.Fatal(a.Body)
	}
	waitFor(t, "good lane", func() bool { return len(simtest.GroupIdentifies(e.Sim, "good")) == 3 })
	time.Sleep(100 * time.Millisecond) // a retry loop would show by now (can only miss one, never fail a right run)
	badReqs := func() int {
		n := 0
		for _, r := range e.Sim.Requests() {
			if r.KeyLabel == sim.KeyLabel("bad") {
				n++
			}
		}
		return n
	}
	if n := badReqs(); n != 1 {
		t.Fatalf("%d requests with the refused key, want 1", n)
	}
	if e.LaneRecords("bad") != 3 {
		t.Fatalf("refused lane lost records: %d left", e.LaneRecords("bad"))
	}
	var badLane uint64
	for _, st := range e.C.LaneStatus() {
		if st.Stopped {
			badLane = st.ID
			if st.StopReason != "invalid API key" {
				t.Fatalf("stop reason %q", st.StopReason)
			}
		}
	}
	if err := e.C.ResumeLane(badLane); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "second try", func() bool { return badReqs() == 2 })
	waitFor(t, "stopped again", func() bool { return metricValue(e.Reg, "relay_groupidentify_lanes_stopped") == 1 })
	time.Sleep(100 * time.Millisecond) // as above: a third request would show by now
	if n := badReqs(); n != 2 {
		t.Fatalf("%d requests after one resume, want 2", n)
	}
	if err := e.C.StopLane(12345); !errors.Is(err, delivery.ErrUnknownLane) {
		t.Fatalf("unknown lane: %v", err)
	}
}

// TestOperatorStop: StopLane holds a lane's records in the spool until
// ResumeLane.
func TestOperatorStop(t *testing.T) {
	e := newEnv(t, sim.Config{}, groupidentify.Config{})
	e.Run()
	if a := postForm(t, e.Base+"/groupidentify", url.Values{"api_key": {"k"}, "identification": {idents("a", 2, 1)}}); a.Status != 200 {
		t.Fatal(a.Body)
	}
	waitFor(t, "first delivery", func() bool { return len(simtest.GroupIdentifies(e.Sim, "k")) == 2 })
	id := e.C.LaneStatus()[0].ID
	if err := e.C.StopLane(id); err != nil {
		t.Fatal(err)
	}
	if a := postForm(t, e.Base+"/groupidentify", url.Values{"api_key": {"k"}, "identification": {idents("b", 2, 1)}}); a.Status != 200 {
		t.Fatal(a.Body)
	}
	time.Sleep(300 * time.Millisecond) // a delivery of the stopped lane would show by now (a negative check)
	if n := len(simtest.GroupIdentifies(e.Sim, "k")); n != 2 || e.LaneRecords("k") != 2 {
		t.Fatalf("delivered %d while stopped, %d spooled", n, e.LaneRecords("k"))
	}
	if st := e.C.LaneStatus()[0]; !st.Stopped || st.ReadAheadBytes == 0 {
		t.Fatalf("status %+v", st)
	}
	if err := e.C.ResumeLane(id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "delivery after resume", func() bool { return len(simtest.GroupIdentifies(e.Sim, "k")) == 4 })
	waitFor(t, "acks", func() bool { return e.LaneRecords("k") == 0 })
}

// TestExpired: records that stay undeliverable past MaxAge are dead letters.
func TestExpired(t *testing.T) {
	e := newEnv(t, sim.Config{}, groupidentify.Config{Spooling: forms.Spooling{FormTiming: delivery.FormTiming{MaxAge: 300 * time.Millisecond}}})
	e.Sim.Inject(simtest.Fault{Status: 503, Count: -1})
	if a := postForm(t, e.Base+"/groupidentify", url.Values{"api_key": {"k"}, "identification": {idents("v", 4, 1)}}); a.Status != 200 {
		t.Fatal(a.Body)
	}
	e.Run()
	waitFor(t, "acks", func() bool { return e.LaneRecords("k") == 0 })
	dead, _ := e.Spool.ListDead(context.Background(), storage.DeadFilter{Reason: "expired"}, 0, 0)
	if len(dead) != 4 {
		t.Fatalf("%d expired dead letters, want 4", len(dead))
	}
	if !strings.Contains(string(dead[0].Answer), "503") {
		t.Fatalf("expired dead letter keeps the last answer: %q", dead[0].Answer)
	}
	if len(simtest.GroupIdentifies(e.Sim, "k")) != 0 {
		t.Fatal("delivered despite the fault")
	}
}

// TestDurability: what got 200 survives closing the spool without delivery
// and is delivered exactly once after reopening.
func TestDurability(t *testing.T) {
	e := newEnv(t, sim.Config{}, groupidentify.Config{})
	for c := range 5 {
		if a := postForm(t, e.Base+"/groupidentify", url.Values{"api_key": {"k"}, "identification": {idents(fmt.Sprintf("c%d-", c), 20, 1)}}); a.Status != 200 {
			t.Fatal(a.Body)
		}
	}
	e.Close()
	if n := len(simtest.GroupIdentifies(e.Sim, "k")); n != 0 {
		t.Fatalf("delivered %d before the restart", n)
	}
	e.Open()
	e.Run()
	waitFor(t, "delivery", func() bool { return len(simtest.GroupIdentifies(e.Sim, "k")) >= 100 })
	waitFor(t, "acks", func() bool { return e.LaneRecords("k") == 0 })
	e.Close()
	e.Open() // a third start delivers nothing again
	e.Run()
	time.Sleep(200 * time.Millisecond) // a redelivery would show by now (a negative check)
	if n := len(simtest.GroupIdentifies(e.Sim, "k")); n != 100 {
		t.Fatalf("delivered %d, want exactly 100", n)
	}
}

// metricValue is the value of the metric name, summed over its labels.
func metricValue(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// TestProjectKey: X-Relay-Project names the project whose api_key is used,
// and a project's ingest_url override is where its identifications go.
func TestProjectKey(t *testing.T) {
	other := simtest.New(sim.Config{}, nil)
	otherURL, err := other.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	creds, err := credentials.Parse([]byte(`
projects:
  - name: web
    api_key: "key-web"
    secret_key: "s1"
  - name: eu
    api_key: "key-eu"
    secret_key: "s2"
    ingest_url: "` + otherURL + `"
`))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvCreds(t, sim.Config{}, groupidentify.Config{}, creds)
	e.Run()
	post := func(form url.Values, project string) answer {
		return formstest.Do(t, "POST", e.Base+"/groupidentify", form, "X-Relay-Project", project)
	}
	if a := post(url.Values{"identification": {idents("w", 2, 1)}}, "web"); a.Status != 200 {
		t.Fatal(a.Body)
	}
	if a := post(url.Values{"identification": {idents("e", 3, 1)}}, "eu"); a.Status != 200 {
		t.Fatal(a.Body)
	}
	if a := post(url.Values{"identification": {idents("x", 1, 1)}}, "nope"); a.Status != 400 || !strings.Contains(a.Body, "X-Relay-Project") {
		t.Fatalf("unknown project: %d %s", a.Status, a.Body)
	}
	if a := post(url.Values{"api_key": {"k"}, "identification": {idents("x", 1, 1)}}, "web"); a.Status != 400 || !strings.Contains(a.Body, "not both") {
		t.Fatalf("both: %d %s", a.Status, a.Body)
	}
	waitFor(t, "delivery", func() bool {
		return len(simtest.GroupIdentifies(e.Sim, "key-web")) == 2 && len(simtest.GroupIdentifies(other, "key-eu")) == 3
	})
	if len(simtest.GroupIdentifies(e.Sim, "key-eu")) != 0 {
		t.Fatal("the eu project's identifications went to the default host")
	}
}
