// Package browser drives the upstream's official browser SDK
// (@amplitude/analytics-browser, pinned in package.json /
// package-lock.json) in headless Chromium against the real relay binary,
// which delivers to `relay sim`: the first-party proxy setup of the README.
// The page is served from one 127.0.0.1 port, the relay listens on another
// (a different origin, so every upload is a CORS request), and a second page
// port plays a site the relay does not allow.
//
// It needs node, Debian's chromium and `npm ci --prefix test/browser`
// (.ci/run installs all three). When one is missing the package is skipped
// loudly (a SKIPPED banner, and "[no tests to run]" on go test's ok line),
// except under CI=true, where the test fails with the reason.
package browser

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// The pinned packages (package.json); the test refuses others.
var pinned = map[string]string{
	"@amplitude/analytics-browser": "2.48.1",
	"puppeteer-core":               "24.43.1",
}

// sdkScript is the SDK's own browser build: one file that defines
// window.amplitude.
const sdkScript = "node_modules/@amplitude/analytics-browser/lib/scripts/amplitude-min.js"

// toolsMissing says why the test cannot run here ("" when it can): no node
// or chromium in PATH, or a pinned package not installed under
// node_modules.
func toolsMissing() string {
	if _, err := exec.LookPath("node"); err != nil {
		return "node not found in PATH: the browser SDK end-to-end test needs Node.js, `apt-get install chromium` and `npm ci --prefix test/browser`"
	}
	if findChromium() == "" {
		return "chromium not found in PATH (or $CHROMIUM): `apt-get install chromium`"
	}
	for pkg := range pinned {
		if _, err := os.Stat(filepath.Join("node_modules", filepath.FromSlash(pkg), "package.json")); err != nil {
			return fmt.Sprintf("%s is not installed (%v): run `npm ci --prefix test/browser`", pkg, err)
		}
	}
	return ""
}

func findChromium() string {
	if c := os.Getenv("CHROMIUM"); c != "" {
		return c
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if c, err := exec.LookPath(name); err == nil {
			return c
		}
	}
	return ""
}

