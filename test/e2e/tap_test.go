package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// TestTapWhileLoadFlows: `relay tap` against a running relay shows the
// events of one device while other devices' load flows (at ingest and as
// delivered), stops by itself at --limit, masks property values with
// --mask, never shows the api_key (only its hash), refuses a tap beyond
// the most attached at once with 429, and no ingest request fails.
func TestTapWhileLoadFlows(t *testing.T) {
	if testing.Short() {
		t.Skip("binary-level test; skipped under -short")
	}
	t.Parallel()
	bin := harness.Build(t)
	dir := t.TempDir()
	sim := harness.StartSim(t, bin, dir)
	tokFile := filepath.Join(dir, "token")
	const token = "tap-test-admin-token-0123456789"
	if err := os.WriteFile(tokFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := harness.StartRelay(t, bin, dir, &harness.RelayOpts{DataDir: filepath.Join(dir, "data"), IngestURL: sim.Base,
		Extra: []string{"--admin-token-file", tokFile, "--sync", "none"}})
	defer r.Stop(t, 30*time.Second)

	const apiKey = "tap-secret-api-key-abcdef"
	const secretProp = "very-secret-property-value"
	// Load: 4 clients, 100 events a request over 50 devices, until stop.
	ctx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var posted, failed atomic.Int64
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := harness.NewClient()
			for seq := 0; ctx.Err() == nil; seq++ {
				var b bytes.Buffer
				fmt.Fprintf(&b, `{"api_key":%q,"events":[`, apiKey)
				for i := range 100 {
					if i > 0 {
						b.WriteByte(',')
					}
					fmt.Fprintf(&b, `{"event_type":"e%d","device_id":"dev-%d","event_properties":{"secret":%q,"seq":%d,"client":%d}}`,
						i%3, i%50, secretProp, seq, c)
				}
				b.WriteString("]}")
				code, body, err := r.Post(hc, "/2/httpapi", b.Bytes())
				if err != nil || code != 200 {
					failed.Add(1)
					t.Errorf("post: %d %s %v", code, body, err)
					return
				}
				posted.Add(100)
			}
		}()
	}
	defer func() { stopLoad(); wg.Wait() }()

	tapCmd := func(args ...string) (stdout, stderr string, err error) {
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cctx, bin, append([]string{"tap", "--admin", "http://" + r.AdminListen, "--token-file", tokFile}, args...)...)
		cmd.Env = harness.CleanEnv()
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err = cmd.Run()
		return o.String(), e.String(), err
	}
	h := sha256.Sum256([]byte(apiKey))
	wantHash := hex.EncodeToString(h[:8])
	type line struct {
		Where      string `json:"where"`
		APIKeyHash string `json:"api_key_hash"`
		Event      struct {
			DeviceID        string         `json:"device_id"`
			EventType       string         `json:"event_type"`
			InsertID        string         `json:"insert_id"`
			EventProperties map[string]any `json:"event_properties"`
		} `json:"event"`
	}
	check := func(where, out, errOut string, limit int, mask bool) {
		t.Helper()
		if strings.Contains(out, apiKey) || strings.Contains(errOut, apiKey) {
			t.Fatalf("tap output shows the api_key:\n%s", out)
		}
		if mask == strings.Contains(out, secretProp) {
			t.Fatalf("--mask=%v, property value shown=%v:\n%.2000s", mask, !mask, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != limit {
			t.Fatalf("%s: %d lines, want --limit %d:\n%.2000s\nstderr: %s", where, len(lines), limit, out, errOut)
		}
		for _, l := range lines {
			var x line
			if err := json.Unmarshal([]byte(l), &x); err != nil {
				t.Fatalf("not JSON: %q: %v", l, err)
			}
			if x.Where != where || x.APIKeyHash != wantHash || x.Event.DeviceID != "dev-7" || x.Event.EventType != "e1" || x.Event.InsertID == "" {
				t.Fatalf("line %s: want where %s, api_key_hash %s, device dev-7, event_type e1, an insert_id", l, where, wantHash)
			}
			if mask && x.Event.EventProperties["secret"] != "***" {
				t.Fatalf("masked line %s: want secret \"***\"", l)
			}
		}
		if !strings.Contains(errOut, `"end":"limit"`) {
			t.Fatalf("stderr %q: want the end line of the limit", errOut)
		}
	}

	out, errOut, err := tapCmd("--device", "dev-7", "--event-type", "e1", "--limit", "25", "--mask")
	if err != nil {
		t.Fatalf("relay tap: %v\n%s", err, errOut)
	}
	check("ingest", out, errOut, 25, true)
	out, errOut, err = tapCmd("--device", "dev-7", "--event-type", "e1", "--limit", "10", "--where", "delivered")
	if err != nil {
		t.Fatalf("relay tap --where delivered: %v\n%s", err, errOut)
	}
	check("delivered", out, errOut, 10, false)

	// The most taps at once (4), then a fifth is refused.
	hc := &http.Client{}
	var open []*http.Response
	for range 4 {
		req, _ := http.NewRequest(http.MethodGet, "http://"+r.AdminListen+"/relay/v1/tap?device=nobody&duration=5m", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("tap: %v %v", resp, err)
		}
		open = append(open, resp)
	}
	if _, errOut, err := tapCmd("--limit", "1"); err == nil || !strings.Contains(errOut, "429") {
		t.Fatalf("a fifth tap: err %v, stderr %q; want a 429 refusal", err, errOut)
	}
	for _, resp := range open {
		resp.Body.Close()
	}
	// No token: refused.
	if resp, err := hc.Get("http://" + r.AdminListen + "/relay/v1/tap?limit=1"); err != nil || resp.StatusCode != 401 {
		t.Fatalf("tap without the token: %v %v, want 401", resp, err)
	} else {
		resp.Body.Close()
	}
	// The taps closed, a new one is taken again (polled: the relay sees the
	// closed connections a moment later).
	polltest.Until(t, "a tap taken after the others closed", func() bool {
		_, _, err := tapCmd("--limit", "1", "--device", "dev-3")
		return err == nil
	})
	stopLoad()
	wg.Wait()
	if failed.Load() != 0 || posted.Load() == 0 {
		t.Fatalf("load: %d events posted, %d requests failed", posted.Load(), failed.Load())
	}
	t.Logf("%d events posted during the taps, none failed", posted.Load())
}

// TestTapDeadLetters: `relay tap --where dead` shows dead letters as they
// are written, with their reason (here every event expires: --max-event-age
// 1ms).
func TestTapDeadLetters(t *testing.T) {
	if testing.Short() {
		t.Skip("binary-level test; skipped under -short")
	}
	t.Parallel()
	bin := harness.Build(t)
	dir := t.TempDir()
	sim := harness.StartSim(t, bin, dir)
	r := harness.StartRelay(t, bin, dir, &harness.RelayOpts{DataDir: filepath.Join(dir, "data"), IngestURL: sim.Base,
		Extra: []string{"--sync", "none", "--max-event-age", "1ms", "--flush-interval", "50ms"}})
	defer r.Stop(t, 30*time.Second)

	cctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, bin, "tap", "--admin", "http://"+r.AdminListen, "--where", "dead", "--device", "dev-1", "--limit", "3")
	cmd.Env = harness.CleanEnv()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(2 * time.Minute)
	polltest.Until(t, "the tap to attach", func() bool {
		n, _ := r.Metric("relay_tap_attached")
		return n == 1
	})
	hc := harness.NewClient()
	var err error
	for {
		select {
		case err = <-done:
		default:
			if time.Now().After(deadline) {
				t.Fatalf("the tap saw no 3 dead letters: %s %s", o.String(), e.String())
			}
			body := `{"api_key":"dead-key","events":[{"event_type":"e","device_id":"dev-1"},{"event_type":"e","device_id":"dev-2"}]}`
			if code, b, perr := r.Post(hc, "/2/httpapi", []byte(body)); perr != nil || code != 200 {
				t.Fatalf("post: %d %s %v", code, b, perr)
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		break
	}
	if err != nil {
		t.Fatalf("relay tap: %v: %s", err, e.String())
	}
	lines := strings.Split(strings.TrimSpace(o.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), o.String())
	}
	for _, l := range lines {
		var x struct {
			Where  string `json:"where"`
			Reason string `json:"reason"`
			Event  struct {
				DeviceID string `json:"device_id"`
			} `json:"event"`
		}
		if err := json.Unmarshal([]byte(l), &x); err != nil || x.Where != "dead" || x.Reason != "expired" || x.Event.DeviceID != "dev-1" {
			t.Fatalf("line %s: want a dead letter of dev-1, reason expired", l)
		}
	}
}
