package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// event is what the tests read back of a generated event.
type event struct {
	UserID     string          `json:"user_id"`
	DeviceID   string          `json:"device_id"`
	EventType  string          `json:"event_type"`
	InsertID   *string         `json:"insert_id"`
	Time       *int64          `json:"time"`
	SessionID  *int64          `json:"session_id"`
	Platform   string          `json:"platform"`
	OSName     string          `json:"os_name"`
	OSVersion  string          `json:"os_version"`
	Language   string          `json:"language"`
	IP         string          `json:"ip"`
	EventProps map[string]any  `json:"event_properties"`
	UserProps  map[string]any  `json:"user_properties"`
	Raw        json.RawMessage `json:"-"`
}

// patched returns tp's body with its stamps and insert_ids filled in, as
// run sends it.
func patched(tp template, us uint64) []byte {
	b := append([]byte(nil), tp.body...)
	for i, off := range tp.insertIDs {
		put16(b, off, uint64(1000+i))
	}
	for _, off := range tp.sentUS {
		put16(b, off, us)
	}
	return b
}

// decode parses a body and returns its api_key, events and the raw events.
func decode(t *testing.T, b []byte) (string, []event, []json.RawMessage) {
	t.Helper()
	var env struct {
		APIKey string            `json:"api_key"`
		Events []json.RawMessage `json:"events"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		t.Fatalf("body is not JSON: %v", err)
	}
	evs := make([]event, len(env.Events))
	for i, raw := range env.Events {
		if err := json.Unmarshal(raw, &evs[i]); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	return env.APIKey, evs, env.Events
}

func TestTemplates(t *testing.T) {
	const stamp = 1763700000000000
	tests := []struct {
		name      string
		profile   string
		events    int
		apiKeys   int
		insertIDs bool
		avgMin    float64 // average bytes per event, for >= 100 events
		avgMax    float64
	}{
		{"sdk, one event", profileSDK, 1, 1, false, 0, 0},
		{"sdk, 100 events", profileSDK, 100, 1, false, 450, 540},
		{"sdk, 1000 events, 3 keys", profileSDK, 1000, 3, false, 450, 540},
		{"sdk with insert_ids", profileSDK, 100, 1, true, 480, 600},
		{"small, 100 events", profileSmall, 100, 1, false, 85, 120},
		{"small with insert_ids", profileSmall, 100, 2, true, 130, 180},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := config{events: tc.events, apiKeys: tc.apiKeys, devices: 100000, zipfS: 1.1, seed: 1, templates: 3,
				profile: tc.profile, insertIDs: tc.insertIDs}
			keys := map[string]bool{}
			for _, tp := range buildTemplates(c, 3) {
				ids := map[string]bool{}
				if len(tp.sentUS) != tc.events {
					t.Fatalf("%d sent_us offsets, want %d", len(tp.sentUS), tc.events)
				}
				if want := map[bool]int{true: tc.events}[tc.insertIDs]; len(tp.insertIDs) != want {
					t.Fatalf("%d insert_id offsets, want %d", len(tp.insertIDs), want)
				}
				// The template's own body must be JSON too (-dump-body
				// without patching would send it).
				if !json.Valid(tp.body) {
					t.Fatalf("unpatched body is not JSON")
				}
				b := patched(tp, stamp)
				key, evs, raws := decode(t, b)
				keys[key] = true
				if len(evs) != tc.events {
					t.Fatalf("%d events, want %d", len(evs), tc.events)
				}
				var sum int
				distinct := map[string]bool{}
				signedIn, sessions := 0, 0
				for i, e := range evs {
					sum += len(raws[i])
					distinct[string(raws[i])] = true
					if e.DeviceID == "" || e.EventType == "" {
						t.Fatalf("event %d lacks device_id or event_type: %s", i, raws[i])
					}
					if sent, _ := e.EventProps["sent_us"].(float64); sent != stamp {
						t.Fatalf("event %d: sent_us %v, want %d", i, e.EventProps["sent_us"], stamp)
					}
					if tc.insertIDs {
						if e.InsertID == nil || e.Time == nil || ids[*e.InsertID] {
							t.Fatalf("event %d: insert_id %v (repeated or absent) or no time: %s", i, e.InsertID, raws[i])
						}
						ids[*e.InsertID] = true
					} else if e.InsertID != nil || e.Time != nil {
						t.Fatalf("event %d has an insert_id or a time, which the SDKs do not send: %s", i, raws[i])
					}
					if tc.profile == profileSDK {
						if e.Platform == "" || e.OSName == "" || e.OSVersion == "" || e.Language == "" ||
							e.IP != "$remote" || len(e.EventProps) < 2 || len(e.UserProps) == 0 {
							t.Fatalf("event %d is not SDK-shaped: %s", i, raws[i])
						}
						if e.UserID != "" {
							signedIn++
						}
						if e.SessionID != nil {
							sessions++
						}
					}
				}
				if sum != tp.eventBytes {
					t.Fatalf("eventBytes %d, the events measure %d", tp.eventBytes, sum)
				}
				// bench/sink counts events by their "event_type" keys.
				if n := bytes.Count(b, []byte(`"event_type"`)); n != tc.events {
					t.Fatalf("%d \"event_type\" strings, want one per event (%d)", n, tc.events)
				}
				if tc.events >= 100 {
					avg := float64(sum) / float64(tc.events)
					if avg < tc.avgMin || avg > tc.avgMax {
						t.Fatalf("average %.0f bytes per event, want %.0f..%.0f", avg, tc.avgMin, tc.avgMax)
					}
					// Varied per event, not one repeated string (small
					// events have few fields to vary).
					if tc.profile == profileSDK && len(distinct) < tc.events*9/10 || len(distinct) < tc.events/2 {
						t.Fatalf("%d distinct events of %d", len(distinct), tc.events)
					}
					if tc.profile == profileSDK && (signedIn < tc.events/2 || sessions < tc.events/2) {
						t.Fatalf("%d of %d events with a user_id, %d with a session_id: want most", signedIn, tc.events, sessions)
					}
				}
			}
			if want := min(tc.apiKeys, 3); len(keys) != want {
				t.Fatalf("%d distinct api_keys, want %d", len(keys), want)
			}
		})
	}
}

// TestSDKEventSizes: the SDK profile's events spread in size (one size
// would let a benchmark fit a buffer exactly), around ~490 bytes.
func TestSDKEventSizes(t *testing.T) {
	c := config{events: 1000, apiKeys: 1, devices: 100000, zipfS: 1.1, seed: 7, templates: 1, profile: profileSDK}
	tp := buildTemplates(c, 1)[0]
	_, _, raws := decode(t, patched(tp, 1763700000000000))
	lo, hi := len(raws[0]), len(raws[0])
	for _, r := range raws {
		lo, hi = min(lo, len(r)), max(hi, len(r))
	}
	if lo > 420 || hi < 600 {
		t.Fatalf("event sizes %d..%d bytes, want a spread from under 420 to over 600", lo, hi)
	}
}

func TestDumpDir(t *testing.T) {
	dir := t.TempDir()
	c := config{events: 10, apiKeys: 2, devices: 1000, zipfS: 1.1, seed: 1, templates: 4, profile: profileSDK,
		insertIDs: true, dumpDir: dir}
	if err := dump(c); err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for i := range 4 {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("body-%d.json", i)))
		if err != nil {
			t.Fatal(err)
		}
		_, evs, _ := decode(t, b)
		for _, e := range evs {
			// the stamp is the dump's time: within a minute of now.
			sent, _ := e.EventProps["sent_us"].(float64)
			if d := time.Since(time.UnixMicro(int64(sent))); d < 0 || d > time.Minute {
				t.Fatalf("body %d: sent_us %v is not the dump's time", i, sent)
			}
			if e.InsertID == nil || ids[*e.InsertID] {
				t.Fatalf("body %d: insert_id %v absent or repeated across the bodies", i, e.InsertID)
			}
			ids[*e.InsertID] = true
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "body-4.json")); err == nil {
		t.Fatal("more bodies than -templates")
	}
}

// TestRunCountsBodyBytes: RESULT's body_bytes is what the server received,
// and mb_s is body_bytes over the measured seconds.
func TestRunCountsBodyBytes(t *testing.T) {
	var got, reqs atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		got.Add(n)
		reqs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"code":200}`)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	c := config{url: "http://" + ln.Addr().String() + "/2/httpapi", conns: 2, events: 50, requests: 30,
		devices: 1000, zipfS: 1.1, apiKeys: 1, templates: 5, seed: 1, timeout: 10 * time.Second, profile: profileSDK}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if rc := run(c, &out); rc != 0 {
		t.Fatalf("run: %d\n%s", rc, out.String())
	}
	res := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, "RESULT "); ok {
			for _, kv := range strings.Fields(rest) {
				k, v, _ := strings.Cut(kv, "=")
				res[k] = v
			}
		}
	}
	if res["status_200"] != "30" || reqs.Load() != 30 {
		t.Fatalf("status_200=%s, server saw %d requests; want 30\n%s", res["status_200"], reqs.Load(), out.String())
	}
	bb, _ := strconv.ParseInt(res["body_bytes"], 10, 64)
	if bb != got.Load() || bb < 30*50*400 {
		t.Fatalf("body_bytes=%d, the server received %d", bb, got.Load())
	}
	mbs, _ := strconv.ParseFloat(res["mb_s"], 64)
	secs, _ := strconv.ParseFloat(res["secs"], 64)
	// secs is printed to the millisecond.
	if lo, hi := float64(bb)/(secs+0.0006)/1e6, float64(bb)/max(secs-0.0006, 1e-9)/1e6; mbs < lo-0.01 || mbs > hi+0.01 {
		t.Fatalf("mb_s=%v, body_bytes/secs = %.2f..%.2f", mbs, lo, hi)
	}
	if res["profile"] != profileSDK {
		t.Fatalf("profile=%q", res["profile"])
	}
}
