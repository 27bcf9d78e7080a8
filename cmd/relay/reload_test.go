package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/polltest"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// liveState is one value of every live setting, as a --config file, and
// how to check the relay behaves by it.
type liveState struct {
	logLevel  string
	cors      string // an allowed origin
	allowed   string // the allow-list: keyLoad and this key
	rateLimit string
	anonIP    bool
	gzip      bool // upstream-gzip
	maxEvents int  // max-batch-events
	maxBytes  int  // max-batch-bytes
	flush     time.Duration
}

func (s liveState) file(listen string) string {
	return fmt.Sprintf("listen: %q\nlog-level: %s\ncors-origins: %q\nallowed-api-keys: \"key-load,%s\"\nclient-rate-limit: %s\nanonymize-ip: %v\nupstream-gzip: %v\ntrusted-proxies: \"127.0.0.1/32\"\nmax-batch-events: %d\nmax-batch-bytes: %d\nflush-interval: %s\n",
		listen, s.logLevel, s.cors, s.allowed, s.rateLimit, s.anonIP, s.gzip, s.maxEvents, s.maxBytes, s.flush)
}

// TestReloadLiveSettings: every live setting (log level, CORS origins, the
// allow-list, the client rate limit, IP anonymization, upstream gzip, the
// batch limits, the flush interval) is changed by SIGHUP,
// then changed again by POST /relay/v1/reload, while a client keeps
// posting; after each the new behaviour is checked. No request of the load
// fails and every event it got answered 200 for reaches the upstream. A bad
// file changes nothing and sets relay_config_last_reload_successful 0; a
// changed listen address is kept and named.
func TestReloadLiveSettings(t *testing.T) {
	dir := t.TempDir()
	tokenFile, cfgFile := filepath.Join(dir, "token"), filepath.Join(dir, "relay.yaml")
	const token = "reload-test-admin-token"
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(cfgFile, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a := liveState{logLevel: "info", cors: "https://a.example", allowed: "key-a", rateLimit: "0", anonIP: false,
		maxEvents: 1000, maxBytes: 1_000_000, flush: 200 * time.Millisecond}
	// b's flush interval is never reached in the test: its batches go when
	// full (3 events), and what waits is sent once a reload back to a's
	// interval wakes the shards.
	b := liveState{logLevel: "warn", cors: "https://b.example", allowed: "key-b", rateLimit: "1", anonIP: true, gzip: true,
		maxEvents: 3, maxBytes: 4000, flush: time.Hour}
	write(a.file("127.0.0.1:0"))
	level := zap.NewAtomicLevelAt(zapcore.InfoLevel)
	r := startServeLeveled(t, level, "--config", cfgFile, "--admin-token-file", tokenFile, "--drain-timeout", "10s")

	hc := &http.Client{Timeout: polltest.Max}
	do := func(method, url, body string, hdr map[string]string) (int, http.Header, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}
	auth := map[string]string{"Authorization": "Bearer " + token}
	// postOpts posts to the lane of key and opts (a lane of its own for a
	// probe: nothing else queued delays or fills its batches).
	postOpts := func(key, opts, xff, origin, ev string) int {
		hdr := map[string]string{"Content-Type": "application/json", "X-Forwarded-For": xff}
		if origin != "" {
			hdr["Origin"] = origin
		}
		if opts != "" {
			opts = `,"options":` + opts
		}
		code, _, _ := do(http.MethodPost, r.ingest+"/2/httpapi", `{"api_key":"`+key+`","events":[`+ev+`]`+opts+`}`, hdr)
		return code
	}
	post := func(key, xff, origin, ev string) int { return postOpts(key, "", xff, origin, ev) }

	// The load: 3 clients, each address used by one client and rotating
	// over 3000 (the rate limit of state b is per address), key-load
	// (allowed in every state), no Origin, until stopped.
	stopLoad := startLoad(t, func(c, i int) (string, *http.Request) {
		id := fmt.Sprintf("load-%d-%d", c, i)
		body := fmt.Sprintf(`{"api_key":"key-load","events":[{"event_type":"load","device_id":"load-%d","insert_id":%q}]}`, i%7, id)
		req, _ := http.NewRequest(http.MethodPost, r.ingest+"/2/httpapi", strings.NewReader(body))
		req.Header.Set("X-Forwarded-For", fmt.Sprintf("10.%d.%d.%d", c+1, i/250%4, i%250+1))
		return id, req
	})

	type simRequest struct {
		Status    int      `json:"status"`
		Devices   []string `json:"devices"`
		Gzip      bool     `json:"gzip"`
		Events    int      `json:"events"`
		BodyBytes int      `json:"body_bytes"`
	}
	// delivering: the requests the upstream took with events of device dev.
	delivering := func(dev string) []simRequest {
		t.Helper()
		_, _, body := do(http.MethodGet, r.admin+"/sim/requests?limit=10000000", "", auth)
		var reqs struct{ Requests []simRequest }
		if err := json.Unmarshal(body, &reqs); err != nil {
			t.Fatal(err)
		}
		var out []simRequest
		for _, q := range reqs.Requests {
			if q.Status == 200 && slices.Contains(q.Devices, dev) {
				out = append(out, q)
			}
		}
		return out
	}
	// upstream-gzip: the request that delivered the probe device dev.
	checkGzip := func(by, dev string, want bool) {
		t.Helper()
		qs := delivering(dev)
		if len(qs) == 0 {
			t.Fatalf("%s: no request delivered %s", by, dev)
		}
		if qs[0].Gzip != want {
			t.Fatalf("%s: the request delivering %s was gzip %v, want %v", by, dev, qs[0].Gzip, want)
		}
	}
	// waiting is the flush probe posted under b's flush interval: it is
	// sent only once a reload to a's wakes its shard.
	waiting := ""
	probe := 0
	check := func(s liveState, by string) {
		t.Helper()
		probe++
		// flush-interval: a probe queued under the long interval is sent
		// once the short one is in force (the waiting shard woke up); under
		// the long one, a probe alone in its lane is not sent (checked at
		// the end of this check).
		if s.flush < time.Minute && waiting != "" {
			polltest.Until(t, by+": the probe waiting on the old flush interval delivered", func() bool { return len(delivering(waiting)) > 0 })
			waiting = ""
		}
		flushDev, flushAt := "", time.Now()
		if s.flush > time.Minute {
			flushDev = fmt.Sprintf("flush-%d", probe)
			if code := postOpts(s.allowed, `{"min_id_length":2}`, fmt.Sprintf("10.5.%d.1", probe), "", `{"event_type":"p","device_id":"`+flushDev+`"}`); code != 200 {
				t.Fatalf("%s: flush probe: %d", by, code)
			}
		}
		// max-batch-events, max-batch-bytes: 9 events of one device in one
		// post go in requests within the limits (b's: 3 full batches);
		// under a's, in fewer than 3.
		batchDev := fmt.Sprintf("batch-%d", probe)
		evs := strings.TrimSuffix(strings.Repeat(`{"event_type":"p","device_id":"`+batchDev+`"},`, 9), ",")
		if code := postOpts(s.allowed, `{"min_id_length":4}`, fmt.Sprintf("10.5.%d.2", probe), "", evs); code != 200 {
			t.Fatalf("%s: batch probe: %d", by, code)
		}
		var batches []simRequest
		polltest.Until(t, by+": the batch probe delivered", func() bool {
			batches = delivering(batchDev)
			n := 0
			for _, q := range batches {
				n += q.Events
			}
			return n >= 9
		})
		for _, q := range batches {
			if q.Events > s.maxEvents || q.BodyBytes >= s.maxBytes {
				t.Fatalf("%s: a request of %d events, %d bytes: want at most %d events, under %d bytes", by, q.Events, q.BodyBytes, s.maxEvents, s.maxBytes)
			}
		}
		if s.maxEvents >= 9 && len(batches) >= 3 {
			t.Fatalf("%s: 9 events in %d requests under max-batch-events %d", by, len(batches), s.maxEvents)
		}
		// max-batch-bytes: 4 events of ~1400 bytes in a lane of their own.
		// Under b's 4000 bytes, 2 go per request (the 2 left wait for b's
		// flush interval); under a's, all in one.
		bytesDev := fmt.Sprintf("bytes-%d", probe)
		bigEv := `{"event_type":"p","device_id":"` + bytesDev + `","event_properties":{"x":"` + strings.Repeat("x", 1400) + `"}}`
		if code := postOpts(s.allowed, `{"min_id_length":6}`, fmt.Sprintf("10.5.%d.4", probe), "", strings.Join([]string{bigEv, bigEv, bigEv, bigEv}, ",")); code != 200 {
			t.Fatalf("%s: bytes probe: %d", by, code)
		}
		polltest.Until(t, by+": the bytes probe delivered", func() bool {
			batches = delivering(bytesDev)
			n := 0
			for _, q := range batches {
				n += q.Events
			}
			return n >= 2
		})
		for _, q := range batches {
			if q.BodyBytes >= s.maxBytes || (s.maxBytes >= 10000) != (q.Events == 4) {
				t.Fatalf("%s: a request of %d events of ~1400 bytes, %d bytes, under max-batch-bytes %d", by, q.Events, q.BodyBytes, s.maxBytes)
			}
		}
		// Ingest refuses an event that cannot fit alone under max-batch-bytes.
		big := `{"event_type":"p","device_id":"big-probe","event_properties":{"x":"` + strings.Repeat("x", 5000) + `"}}`
		if code, want := post(s.allowed, fmt.Sprintf("10.5.%d.3", probe), "", big), map[bool]int{true: 413, false: 200}[s.maxBytes < 5000]; code != want {
			t.Fatalf("%s: a 5000-byte event under max-batch-bytes %d: %d, want %d", by, s.maxBytes, code, want)
		}
		if got := level.Level().String(); got != s.logLevel {
			t.Fatalf("%s: log level %s, want %s", by, got, s.logLevel)
		}
		// CORS: a preflight from the allowed origin passes, from the other
		// origin it does not.
		pre := map[string]string{"Origin": s.cors, "Access-Control-Request-Method": "POST"}
		if code, h, _ := do(http.MethodOptions, r.ingest+"/2/httpapi", "", pre); code != 204 || h.Get("Access-Control-Allow-Origin") != s.cors {
			t.Fatalf("%s: preflight from %s: %d %q, want 204 allowed", by, s.cors, code, h.Get("Access-Control-Allow-Origin"))
		}
		other := map[bool]string{true: "https://a.example", false: "https://b.example"}[s.cors == "https://b.example"]
		if code := post(s.allowed, "10.9.0.1", other, `{"event_type":"p","device_id":"probe"}`); code != 403 {
			t.Fatalf("%s: a post from origin %s: %d, want 403", by, other, code)
		}
		// The allow-list: this state's key is taken, the other state's not.
		otherKey := map[bool]string{true: "key-a", false: "key-b"}[s.allowed == "key-b"]
		if code := post(s.allowed, fmt.Sprintf("10.8.%d.1", probe), "", `{"event_type":"p","device_id":"probe"}`); code != 200 {
			t.Fatalf("%s: %s: %d, want 200", by, s.allowed, code)
		}
		if code := post(otherKey, fmt.Sprintf("10.8.%d.2", probe), "", `{"event_type":"p","device_id":"probe"}`); code != 403 {
			t.Fatalf("%s: %s: %d, want 403", by, otherKey, code)
		}
		// The rate limit: a burst of 5 from one address meets a 429 at 1/s.
		got429 := false
		xff := fmt.Sprintf("10.7.%d.1", probe)
		for range 5 {
			got429 = got429 || post(s.allowed, xff, "", `{"event_type":"p","device_id":"probe"}`) == 429
		}
		if want := s.rateLimit != "0"; got429 != want {
			t.Fatalf("%s: a burst of 5 answered 429: %v, want %v", by, got429, want)
		}
		// IP anonymization: the event's ip as the upstream receives it.
		dev := fmt.Sprintf("anon-%d", probe)
		anon := `{"event_type":"p","device_id":"` + dev + `","ip":"1.2.3.4"}`
		if code := postOpts(s.allowed, `{"min_id_length":3}`, fmt.Sprintf("10.6.%d.1", probe), "", anon+","+anon+","+anon); code != 200 {
			t.Fatalf("%s: anon probe: %d", by, code)
		}
		want := map[bool]string{true: "1.2.3.0", false: "1.2.3.4"}[s.anonIP]
		polltest.Until(t, by+": the anon probe delivered", func() bool {
			_, _, body := do(http.MethodGet, r.admin+"/sim/events?api_key="+s.allowed+"&limit=100000", "", auth)
			var evs struct {
				Events []struct {
					Raw struct {
						DeviceID string `json:"device_id"`
						IP       string `json:"ip"`
					} `json:"raw"`
				} `json:"events"`
			}
			if json.Unmarshal(body, &evs) != nil {
				return false
			}
			for _, e := range evs.Events {
				if e.Raw.DeviceID == dev {
					if e.Raw.IP != want {
						t.Fatalf("%s: ip delivered %q, want %q", by, e.Raw.IP, want)
					}
					return true
				}
			}
			return false
		})
		checkGzip(by, dev, s.gzip)
		if flushDev != "" {
			// Long enough after the post for a's interval to have sent it
			// (a lower bound: a loaded machine cannot make this fail).
			time.Sleep(time.Until(flushAt.Add(10 * a.flush)))
			if len(delivering(flushDev)) != 0 {
				t.Fatalf("%s: a probe alone in its lane was sent before the flush interval %s", by, s.flush)
			}
			waiting = flushDev
		}
	}
	reloadByPost := func(wantCode int) reloadResult {
		t.Helper()
		code, _, body := do(http.MethodPost, r.admin+"/relay/v1/reload", "", auth)
		var res reloadResult
		if err := json.Unmarshal(body, &res); err != nil || code != wantCode {
			t.Fatalf("POST /relay/v1/reload: %d %s, want %d", code, body, wantCode)
		}
		return res
	}
	metric := func(name string) string {
		_, _, body := do(http.MethodGet, r.admin+"/metrics", "", nil)
		for l := range strings.SplitSeq(string(body), "\n") {
			if v, ok := strings.CutPrefix(l, name+" "); ok {
				return v
			}
		}
		return ""
	}

	check(a, "at start")
	// By SIGHUP to b; the success time-stamp is set once all is in force.
	t0 := metric("relay_config_last_reload_success_timestamp_seconds")
	write(b.file("127.0.0.1:0"))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	polltest.Until(t, "the SIGHUP reload", func() bool { return metric("relay_config_last_reload_success_timestamp_seconds") != t0 })
	check(b, "after SIGHUP")
	// By the endpoint back to a; the unauthenticated call is refused.
	if code, _, _ := do(http.MethodPost, r.admin+"/relay/v1/reload", "", nil); code != 401 {
		t.Fatalf("reload without the token: %d, want 401", code)
	}
	write(a.file("127.0.0.1:0"))
	res := reloadByPost(200)
	if len(res.NeedsRestart) != 0 || len(res.Changed) != 9 {
		t.Fatalf("reload result %+v: want 9 live changes, none needing a restart", res)
	}
	check(a, "after POST /relay/v1/reload")

	// A bad file: refused whole, named with its source, metric 0, nothing
	// changed (b's CORS origin is not taken).
	write(b.file("127.0.0.1:0") + "max-batch-events: 5000\n")
	res = reloadByPost(422)
	if !strings.Contains(res.Error, "max-batch-events") || !strings.Contains(res.Error, cfgFile) {
		t.Fatalf("refused reload error %q: want the setting and its file named", res.Error)
	}
	if v := metric("relay_config_last_reload_successful"); v != "0" {
		t.Fatalf("relay_config_last_reload_successful %q after a bad file, want 0", v)
	}
	check(a, "after a bad file")

	// A new listen address: `config check --diff` shows it needs a
	// restart; a reload keeps it, names it, and applies the rest.
	write(b.file("127.0.0.1:1"))
	var out, errOut strings.Builder
	if code := runConfig([]string{"check", "--diff", "--admin", r.admin, "--token-file", tokenFile,
		"--admin-listen", "127.0.0.1:0", "--data-dir", r.dir, "--spool-min-free-bytes", "0", "--drain-timeout", "2s",
		"--config", cfgFile, "--admin-token-file", tokenFile, "--drain-timeout", "10s"}, nil, &out, &errOut); code != exitOK {
		t.Fatalf("config check --diff: exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"listen  ", "needs a restart", "cors-origins", "https://a.example  https://b.example", "client-rate-limit", "10 setting(s) would change"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("config check --diff output lacks %q:\n%s", want, out.String())
		}
	}
	// Without --admin: the relay the settings name (admin-listen, here
	// given as the port it got, which differs from the "127.0.0.1:0" in
	// force) and its token file.
	out.Reset()
	if code := runConfig([]string{"check", "--diff", "--admin-listen", r.adminAddr, "--data-dir", r.dir,
		"--spool-min-free-bytes", "0", "--config", cfgFile, "--admin-token-file", tokenFile, "--drain-timeout", "10s"}, nil, &out, &errOut); code != exitOK {
		t.Fatalf("config check --diff without --admin: exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "admin-listen") || !strings.Contains(out.String(), "11 setting(s) would change") {
		t.Fatalf("config check --diff without --admin:\n%s", out.String())
	}
	res = reloadByPost(200)
	if len(res.NeedsRestart) != 1 || res.NeedsRestart[0] != "listen" {
		t.Fatalf("reload with a new listen address: %+v, want listen named as needing a restart", res)
	}
	if v := metric("relay_config_last_reload_successful"); v != "1" {
		t.Fatalf("relay_config_last_reload_successful %q after a good reload, want 1", v)
	}
	check(b, "after a reload naming listen")
	if len(r.logs.FilterMessageSnippet("setting listen changed").All()) == 0 {
		t.Fatal("no log line names the listen address as needing a restart")
	}
	// Back to a's flush interval: what waits on b's is sent.
	write(a.file("127.0.0.1:1"))
	reloadByPost(200)
	check(a, "after a reload back to a")

	// Zero failed, zero lost: every event answered 200 reaches the upstream.
	acceptedIDs := stopLoad()
	polltest.Until(t, "every load event delivered", func() bool {
		_, _, body := do(http.MethodGet, r.admin+"/sim/events?api_key=key-load&limit=10000000", "", auth)
		var evs struct {
			Events []struct {
				Raw struct {
					InsertID string `json:"insert_id"`
				} `json:"raw"`
			} `json:"events"`
		}
		if json.Unmarshal(body, &evs) != nil {
			return false
		}
		got := map[string]bool{}
		for _, e := range evs.Events {
			got[e.Raw.InsertID] = true
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

// startServeLeveled is startServe with a log level a reload sets, and
// without a --listen flag (the --config file gives it).
func startServeLeveled(t *testing.T, level zap.AtomicLevel, args ...string) *servedRelay {
	t.Helper()
	return startServeArgs(t, serveHooks{level: &level}, args...)
}

// TestReloadMaxEventAge: max-event-age applies to the batches built after a
// reload, by SIGHUP (to 1ms: an event then becomes an "expired" dead
// letter) and by the endpoint (back to 6d: delivered again).
func TestReloadMaxEventAge(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "relay.yaml")
	write := func(age string) {
		t.Helper()
		if err := os.WriteFile(cfgFile, []byte("listen: \"127.0.0.1:0\"\nmax-event-age: "+age+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("6d")
	r := startServeArgs(t, serveHooks{}, "--config", cfgFile)
	hc := &http.Client{Timeout: polltest.Max}
	get := func(path string) []byte {
		t.Helper()
		resp, err := hc.Get(r.admin + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return b
	}
	post := func(dev string) {
		t.Helper()
		resp, err := hc.Post(r.ingest+"/2/httpapi", "application/json",
			strings.NewReader(`{"api_key":"age-key","events":[{"event_type":"e","device_id":"`+dev+`"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("post %s: %d", dev, resp.StatusCode)
		}
	}
	delivered := func(dev string) {
		t.Helper()
		polltest.Until(t, dev+" delivered", func() bool {
			return strings.Contains(string(get("/sim/events?api_key=age-key")), `"device_id":"`+dev+`"`)
		})
	}
	stamp := func() string {
		for l := range strings.SplitSeq(string(get("/metrics")), "\n") {
			if v, ok := strings.CutPrefix(l, "relay_config_last_reload_success_timestamp_seconds "); ok {
				return v
			}
		}
		return ""
	}

	post("before")
	delivered("before")
	t0 := stamp()
	write("1ms")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	polltest.Until(t, "the SIGHUP reload", func() bool { return stamp() != t0 })
	post("too-old")
	polltest.Until(t, "too-old an expired dead letter", func() bool {
		b := string(get("/relay/v1/deadletters"))
		return strings.Contains(b, `"reason":"expired"`) && strings.Contains(b, "too-old")
	})
	write("6d")
	resp, err := hc.Post(r.admin+"/relay/v1/reload", "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("POST /relay/v1/reload: %v %v", resp, err)
	}
	resp.Body.Close()
	post("after")
	delivered("after")
	if b := string(get("/relay/v1/deadletters")); strings.Contains(b, `"after"`) || strings.Contains(b, `"before"`) {
		t.Fatalf("dead letters besides too-old: %s", b)
	}
}

// startLoad starts the load the reload tests keep up through every reload:
// 3 clients sending, one at a time each, the requests req makes (client
// c's i-th, and the insert_id of its one event). The load ends at the
// returned stop (or at the test's end), which waits for the clients and
// returns the insert_ids accepted; every request must be answered 200, and
// stop fails t unless some were.
func startLoad(t *testing.T, req func(c, i int) (id string, r *http.Request)) (stop func() []string) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var failed atomic.Int64
	var mu sync.Mutex
	var accepted []string
	for c := range 3 {
		wg.Go(func() {
			lc := &http.Client{Timeout: polltest.Max}
			for i := 0; ctx.Err() == nil; i++ {
				id, rq := req(c, i)
				resp, err := lc.Do(rq)
				if err != nil {
					failed.Add(1)
					t.Errorf("load request: %v", err)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failed.Add(1)
					t.Errorf("load request: %d", resp.StatusCode)
					continue
				}
				mu.Lock()
				accepted = append(accepted, id)
				mu.Unlock()
				time.Sleep(time.Millisecond)
			}
		})
	}
	wait := sync.OnceFunc(func() { cancel(); wg.Wait() })
	t.Cleanup(wait) // before the relay's stop, registered earlier
	return func() []string {
		t.Helper()
		wait()
		if failed.Load() != 0 || len(accepted) == 0 {
			t.Fatalf("load: %d accepted, %d failed", len(accepted), failed.Load())
		}
		return accepted
	}
}

// TestDiffDirectToken: a token given directly that a reload would change
// is named as needing a restart (the reload keeps the one in force); the
// same token again is not named.
func TestDiffDirectToken(t *testing.T) {
	load := func(tok string) config.Config {
		t.Helper()
		c, err := config.Load([]string{"--admin-token", tok}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := load("token-a")
	if d := diffSettings(a, load("token-a")); len(d) != 0 {
		t.Fatalf("the same token: %+v, want no change", d)
	}
	d := diffSettings(a, load("token-b"))
	if len(d) != 1 || d[0].Name != "admin-token" || d[0].Live || strings.Contains(fmt.Sprint(d), "token-") {
		t.Fatalf("another token: %+v, want admin-token alone, needing a restart, not shown", d)
	}
}
