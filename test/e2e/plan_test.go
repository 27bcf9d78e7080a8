package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// The tracking plan end to end: one relay binary, the simulator as its
// upstream (events and taxonomy), one project per mode. Planned events
// arrive unchanged; filter removes unplanned properties; block quarantines
// with the violations; the plan fixed through the relay's own taxonomy API
// and the quarantine replayed, they arrive; a restart with the upstream
// down still enforces the kept plan.

const planToken = "plan-test-token"

type planRelay struct {
	t     *testing.T
	admin string
	hc    *http.Client
}

// call makes an admin call as project (X-Relay-Project) with the token.
func (p planRelay) call(method, path, project, contentType, body string) (int, []byte) {
	p.t.Helper()
	req, err := http.NewRequest(method, "http://"+p.admin+path, strings.NewReader(body))
	if err != nil {
		p.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+planToken)
	if project != "" {
		req.Header.Set("X-Relay-Project", project)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, err := p.hc.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

func (p planRelay) taxonomy(method, path, project string, form url.Values) {
	p.t.Helper()
	if code, b := p.call(method, path, project, "application/x-www-form-urlencoded", form.Encode()); code/100 != 2 {
		p.t.Fatalf("%s %s as %s: %d %s", method, path, project, code, b)
	}
}

type deadList struct {
	DeadLetters []struct {
		ID     uint64          `json:"id"`
		Reason string          `json:"reason"`
		Answer string          `json:"answer"`
		Data   json.RawMessage `json:"data"`
	} `json:"dead_letters"`
}

func (p planRelay) dead(query string) deadList {
	p.t.Helper()
	code, b := p.call("GET", "/relay/v1/deadletters?"+query, "", "", "")
	if code != 200 {
		p.t.Fatalf("dead letters: %d %s", code, b)
	}
	var d deadList
	if err := json.Unmarshal(b, &d); err != nil {
		p.t.Fatal(err)
	}
	return d
}

// simEvents returns the raw events the simulator ingested for apiKey, by
// device.
func simEvents(t *testing.T, base, apiKey string) map[string]string {
	t.Helper()
	res, err := http.Get(base + "/sim/events?api_key=" + url.QueryEscape(apiKey) + "&limit=1000")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out struct {
		Events []struct {
			DeviceID string          `json:"device_id"`
			Raw      json.RawMessage `json:"raw"`
		} `json:"events"`
	}
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, e := range out.Events {
		m[e.DeviceID] = string(e.Raw)
	}
	return m
}

func TestTrackingPlanModes(t *testing.T) {
	if testing.Short() {
		t.Skip("binary-level test; skipped under -short")
	}
	t.Parallel()
	bin := harness.Build(t)
	dir := t.TempDir()
	s := harness.StartSim(t, bin, dir)
	var creds bytes.Buffer
	creds.WriteString("projects:\n")
	for _, m := range []string{"observe", "filter", "block"} {
		fmt.Fprintf(&creds, "  - name: %s\n    api_key: key-%s\n    secret_key: secret-%s\n    tracking_plan: %s\n", m, m, m, m)
	}
	credsFile, tokenFile := filepath.Join(dir, "creds.yaml"), filepath.Join(dir, "token")
	if err := os.WriteFile(credsFile, creds.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte(planToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	opts := &harness.RelayOpts{DataDir: data, IngestURL: s.Base,
		Extra: []string{"--analytics-url", s.Base, "--credentials", credsFile, "--admin-token-file", tokenFile}}
	r := harness.StartRelay(t, bin, dir, opts)
	p := planRelay{t: t, admin: r.AdminListen, hc: harness.NewClient()}

	// Each project plans "Viewed" with a number "price" and a string "page".
	for _, m := range []string{"observe", "filter", "block"} {
		p.taxonomy("POST", "/api/2/taxonomy/event", m, url.Values{"event_type": {"Viewed"}})
		p.taxonomy("POST", "/api/2/taxonomy/event-property", m, url.Values{"event_property": {"price"}, "type": {"number"}})
		p.taxonomy("POST", "/api/2/taxonomy/event-property", m, url.Values{"event_property": {"page"}, "type": {"string"}})
	}
	// The changes went through the relay: each plan is read at once.
	for _, m := range []string{"observe", "filter", "block"} {
		polltest.Until(t, m+"'s plan read", func() bool {
			_, b := p.call("GET", "/relay/v1/plan?project="+m, "", "", "")
			var in struct {
				Plan *struct {
					EventTypes []string `json:"event_types"`
					Shared     []any    `json:"shared_properties"`
				} `json:"plan"`
			}
			json.Unmarshal(b, &in)
			return in.Plan != nil && len(in.Plan.EventTypes) == 1 && len(in.Plan.Shared) == 2
		})
	}

	planned := `{"event_type":"Viewed","device_id":"planned-1","insert_id":"i-planned","time":1764300000000,"event_properties":{"price":3,"page":"/a"}}`
	extra := `{"event_type":"Viewed","device_id":"extra-1","insert_id":"i-extra","time":1764300000000,"event_properties":{"price":3,"x":1}}`
	wrong := `{"event_type":"Viewed","device_id":"wrong-1","insert_id":"i-wrong","time":1764300000000,"event_properties":{"price":"3"}}`
	other := `{"event_type":"Other","device_id":"other-1","insert_id":"i-other","time":1764300000000}`
	for _, m := range []string{"observe", "filter", "block"} {
		body := fmt.Sprintf(`{"api_key":"key-%s","events":[%s,%s,%s,%s]}`, m, planned, extra, wrong, other)
		if code, b, err := r.Post(p.hc, "/2/httpapi", []byte(body)); err != nil || code != 200 {
			t.Fatalf("post %s: %d %s %v", m, code, b, err)
		}
	}
	want := map[string]map[string]bool{ // what arrives
		"observe": {"planned-1": true, "extra-1": true, "wrong-1": true, "other-1": true},
		"filter":  {"planned-1": true, "extra-1": true, "wrong-1": true},
		"block":   {"planned-1": true},
	}
	for m, devs := range want {
		polltest.Until(t, m+"'s events delivered", func() bool { return len(simEvents(t, s.Base, "key-"+m)) == len(devs) })
		got := simEvents(t, s.Base, "key-"+m)
		for d := range devs {
			if got[d] == "" {
				t.Errorf("%s: %s did not arrive", m, d)
			}
		}
		if got["planned-1"] != planned {
			t.Errorf("%s: planned event changed on the way:\n got %s\nwant %s", m, got["planned-1"], planned)
		}
		switch m {
		case "observe":
			if got["extra-1"] != extra || got["wrong-1"] != wrong {
				t.Errorf("observe changed events: %s %s", got["extra-1"], got["wrong-1"])
			}
		case "filter":
			if want := `{"event_type":"Viewed","device_id":"extra-1","insert_id":"i-extra","time":1764300000000,"event_properties":{"price":3}}`; got["extra-1"] != want {
				t.Errorf("filter: got %s, want %s", got["extra-1"], want)
			}
		}
	}
	// The quarantine: filter's unplanned event type, block's three.
	polltest.Until(t, "quarantine", func() bool { return len(p.dead("reason=plan").DeadLetters) == 4 })
	if d := p.dead("reason=plan&project=filter"); len(d.DeadLetters) != 1 || !strings.Contains(d.DeadLetters[0].Answer, `"unplanned_event_type"`) {
		t.Errorf("filter's quarantine: %+v", d)
	}
	if d := p.dead("reason=plan&project=block&violation=wrong_type"); len(d.DeadLetters) != 1 || !strings.Contains(string(d.DeadLetters[0].Data), "wrong-1") {
		t.Errorf("block's wrong_type quarantine: %+v", d)
	}
	if d := p.dead("reason=plan&project=block&event_type=Viewed"); len(d.DeadLetters) != 2 {
		t.Errorf("block's Viewed quarantine: %+v", d)
	}
	if v, err := r.Metric("relay_plan_quarantined_total"); err != nil || v != 4 {
		t.Errorf("relay_plan_quarantined_total = %v, %v; want 4", v, err)
	}
	if v, err := r.Metric("relay_plan_violations_total", `project="observe"`, `kind="wrong_type"`); err != nil || v < 1 {
		t.Errorf("relay_plan_violations_total{project=observe,kind=wrong_type} = %v, %v", v, err)
	}

	// Fix block's plan through the relay: plan "Other", "x", any price.
	p.taxonomy("POST", "/api/2/taxonomy/event", "block", url.Values{"event_type": {"Other"}})
	p.taxonomy("POST", "/api/2/taxonomy/event-property", "block", url.Values{"event_property": {"x"}})
	p.taxonomy("PUT", "/api/2/taxonomy/event-property/price", "block", url.Values{"type": {"any"}})
	polltest.Until(t, "block's fixed plan read", func() bool {
		_, b := p.call("GET", "/relay/v1/plan?project=block", "", "", "")
		return strings.Contains(string(b), `"Other"`) && strings.Contains(string(b), `"name":"x"`) && !strings.Contains(string(b), `"type":"number"`)
	})
	if code, b := p.call("POST", "/relay/v1/deadletters/replay", "", "application/json", `{"filter":{"reason":"plan"}}`); code != 200 {
		t.Fatalf("replay: %d %s", code, b)
	}
	polltest.Until(t, "block's replayed events delivered", func() bool { return len(simEvents(t, s.Base, "key-block")) == 4 })
	// filter's unplanned type was replayed too, into the same plan: back in quarantine.
	polltest.Until(t, "filter's event quarantined again", func() bool { return len(p.dead("reason=plan").DeadLetters) == 1 })

	// A restart with the upstream gone: the kept plan is enforced.
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("stop: %v", err)
	}
	s.Kill(t)
	r = harness.StartRelay(t, bin, dir, opts)
	p.admin = r.AdminListen
	_, b := p.call("GET", "/relay/v1/plan?project=block", "", "", "")
	if !strings.Contains(string(b), `"enforcing":true`) {
		t.Fatalf("after a restart without upstream: %s", b)
	}
	bad := `{"event_type":"Nope","device_id":"nope-1","insert_id":"i-nope","time":1764300000000}`
	if code, b, err := r.Post(p.hc, "/2/httpapi", []byte(`{"api_key":"key-block","events":[`+bad+`]}`)); err != nil || code != 200 {
		t.Fatalf("post: %d %s %v", code, b, err)
	}
	polltest.Until(t, "quarantine with the upstream down", func() bool {
		return len(p.dead("reason=plan&project=block&violation=unplanned_event_type").DeadLetters) == 1
	})
}

// TestTrackingPlanBacklog: events clean against the plan
// in force, still waiting when the plan changes, are checked against the
// new plan at delivery: the ones it breaks are quarantined, the others
// delivered.
func TestTrackingPlanBacklog(t *testing.T) {
	if testing.Short() {
		t.Skip("binary-level test; skipped under -short")
	}
	t.Parallel()
	bin := harness.Build(t)
	dir := t.TempDir()
	s := harness.StartSim(t, bin, dir)
	credsFile, tokenFile := filepath.Join(dir, "creds.yaml"), filepath.Join(dir, "token")
	creds := "projects:\n  - name: web\n    api_key: key-web\n    secret_key: secret-web\n    tracking_plan: block\n"
	if err := os.WriteFile(credsFile, []byte(creds), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte(planToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := harness.StartRelay(t, bin, dir, &harness.RelayOpts{DataDir: filepath.Join(dir, "data"), IngestURL: s.Base,
		Extra: []string{"--analytics-url", s.Base, "--credentials", credsFile, "--admin-token-file", tokenFile}})
	p := planRelay{t: t, admin: r.AdminListen, hc: harness.NewClient()}
	// The plan: "Viewed" with a "price" of any type.
	p.taxonomy("POST", "/api/2/taxonomy/event", "web", url.Values{"event_type": {"Viewed"}})
	p.taxonomy("POST", "/api/2/taxonomy/event-property", "web", url.Values{"event_property": {"price"}, "type": {"any"}})
	planHas := func(what string) func() bool {
		return func() bool {
			_, b := p.call("GET", "/relay/v1/plan?project=web", "", "", "")
			return strings.Contains(string(b), what)
		}
	}
	polltest.Until(t, "the plan read", planHas(`"name":"price","type":"any"`))
	post := func(events ...string) {
		t.Helper()
		body := `{"api_key":"key-web","events":[` + strings.Join(events, ",") + `]}`
		if code, b, err := r.Post(p.hc, "/2/httpapi", []byte(body)); err != nil || code != 200 {
			t.Fatalf("post: %d %s %v", code, b, err)
		}
	}
	ev := func(dev, price string) string {
		return `{"event_type":"Viewed","device_id":"` + dev + `","insert_id":"i-` + dev + `","time":1764300000000,"event_properties":{"price":` + price + `}}`
	}
	// The lane, made by a first event, paused: what comes next waits.
	post(ev("first", "1"))
	polltest.Until(t, "the first event delivered", func() bool { return len(simEvents(t, s.Base, "key-web")) == 1 })
	code, b := p.call("GET", "/relay/v1/lanes", "", "", "")
	var lanes struct {
		Lanes []struct {
			Label string `json:"label"`
		} `json:"lanes"`
	}
	if err := json.Unmarshal(b, &lanes); code != 200 || err != nil || len(lanes.Lanes) != 1 {
		t.Fatalf("lanes: %d %s %v", code, b, err)
	}
	label := lanes.Lanes[0].Label
	polltest.Until(t, "the lane paused", func() bool {
		code, _ := p.call("POST", "/relay/v1/lanes/"+label+"/pause", "", "", "")
		return code == 200
	})
	// Clean against this plan (a string price passes type any).
	post(ev("text-1", `"3"`), ev("number-1", "3"), ev("text-2", `"4"`))
	// The plan changes through the relay: price must be a number.
	p.taxonomy("PUT", "/api/2/taxonomy/event-property/price", "web", url.Values{"type": {"number"}})
	polltest.Until(t, "the new plan read", planHas(`"name":"price","type":"number"`))
	if code, b := p.call("POST", "/relay/v1/lanes/"+label+"/resume", "", "", ""); code != 200 {
		t.Fatalf("resume: %d %s", code, b)
	}
	polltest.Until(t, "the backlog quarantined", func() bool {
		return len(p.dead("reason=plan&project=web&violation=wrong_type").DeadLetters) == 2
	})
	polltest.Until(t, "the backlog's clean event delivered", func() bool { return len(simEvents(t, s.Base, "key-web")) == 2 })
	got := simEvents(t, s.Base, "key-web")
	if got["number-1"] == "" || got["text-1"] != "" || got["text-2"] != "" {
		t.Errorf("delivered: %v", got)
	}
}
