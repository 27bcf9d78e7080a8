package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/storage"
	"go.uber.org/zap/zaptest/observer"
)

// upState is one value of the live settings TestReloadUpstreamAndLanes
// changes, as a --config file.
type upState struct {
	upstream    *sim.Sim
	url         string
	change      string // spool-upstream-change
	maxLanes    int
	lanesPerKey int
	retire      time.Duration // lane-retire-after
	pause       time.Duration // throttle-pause
	format      string        // log-format
	plan        string        // tracking-plan
	refresh     time.Duration // tracking-plan-refresh
}

// file: every upstream URL (ingest, alias, analytics, experiment, scim,
// feedback) is url.
func (s upState) file() string {
	return fmt.Sprintf("listen: \"127.0.0.1:0\"\ningest-url: %[1]q\nalias-url: %[1]q\nanalytics-url: %[1]q\nexperiment-url: %[1]q\nscim-url: %[1]q\nfeedback-url: %[1]q\n"+
		"spool-upstream-change: %s\nmax-lanes: %d\nmax-lanes-per-key: %d\nlane-retire-after: %s\nthrottle-pause: %s\nlog-format: %s\ntracking-plan: %s\ntracking-plan-refresh: %s\n",
		s.url, s.change, s.maxLanes, s.lanesPerKey, s.retire, s.pause, s.format, s.plan, s.refresh)
}

