// Package sdk drives the upstream's official Node.js SDK
// (@amplitude/analytics-node, pinned in package.json / package-lock.json)
// against the real relay binary, which delivers to `relay sim`, and checks
// that the SDK's events reach the simulated upstream intact.
//
// Set up once with `npm ci --prefix test/sdk` (.ci/run does). Without node
// or without node_modules the package is skipped loudly (a SKIPPED banner,
// and "[no tests to run]" on go test's ok line), except under CI=true,
// where the test fails with the reason.
package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/test/e2e/harness"
)

const (
	sdkPackage = "@amplitude/analytics-node"
	sdkVersion = "1.5.73"
)

// sdkResult is one line of send.mjs's results: the SDK's verdict on an event
// and the event exactly as the SDK sent it.
type sdkResult struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Event   json.RawMessage `json:"event"`
}

// sdkMissing says why the SDK cannot run here ("" when it can): no node in
// PATH, or the pinned SDK not installed under node_modules.
func sdkMissing() string {
	if _, err := exec.LookPath("node"); err != nil {
		return "node not found in PATH: the Node.js SDK end-to-end test needs Node.js and `npm ci --prefix test/sdk`"
	}
	pkg := filepath.Join("node_modules", filepath.FromSlash(sdkPackage), "package.json")
	if _, err := os.Stat(pkg); err != nil {
		return fmt.Sprintf("%s is not installed (%v): run `npm ci --prefix test/sdk`", sdkPackage, err)
	}
	return ""
}