// TestMain skips the package loudly when the test cannot run and CI is not
// "true": a banner, and go test's "[no tests to run]" mark on the package's
// ok line (a t.Skip shows only under -v, so a plain `go test ./...` would
// print a bare "ok" for a test that did not run). Under CI=true the test
// runs and fails with the reason instead.
func TestMain(m *testing.M) {
	if why := toolsMissing(); why != "" && os.Getenv("CI") != "true" {
		fmt.Printf("SKIPPED: the browser SDK end-to-end test did not run: %s\n", why)
		fmt.Println("testing: warning: no tests to run")
		fmt.Println("PASS")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// needTools returns node and chromium; under CI=true it fails the test
// when one is missing (TestMain skipped the package otherwise).
func needTools(t *testing.T) (node, chromium string) {
	t.Helper()
	if why := toolsMissing(); why != "" {
		t.Fatalf("%s (CI=true: the browser test must run in CI)", why)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal(err)
	}
	chromium = findChromium()
	for pkg, want := range pinned {
		b, err := os.ReadFile(filepath.Join("node_modules", filepath.FromSlash(pkg), "package.json"))
		if err != nil {
			t.Fatal(err)
		}
		var meta struct{ Version string }
		if err := json.Unmarshal(b, &meta); err != nil {
			t.Fatalf("%s: %v", pkg, err)
		}
		if meta.Version != want {
			t.Fatalf("%s %s installed, the test pins %s: run `npm ci --prefix test/browser`", pkg, meta.Version, want)
		}
	}
	// node and chromium read these, not this process: stat them so that an
	// edit invalidates a cached pass.
	for _, f := range []string{"drive.mjs", "page.js", "index.html", sdkScript} {
		if _, err := os.Stat(f); err != nil {
			t.Fatal(err)
		}
	}
	return node, chromium
}

// servePage serves the test page and the SDK on a free 127.0.0.1 port and
// returns its origin (http://127.0.0.1:PORT).
func servePage(t *testing.T) string {
	t.Helper()
	files := map[string]string{
		"/":                 "index.html",
		"/page.js":          "page.js",
		"/amplitude-min.js": sdkScript,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f, ok := files[r.URL.Path]
			if !ok {
				http.NotFound(w, r)
				return
			}
			http.ServeFile(w, r, f)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

type visit struct {
	Name   string `json:"name"`
	URL    string `json:"url"`
	Click  bool   `json:"click"`
	WaitMs int    `json:"waitMs"`
}

type verdict struct {
	Code     int    `json:"code"`
	Message  string `json:"message"`
	InsertID string `json:"insert_id"`
}

type visitResult struct {
	Sent        []map[string]any `json:"sent"`
	Results     []verdict        `json:"results"`
	Requests    []string         `json:"requests"`
	GzipUploads int              `json:"gzipUploads"`
	Error       string           `json:"error"`
}

// TestBrowserSDKThroughRelay: page views and clicks of the official browser
// SDK, uploaded across origins with fetch and with sendBeacon, reach the
// simulated upstream through the relay with their insert_ids and the
// browser's address as ip (anonymized under --anonymize-ip); a page of an
// origin the relay does not allow, and an api_key it does not allow, get
// nothing through.
func TestBrowserSDKThroughRelay(t *testing.T) {
	node, chromium := needTools(t)
	t0 := time.Now()
	bin := harness.Build(t)
	dir := t.TempDir()
	sm := harness.StartSim(t, bin, dir)
	shop := servePage(t) // the team's site
	evil := servePage(t) // another site, same page

	keys := []string{"browser-fetch", "browser-beacon", "browser-gzip", "browser-evil-fetch", "browser-evil-beacon"}
	common := []string{"--flush-interval", "20ms", "--drain-timeout", "1s", "--cors-origins", shop}
	anon := harness.StartRelay(t, bin, dir, &harness.RelayOpts{
		DataDir:   filepath.Join(dir, "data-anon"),
		IngestURL: sm.Base,
		Extra:     append(common, "--anonymize-ip", "--allowed-api-keys", strings.Join(keys, ",")),
	})
	plain := harness.StartRelay(t, bin, dir, &harness.RelayOpts{
		DataDir:   filepath.Join(dir, "data-plain"),
		IngestURL: sm.Base,
		Extra:     append(common, "--allowed-api-keys", "browser-plain"),
	})

	page := func(origin string, r *harness.Relay, key, transport string) string {
		return fmt.Sprintf("%s/?relay=http://%s&key=%s&transport=%s&tag=%s", origin, r.Listen, key, transport, key)
	}
	gzipPage := page(shop, anon, "browser-gzip", "fetch") + "&gzip=1"
	visits := []visit{
		{"fetch", page(shop, anon, "browser-fetch", "fetch"), true, 5000},
		{"beacon", page(shop, anon, "browser-beacon", "beacon"), true, 5000},
		{"gzip", gzipPage, false, 5000},
		{"plain", page(shop, plain, "browser-plain", "fetch"), false, 5000},
		{"evil-fetch", page(evil, anon, "browser-evil-fetch", "fetch"), false, 4000},
		{"evil-beacon", page(evil, anon, "browser-evil-beacon", "beacon"), false, 1000},
		{"other-key", page(shop, anon, "browser-not-allowed", "fetch"), false, 4000},
	}
	vf := filepath.Join(dir, "visits.json")
	if b, err := json.Marshal(visits); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(vf, b, 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "drive.mjs", chromium, vf)
	cmd.Env = append(os.Environ(), "HOME="+dir) // chromium's profile and caches
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	t1 := time.Now()
	runErr := cmd.Run()
	t.Logf("setup %v, node drive.mjs %v", t1.Sub(t0).Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
	var out struct {
		Visits  map[string]visitResult `json:"visits"`
		Outside []string               `json:"outside"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("drive.mjs: %v (run: %v)\nstdout: %s\nstderr: %s", err, runErr, stdout.Bytes(), stderr.Bytes())
	}
	if runErr != nil {
		t.Fatalf("drive.mjs: %v\nstderr: %s", runErr, stderr.Bytes())
	}
	if len(out.Outside) > 0 {
		t.Errorf("the page tried to reach hosts other than 127.0.0.1 (blocked): %q", out.Outside)
	}
	for _, v := range visits {
		res := out.Visits[v.Name]
		var types []any
		for _, ev := range res.Sent {
			types = append(types, ev["event_type"])
		}
		t.Logf("%s: %d events sent %v, requests %q", v.Name, len(res.Sent), types, res.Requests)
		if res.Error != "" {
			t.Fatalf("%s: %s", v.Name, res.Error)
		}
	}

	// Allowed: everything the SDK sent arrives, once, as sent, with the
	// browser's address (127.0.0.1) as ip.
	for _, tc := range []struct {
		visit, key, ip string
		types          []string
	}{
		{"fetch", "browser-fetch", "127.0.0.0", []string{"[Amplitude] Page Viewed", "[Amplitude] Element Clicked", "Buy Clicked", "Checkout Started"}},
		{"beacon", "browser-beacon", "127.0.0.0", []string{"[Amplitude] Page Viewed", "[Amplitude] Element Clicked", "Buy Clicked", "Checkout Started"}},
		{"gzip", "browser-gzip", "127.0.0.0", []string{"[Amplitude] Page Viewed", "Checkout Started"}},
		{"plain", "browser-plain", "127.0.0.1", []string{"[Amplitude] Page Viewed", "Checkout Started"}},
	} {
		t.Run(tc.visit, func(t *testing.T) {
			res := out.Visits[tc.visit]
			// Content-Encoding: gzip must pass the preflight.
			if tc.visit == "gzip" && res.GzipUploads == 0 {
				t.Error("the SDK sent no gzip upload")
			}
			sent := map[string]map[string]any{}
			var types []string
			for _, ev := range res.Sent {
				iid, _ := ev["insert_id"].(string)
				if iid == "" {
					t.Fatalf("the SDK sent an event without insert_id: %v", ev)
				}
				if ev["ip"] != "$remote" {
					t.Errorf("the SDK sent ip %v, want $remote", ev["ip"])
				}
				sent[iid] = ev
				types = append(types, ev["event_type"].(string))
			}
			for _, want := range tc.types {
				if !contains(types, want) {
					t.Errorf("the SDK sent no %q (sent %q)", want, types)
				}
			}
			if tc.visit != "beacon" { // sendBeacon reports success unseen
				for _, r := range res.Results {
					if r.Code != 200 {
						t.Errorf("SDK verdict on %s: %d %q, want 200", r.InsertID, r.Code, r.Message)
					}
				}
			}
			got := simEvents(t, sm.Ctl, tc.key, len(sent))
			for _, g := range got {
				want, ok := sent[g.InsertID]
				if !ok {
					t.Errorf("sim ingested insert_id %q the SDK never sent: %s", g.InsertID, g.Raw)
					continue
				}
				delete(sent, g.InsertID)
				var have map[string]any
				if err := json.Unmarshal(g.Raw, &have); err != nil {
					t.Fatal(err)
				}
				if have["ip"] != tc.ip {
					t.Errorf("event %s (%v): ip %v at the sim, want %s", g.InsertID, have["event_type"], have["ip"], tc.ip)
				}
				delete(have, "ip")
				w := copyWithout(want, "ip")
				if !reflect.DeepEqual(roundTrip(t, have), roundTrip(t, w)) {
					t.Errorf("event %s changed on the way:\n SDK sent: %s\n sim got:  %s", g.InsertID, mustJSON(w), mustJSON(have))
				}
			}
			for iid, ev := range sent {
				t.Errorf("event %s (%v): the SDK sent it, the sim never ingested it", iid, ev["event_type"])
			}
		})
	}

	// Refused: another site's page, by fetch (its preflight is refused) and
	// by sendBeacon (no preflight: the relay refuses the POST itself), and
	// an api_key the relay does not take.
	for _, key := range []string{"browser-evil-fetch", "browser-evil-beacon", "browser-not-allowed"} {
		if got, err := sm.Ctl.Events(context.Background(), key, 0); err != nil {
			t.Fatal(err)
		} else if len(got) > 0 {
			t.Errorf("%s: %d events reached the upstream, want none", key, len(got))
		}
	}
	for _, c := range []struct {
		visit, want string
	}{
		{"evil-fetch", "OPTIONS "},
		{"evil-beacon", "POST "},
		{"other-key", "POST "},
	} {
		found := false
		for _, r := range out.Visits[c.visit].Requests {
			found = found || strings.HasPrefix(r, c.want) && strings.Contains(r, anon.Listen) && strings.HasSuffix(r, " 403")
		}
		if !found {
			t.Errorf("%s: no %s403 from the relay among %q", c.visit, c.want, out.Visits[c.visit].Requests)
		}
	}
	for _, c := range []struct {
		reason string
		min    float64
	}{{"origin_not_allowed", 2}, {"api_key_not_allowed", 1}} {
		n, err := anon.Metric("relay_ingest_rejected_requests_total", `reason="`+c.reason+`"`)
		if err != nil {
			t.Fatal(err)
		}
		if n < c.min {
			t.Errorf("relay counted %v requests refused for %s, want at least %v", n, c.reason, c.min)
		}
	}
	for _, r := range []*harness.Relay{anon, plain} {
		if err := r.Stop(t, 15*time.Second); err != nil {
			t.Fatalf("relay exit after SIGTERM: %v\n%s", err, r.LogTail(4000))
		}
	}
	t.Logf("total %v", time.Since(t0).Round(time.Millisecond))
}

// simEvents polls the sim until it holds n events of key (polltest.Max at most).
func simEvents(t *testing.T, ctl *simtest.Control, key string, n int) []sim.Ingested {
	t.Helper()
	var got []sim.Ingested
	polltest.Until(t, fmt.Sprintf("%d events of %s at the sim", n, key), func() bool {
		var err error
		if got, err = ctl.Events(context.Background(), key, 0); err != nil {
			t.Fatal(err)
		}
		return len(got) >= n
	})
	if len(got) != n {
		t.Errorf("sim ingested %d events of %s, want %d", len(got), key, n)
	}
	return got
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func copyWithout(m map[string]any, key string) map[string]any {
	c := make(map[string]any, len(m))
	for k, v := range m {
		if k != key {
			c[k] = v
		}
	}
	return c
}

// roundTrip normalizes a decoded object (numbers as float64 on both sides).
func roundTrip(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	var out map[string]any
	if err := json.Unmarshal(mustJSON(m), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