// TestReloadUpstreamAndLanes: the upstream URLs (the ingest URL behind the
// spool's upstream guard; alias, analytics, experiment, scim and feedback:
// the user mappings, the forwarded APIs and the tracking plan's reads
// follow them), the lane limits, the throttle pause, the log format and the
// tracking-plan settings are changed by SIGHUP, then back by POST
// /relay/v1/reload, while a client keeps posting; after each the new
// behaviour is checked. A change of upstream while records wait for the
// old one is refused whole under spool-upstream-change refuse, as a start
// would be. No request of the load fails and every event answered 200
// reaches one of the two upstreams.
func TestReloadUpstreamAndLanes(t *testing.T) {
	sims := make([]*sim.Sim, 2)
	urls := make([]string, 2)
	for i := range sims {
		sims[i] = sim.New(sim.Config{}, nil)
		u, err := sims[i].Start("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sims[i].Close() })
		urls[i] = u
	}
	dir := t.TempDir()
	tokenFile, cfgFile, credsFile := filepath.Join(dir, "token"), filepath.Join(dir, "relay.yaml"), filepath.Join(dir, "creds.yaml")
	const token = "reload-upstream-test-token"
	for f, body := range map[string]string{tokenFile: token,
		credsFile: "projects:\n  - name: proj\n    api_key: key-plan\n    secret_key: secret-plan\n"} {
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write := func(s upState) {
		t.Helper()
		if err := os.WriteFile(cfgFile, []byte(s.file()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a := upState{upstream: sims[0], url: urls[0], change: "refuse", maxLanes: 10000, lanesPerKey: 16, retire: 10 * time.Minute,
		pause: 200 * time.Millisecond, format: "json", plan: "off", refresh: 5 * time.Minute}
	b := upState{upstream: sims[1], url: urls[1], change: "allow", maxLanes: 10000, lanesPerKey: 1, retire: time.Second,
		pause: time.Hour, format: "console", plan: "observe", refresh: time.Second}
	write(a)
	var formatMu sync.Mutex
	format := "json"
	r := startServeArgs(t, serveHooks{format: func(f string) error {
		formatMu.Lock()
		format = f
		formatMu.Unlock()
		return nil
	}}, "--config", cfgFile, "--admin-token-file", tokenFile, "--credentials", credsFile,
		"--drain-timeout", "10s")

	hc := &http.Client{Timeout: polltest.Max}
	do := func(method, url, body string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	post := func(key, opts, evs string) (int, string) {
		t.Helper()
		if opts != "" {
			opts = `,"options":` + opts
		}
		code, body := do(http.MethodPost, r.ingest+"/2/httpapi", `{"api_key":"`+key+`","events":[`+evs+`]`+opts+`}`)
		return code, string(body)
	}
	metric := func(name string) string {
		_, body := do(http.MethodGet, r.admin+"/metrics", "")
		for l := range strings.SplitSeq(string(body), "\n") {
			if v, ok := strings.CutPrefix(l, name+" "); ok {
				return v
			}
		}
		return ""
	}
	reloadBy := func(by string, wantCode int) reloadResult {
		t.Helper()
		if by == "SIGHUP" {
			t0 := metric("relay_config_last_reload_success_timestamp_seconds")
			n := len(r.logs.FilterMessageSnippet("configuration not reloaded").All())
			if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			polltest.Until(t, "the SIGHUP reload", func() bool {
				return metric("relay_config_last_reload_success_timestamp_seconds") != t0 ||
					len(r.logs.FilterMessageSnippet("configuration not reloaded").All()) > n
			})
			return reloadResult{}
		}
		code, body := do(http.MethodPost, r.admin+"/relay/v1/reload", "")
		var res reloadResult
		if err := json.Unmarshal(body, &res); err != nil || code != wantCode {
			t.Fatalf("POST /relay/v1/reload: %d %s, want %d", code, body, wantCode)
		}
		return res
	}

	// The load: 3 clients on key-load until stopped.
	stopLoad := startLoad(t, func(c, i int) (string, *http.Request) {
		// One device per event: the upstream's 30 events/s per device
		// never pauses the load (the pause probes do that).
		id := fmt.Sprintf("up-load-%d-%d", c, i)
		body := fmt.Sprintf(`{"api_key":"key-load","events":[{"event_type":"load","device_id":%q,"insert_id":%q}]}`, id, id)
		req, _ := http.NewRequest(http.MethodPost, r.ingest+"/2/httpapi", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		return id, req
	})

	// requestsWith: the requests an upstream got with events of device dev.
	requestsWith := func(u *sim.Sim, dev string) []sim.Record {
		var out []sim.Record
		for _, q := range u.Requests() {
			if slices.Contains(q.Devices, dev) {
				out = append(out, q)
			}
		}
		return out
	}
	delivered := func(u *sim.Sim, dev string) bool {
		return slices.ContainsFunc(requestsWith(u, dev), func(q sim.Record) bool { return q.Status == 200 })
	}
	// groupIdentifies: the group identifications an upstream took.
	groupIdentifies := func(u *sim.Sim) int {
		n := 0
		for _, q := range u.Requests() {
			if q.Path == "/groupidentify" && q.Status == 200 {
				n++
			}
		}
		return n
	}
	type planInfo struct {
		Mode    string     `json:"mode"`
		Fetched *time.Time `json:"fetched"`
	}
	planOf := func() planInfo {
		t.Helper()
		_, body := do(http.MethodGet, r.admin+"/relay/v1/plan?project=proj", "")
		var in planInfo
		if err := json.Unmarshal(body, &in); err != nil {
			t.Fatalf("GET /relay/v1/plan: %s", body)
		}
		return in
	}
	// lastSeq: the last request an upstream took; arrived: whether one to a
	// path starting with path came after from.
	lastSeq := func(u *sim.Sim) int64 {
		q := u.Requests()
		if len(q) == 0 {
			return 0
		}
		return q[len(q)-1].Seq
	}
	arrived := func(u *sim.Sim, path string, from int64) bool {
		return slices.ContainsFunc(u.Requests(), func(q sim.Record) bool { return q.Seq > from && strings.HasPrefix(q.Path, path) })
	}
	// reaches: the request call makes arrives at s's upstream (at path),
	// none at the other's.
	reaches := func(s upState, what, path string, call func()) {
		t.Helper()
		from := []int64{lastSeq(sims[0]), lastSeq(sims[1])}
		call()
		i := slices.Index(sims, s.upstream)
		polltest.Until(t, what+" at this state's upstream", func() bool { return arrived(sims[i], path, from[i]) })
		if arrived(sims[1-i], path, from[1-i]) {
			t.Fatalf("%s went to the other upstream", what)
		}
	}
	probe := 0
	check := func(s upState, by string) {
		t.Helper()
		probe++
		// ingest-url: a probe goes to this state's upstream.
		dev := fmt.Sprintf("url-%d", probe)
		if code, body := post("key-load", "", `{"event_type":"p","device_id":"`+dev+`"}`); code != 200 {
			t.Fatalf("%s: url probe: %d %s", by, code, body)
		}
		polltest.Until(t, by+": the url probe delivered", func() bool { return delivered(s.upstream, dev) })
		for _, u := range sims {
			if u != s.upstream && len(requestsWith(u, dev)) > 0 {
				t.Fatalf("%s: the url probe went to the other upstream", by)
			}
		}
		// ingest-url: a group identification goes to this state's upstream.
		before := []int{groupIdentifies(sims[0]), groupIdentifies(sims[1])}
		// (a key of its own: b allows one lane per key)
		req, _ := http.NewRequest(http.MethodPost, r.admin+"/groupidentify", strings.NewReader(
			`api_key=key-gi-`+strconv.Itoa(probe)+`&identification=%5B%7B%22group_type%22%3A%22org%22%2C%22group_value%22%3A%22acme%22%2C%22group_properties%22%3A%7B%22plan%22%3A%22x%22%7D%7D%5D`))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: POST /groupidentify: %d", by, resp.StatusCode)
		}
		polltest.Until(t, by+": the group identification delivered", func() bool {
			return groupIdentifies(s.upstream) > before[slices.Index(sims, s.upstream)]
		})
		if other := 1 - slices.Index(sims, s.upstream); groupIdentifies(sims[other]) != before[other] {
			t.Fatalf("%s: the group identification went to the other upstream", by)
		}
		// ingest-url: a backfill started now goes to this state's upstream.
		bfKey := fmt.Sprintf("key-bf-%d", probe)
		if code, body := do(http.MethodPost, r.admin+"/relay/v1/backfill?api_key="+bfKey+"&max_eps=1000",
			`{"event_type":"history","device_id":"bf-device-1"}`+"\n"+`{"event_type":"history","device_id":"bf-device-2"}`+"\n"); code/100 != 2 {
			t.Fatalf("%s: POST /relay/v1/backfill: %d %s", by, code, body)
		}
		polltest.Until(t, by+": the backfill delivered", func() bool { return len(s.upstream.Events(bfKey)) == 2 })
		for _, u := range sims {
			if u != s.upstream && len(u.Events(bfKey)) > 0 {
				t.Fatalf("%s: the backfill went to the other upstream", by)
			}
		}
		// max-lanes-per-key: a new options variant of key-load (whose lane
		// the load keeps) is refused at 1 lane per key, taken at 16.
		code, body := post("key-load", fmt.Sprintf(`{"min_id_length":%d}`, 10+probe), `{"event_type":"p","device_id":"lanes-probe-device-of-30-chars"}`)
		if want := map[bool]int{true: 503, false: 200}[s.lanesPerKey == 1]; code != want || (code == 503 && !strings.Contains(body, "Too many lanes for this api_key")) {
			t.Fatalf("%s: a new lane of key-load under max-lanes-per-key %d: %d %s, want %d", by, s.lanesPerKey, code, body, want)
		}
		// lane-retire-after: under 1s a new lane, left idle, is retired.
		if s.retire < time.Minute {
			key := fmt.Sprintf("key-retire-%d", probe)
			if code, body := post(key, "", `{"event_type":"p","device_id":"retire-probe"}`); code != 200 {
				t.Fatalf("%s: retire probe: %d %s", by, code, body)
			}
			label := storage.LaneKey{Kind: storage.KindEvents, APIKey: key}.Label()
			polltest.Until(t, by+": the idle lane retired after lane-retire-after "+s.retire.String(), func() bool {
				code, _ := do(http.MethodGet, r.admin+"/relay/v1/lanes/"+label, "")
				return code == 404
			})
		}
		// throttle-pause: 3 posts of 350 events of one device meet a 429
		// of the upstream (30 events/s per device); under 200ms a request
		// with the device follows the first 429, under 1h none does.
		pdev := fmt.Sprintf("pause-%d", probe)
		evs := strings.TrimSuffix(strings.Repeat(`{"event_type":"p","device_id":"`+pdev+`"},`, 350), ",")
		for range 3 {
			if code, body := post(fmt.Sprintf("key-pause-%d", probe), "", evs); code != 200 {
				t.Fatalf("%s: pause probe: %d %s", by, code, body)
			}
		}
		first429 := func() (int64, bool) {
			for _, q := range requestsWith(s.upstream, pdev) {
				if q.Status == 429 {
					return q.Seq, true
				}
			}
			return 0, false
		}
		polltest.Until(t, by+": the pause probe refused with a 429", func() bool { _, ok := first429(); return ok })
		seq, _ := first429()
		after := func() bool {
			for _, q := range requestsWith(s.upstream, pdev) {
				if q.Seq > seq {
					return true
				}
			}
			return false
		}
		if s.pause < time.Minute {
			polltest.Until(t, by+": a request of the paused device after throttle-pause "+s.pause.String(), after)
		} else {
			// Long enough for the 200ms pause to have passed (a lower
			// bound: a loaded machine cannot make this fail).
			time.Sleep(3 * time.Second)
			if after() {
				t.Fatalf("%s: the device was sent again within throttle-pause %s", by, s.pause)
			}
		}
		// log-format.
		formatMu.Lock()
		f := format
		formatMu.Unlock()
		if f != s.format {
			t.Fatalf("%s: log format %q, want %q", by, f, s.format)
		}
		// tracking-plan: the default mode of a project without its own;
		// tracking-plan-refresh: under 1s its plan is read again and again.
		if in := planOf(); in.Mode != s.plan {
			t.Fatalf("%s: the project's tracking plan mode %q, want %q", by, in.Mode, s.plan)
		}
		// analytics-url: the plan's reads of the taxonomy API go to this
		// state's upstream.
		if s.refresh < time.Minute {
			from := lastSeq(s.upstream)
			seen := map[time.Time]bool{}
			polltest.Until(t, by+": the plan read again every "+s.refresh.String()+" from this upstream", func() bool {
				if in := planOf(); in.Fetched != nil {
					seen[*in.Fetched] = true
				}
				return len(seen) >= 3 && arrived(s.upstream, "/api/2/taxonomy/", from)
			})
		}
		// alias-url: a user mapping is delivered to this state's upstream.
		reaches(s, by+": a user mapping (alias-url)", "/usermap", func() {
			req, _ := http.NewRequest(http.MethodPost, r.admin+"/usermap", strings.NewReader("api_key=key-um-"+strconv.Itoa(probe)+
				"&mapping="+url.QueryEscape(`[{"user_id":"u-`+strconv.Itoa(probe)+`","global_user_id":"g-1"}]`)))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("%s: POST /usermap: %d %s", by, resp.StatusCode, b)
			}
		})
		// The forwarded APIs: the next call goes to this state's upstream
		// (whatever it answers a caller without credentials).
		for _, c := range []struct{ what, method, path, body string }{
			{"the taxonomy API (analytics-url)", http.MethodGet, "/api/2/taxonomy/event", ""},
			{"the user mapping read (analytics-url)", http.MethodGet, "/api/2/usermap?user_ids=u-1", ""},
			{"the experiment API (experiment-url)", http.MethodGet, "/api/1/experiments", ""},
			{"the SCIM API (scim-url)", http.MethodGet, "/scim/1/Users", ""},
			{"the feedback API (feedback-url)", http.MethodPost, "/api/1/ai-feedback/ingest", `{"source_id":"s","items":[{"unique_id":"i0","body":"text"}]}`},
		} {
			path, _, _ := strings.Cut(c.path, "?")
			reaches(s, by+": "+c.what, path, func() {
				// The admin token in Proxy-Authorization: the caller's own
				// (no) Authorization passes through.
				req, _ := http.NewRequest(c.method, r.admin+c.path, strings.NewReader(c.body))
				req.Header.Set("Proxy-Authorization", "Bearer "+token)
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode/100 == 5 {
					t.Fatalf("%s: %s %s: %d %s", by, c.method, c.path, resp.StatusCode, b)
				}
			})
		}
	}

	check(a, "at start")
	// By SIGHUP to b (allow: the records waiting for a's upstream go to b's);
	// `config check --diff` shows first what it puts in force.
	write(b)
	var out, errOut strings.Builder
	if code := runConfig([]string{"check", "--diff", "--admin", r.admin, "--token-file", tokenFile, "--config", cfgFile,
		"--admin-token-file", tokenFile, "--credentials", credsFile, "--admin-listen", "127.0.0.1:0",
		"--data-dir", r.dir, "--spool-min-free-bytes", "0"}, nil, &out, &errOut); code != exitOK {
		t.Fatalf("config check --diff: exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"ingest-url", "spool-upstream-change", "max-lanes-per-key", "lane-retire-after", "throttle-pause",
		"log-format", "tracking-plan ", "tracking-plan-refresh", "alias-url", "analytics-url", "experiment-url", "scim-url", "feedback-url",
		"13 setting(s) would change"} {
		if !strings.Contains(out.String(), want) || strings.Contains(out.String(), "needs a restart") {
			t.Fatalf("config check --diff output lacks %q, or names a setting needing a restart:\n%s", want, out.String())
		}
	}
	reloadBy("SIGHUP", 0)
	check(b, "after SIGHUP")

	// By SIGHUP back to a's upstream under refuse: b's paused device keeps
	// records waiting, so the reload is refused whole, as a start would be.
	refused := a
	refused.upstream, refused.url, refused.change = b.upstream, a.url, "refuse"
	write(refused)
	reloadBy("SIGHUP", 0)
	if v := metric("relay_config_last_reload_successful"); v != "0" {
		t.Fatalf("relay_config_last_reload_successful %q after a refused upstream change, want 0", v)
	}
	if !slices.ContainsFunc(r.logs.FilterMessageSnippet("configuration not reloaded").All(), func(e observer.LoggedEntry) bool {
		msg := fmt.Sprint(e.ContextMap()["error"])
		return strings.Contains(msg, "ingest-url") && strings.Contains(msg, "spool-upstream-change")
	}) {
		t.Fatal("no log line names ingest-url and spool-upstream-change for the refused reload")
	}
	check(b, "after a refused upstream change")

	// By the endpoint back to a, allowed.
	back := a
	back.change = "allow"
	write(back)
	res := reloadBy("POST", 200)
	if len(res.NeedsRestart) != 0 || len(res.Changed) != 12 {
		t.Fatalf("reload result %+v: want 12 live changes, none needing a restart", res)
	}
	check(back, "after POST /relay/v1/reload")

	// max-lanes: at 1, a new api_key is refused and /readyz says why.
	one := back
	one.maxLanes = 1
	write(one)
	reloadBy("POST", 200)
	if code, body := post("key-new-lane", "", `{"event_type":"p","device_id":"device-d"}`); code != 503 || !strings.Contains(body, "Too many lanes") {
		t.Fatalf("a new api_key under max-lanes 1: %d %s, want 503", code, body)
	}
	if code, body := do(http.MethodGet, r.admin+"/readyz", ""); code != 503 || !strings.Contains(string(body), "lane limit reached") {
		t.Fatalf("/readyz under max-lanes 1: %d %s", code, body)
	}
	write(back)
	reloadBy("SIGHUP", 0)
	if code, body := post("key-new-lane", "", `{"event_type":"p","device_id":"device-d"}`); code != 200 {
		t.Fatalf("a new api_key under max-lanes 10000: %d %s, want 200", code, body)
	}

	// Zero failed, zero lost: every event answered 200 reaches an upstream.
	acceptedIDs := stopLoad()
	polltest.Until(t, "every load event delivered", func() bool {
		got := map[string]bool{}
		for _, u := range sims {
			for _, e := range u.Events("key-load") {
				got[e.InsertID] = true
			}
		}
		for _, id := range acceptedIDs {
			if !got[id] {
				return false
			}
		}
		return true
	})
	t.Logf("%d load requests answered 200 during the reloads, none failed, all delivered", len(acceptedIDs))
}