// TestMain skips the package loudly when the SDK cannot run and CI is not
// "true": a banner, and go test's "[no tests to run]" mark on the package's
// ok line (a t.Skip shows only under -v, so a plain `go test ./...` would
// print a bare "ok" for a test that did not run). Under CI=true the test
// runs and fails with the reason instead.
func TestMain(m *testing.M) {
	if why := sdkMissing(); why != "" && os.Getenv("CI") != "true" {
		fmt.Printf("SKIPPED: the Node.js SDK end-to-end test did not run: %s\n", why)
		fmt.Println("testing: warning: no tests to run")
		fmt.Println("PASS")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// needNode returns the node binary; under CI=true it fails the test when
// the SDK cannot run (TestMain skipped the package otherwise).
func needNode(t *testing.T) string {
	t.Helper()
	if why := sdkMissing(); why != "" {
		t.Fatalf("%s (CI=true: the SDK test must run in CI)", why)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal(err)
	}
	pkg := filepath.Join("node_modules", filepath.FromSlash(sdkPackage), "package.json")
	b, err := os.ReadFile(pkg)
	if err != nil {
		t.Fatal(err)
	}
	var meta struct{ Version string }
	if err := json.Unmarshal(b, &meta); err != nil {
		t.Fatalf("%s: %v", pkg, err)
	}
	if meta.Version != sdkVersion {
		t.Fatalf("%s %s installed, the test pins %s: run `npm ci --prefix test/sdk`", sdkPackage, meta.Version, sdkVersion)
	}
	// node reads the script, not this process: stat it so that an edit
	// invalidates a cached pass.
	if _, err := os.Stat("send.mjs"); err != nil {
		t.Fatal(err)
	}
	return node
}

// TestNodeSDKThroughRelay runs send.mjs once against /2/httpapi and once
// with useBatch against /batch, and requires: the SDK saw 200 for every
// event; each event reached the simulator once, byte-for-byte the same
// fields as the SDK sent (insert_id and time kept, nothing added or
// dropped); the relay answered each SDK upload exactly once (no SDK retry);
// the relay delivered to the upstream's /2/httpapi.
func TestNodeSDKThroughRelay(t *testing.T) {
	node := needNode(t)
	bin := harness.Build(t)
	dir := t.TempDir()
	sm := harness.StartSim(t, bin, dir)
	r := harness.StartRelay(t, bin, dir, &harness.RelayOpts{
		DataDir:   filepath.Join(dir, "data"),
		IngestURL: sm.Base,
		Extra:     []string{"--flush-interval", "20ms", "--drain-timeout", "1s"},
	})
	bg := context.Background()

	for _, tc := range []struct {
		name, path, mode string
		bad              int // index of the event the upstream refuses; -1: none
		uploads          int // requests the relay should see from the SDK
	}{
		{"httpapi", "/2/httpapi", "", -1, 1},
		{"batch", "/batch", "batch", -1, 1},
		// A 400 naming one event: the SDK drops it and resends the rest
		// once, which it can only do if the relay answers as the upstream.
		{"invalid", "/2/httpapi", "invalid", 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			apiKey := "sdk-e2e-key-" + tc.name
			reqs0, err := r.Metric("relay_ingest_requests_total", `path="`+tc.path+`"`)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			ctx, cancel := context.WithTimeout(bg, 60*time.Second)
			defer cancel()
			args := []string{"send.mjs", "http://" + r.Listen + tc.path}
			if tc.mode != "" {
				args = append(args, tc.mode)
			}
			cmd := exec.CommandContext(ctx, node, args...)
			cmd.Env = append(os.Environ(), "SDK_API_KEY="+apiKey)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			runErr := cmd.Run()
			t.Logf("node send.mjs took %v", time.Since(t0).Round(time.Millisecond))
			var out struct{ Results []sdkResult }
			if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
				t.Fatalf("send.mjs: %v (run: %v)\nstdout: %s\nstderr: %s", err, runErr, stdout.Bytes(), stderr.Bytes())
			}
			wantEvents := 5
			if tc.bad >= 0 {
				wantEvents++
			}
			if len(out.Results) != wantEvents {
				t.Fatalf("send.mjs reported %d events, want %d", len(out.Results), wantEvents)
			}
			sent := map[string]map[string]any{}
			for i, res := range out.Results {
				if i == tc.bad {
					if res.Code != 400 || !strings.Contains(res.Message, "Invalid field values") {
						t.Errorf("refused event %d: SDK says %d %q, want 400 Invalid field values", i, res.Code, res.Message)
					}
					continue
				}
				// An explicit flush reports the answer ("success: {eventsIngested
				// ...}"), the timer's flush its verdict.
				okMsg := res.Message == "Event tracked successfully" ||
					strings.HasPrefix(res.Message, "success") && strings.Contains(res.Message, `"eventsIngested": 5`)
				if res.Code != 200 || !okMsg {
					t.Errorf("event %d: SDK says %d %q, want 200 success with eventsIngested 5", i, res.Code, res.Message)
				}
				ev := decode(t, res.Event)
				iid, _ := ev["insert_id"].(string)
				if iid == "" {
					t.Fatalf("event %d: the SDK sent no insert_id: %s", i, res.Event)
				}
				if _, ok := ev["time"].(json.Number); !ok {
					t.Fatalf("event %d: the SDK sent no time: %s", i, res.Event)
				}
				sent[iid] = ev
			}
			if runErr != nil {
				t.Fatalf("send.mjs: %v\nstderr: %s", runErr, stderr.Bytes())
			}
			// Each upload answered once: an answer the SDK did not take as
			// the upstream's would have made it retry (or report a failure
			// above). The counter may lag the answer a little: poll.
			var reqs1 float64
			polltest.Until(t, fmt.Sprintf("%d requests on %s counted", tc.uploads, tc.path), func() bool {
				if reqs1, err = r.Metric("relay_ingest_requests_total", `path="`+tc.path+`"`); err != nil {
					t.Fatal(err)
				}
				return reqs1-reqs0 >= float64(tc.uploads)
			})
			time.Sleep(50 * time.Millisecond) // a late extra request would show too (can only miss one, never fail a right run)
			if reqs1, err = r.Metric("relay_ingest_requests_total", `path="`+tc.path+`"`); err != nil {
				t.Fatal(err)
			}
			if reqs1-reqs0 != float64(tc.uploads) {
				t.Errorf("relay saw %v requests on %s from the SDK, want %d", reqs1-reqs0, tc.path, tc.uploads)
			}

			// Delivered: poll the sim.
			var got []sim.Ingested
			polltest.Until(t, fmt.Sprintf("%d events of key %s at the sim", len(sent), apiKey), func() bool {
				if got, err = sm.Ctl.Events(bg, apiKey, 0); err != nil {
					t.Fatal(err)
				}
				return len(got) >= len(sent)
			})
			if len(got) != len(sent) {
				t.Fatalf("sim ingested %d events of key %s, want %d", len(got), apiKey, len(sent))
			}
			for _, g := range got {
				want, ok := sent[g.InsertID]
				if !ok {
					t.Errorf("sim ingested insert_id %q the SDK never sent: %s", g.InsertID, g.Raw)
					continue
				}
				delete(sent, g.InsertID)
				have := decode(t, g.Raw)
				if !reflect.DeepEqual(have, want) {
					t.Errorf("event %s changed on the way:\n SDK sent: %s\n sim got:  %s", g.InsertID, canon(want), canon(have))
				}
				// time kept: the event's own time, not the (later) upload
				// time, which is when the sim ingested it.
				if have["time"] != want["time"] {
					t.Errorf("event %s: time %v at the sim, the SDK sent %v", g.InsertID, have["time"], want["time"])
				}
				if ms, _ := want["time"].(json.Number).Int64(); g.Time.UnixMilli() < ms {
					t.Errorf("event %s: ingested at %v, before its own time %d ms", g.InsertID, g.Time, ms)
				}
			}
			for iid := range sent {
				t.Errorf("event %s: the SDK sent it, the sim never ingested it", iid)
			}
		})
	}

	// The relay talks to the upstream's /2/httpapi (also for what came in on
	// /batch), and nothing was refused or retried.
	recs, err := sm.Ctl.Requests(bg, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, rc := range recs {
		if rc.Path != "/2/httpapi" || rc.Status != 200 || rc.Duplicates != 0 {
			t.Errorf("upstream request %d: %s %d (duplicates %d), want /2/httpapi 200 without duplicates", rc.Seq, rc.Path, rc.Status, rc.Duplicates)
		}
	}
	if err := r.Stop(t, 15*time.Second); err != nil {
		t.Fatalf("relay exit after SIGTERM: %v\n%s", err, r.LogTail(4000))
	}
}

// decode parses one JSON object keeping numbers exact.
func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return m
}

func canon(m map[string]any) string {
	b, _ := json.Marshal(m)
	return strings.TrimSpace(string(b))
}
