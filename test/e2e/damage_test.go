package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// TestDamagedChunkAtBinaryLevel: a relay whose spool.db holds a chunk with
// 64 flipped bytes (a bad sector) starts, moves that chunk's records to dead
// letters with reason damaged (counted, logged once), delivers every other
// event in order per device, and stops promptly. The package tests passed
// while the binary spun on the chunk for ever: its reader wrote the dead
// letters with a context that was already done.
func TestDamagedChunkAtBinaryLevel(t *testing.T) {
	if testing.Short() {
		t.Skip("binary-level test; skipped under -short")
	}
	t.Parallel()
	const (
		apiKey          = "damage-key"
		requests, per   = 40, 50
		damaged, devs   = 17, 7
		damagedInsertID = "dmg-017-10"
	)
	bin := harness.Build(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	// Upstream down: every event waits in the spool.
	r := harness.StartRelay(t, bin, dir, &harness.RelayOpts{DataDir: data, IngestURL: "http://" + harness.FreeAddr(t)})
	hc := harness.NewClient()
	for q := range requests {
		var evs []string
		for j := range per {
			evs = append(evs, fmt.Sprintf(`{"event_type":"e","device_id":"device-%d","insert_id":"dmg-%03d-%02d","event_properties":{"pad":%q}}`,
				(q*per+j)%devs, q, j, strings.Repeat("x", 60)))
		}
		body := fmt.Sprintf(`{"api_key":%q,"events":[%s]}`, apiKey, strings.Join(evs, ","))
		if code, b, err := r.Post(hc, "/2/httpapi", []byte(body)); err != nil || code != 200 {
			t.Fatalf("post %d: %d %s %v", q, code, b, err)
		}
	}
	// A clean stop leaves every chunk in spool.db.
	if err := r.Stop(t, polltest.Max); err != nil {
		t.Fatalf("stop: %v", err)
	}
	db := filepath.Join(data, "spool.db")
	b, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for i := bytes.Index(b, []byte(damagedInsertID)); i >= 0; i = bytes.Index(b, []byte(damagedInsertID)) {
		for j := range 64 {
			b[i+j] ^= 0x5a
		}
		found++
	}
	if found == 0 {
		t.Fatalf("%s not found in spool.db", damagedInsertID)
	}
	if err := os.WriteFile(db, b, 0o600); err != nil {
		t.Fatal(err)
	}

	sm := harness.StartSim(t, bin, dir)
	r = harness.StartRelay(t, bin, dir, &harness.RelayOpts{DataDir: data, IngestURL: sm.Base,
		Extra: []string{"--spool-upstream-change", "allow"}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	want := (requests - 1) * per
	var stored []sim.Ingested
	// Delivery of 1,950 events through a relay on a loaded machine: a few
	// seconds; the bound only says how long a failure takes to show.
	polltest.Within(t, 3*time.Minute, fmt.Sprintf("%d events delivered", want), func() bool {
		stored, err = sm.Ctl.Events(ctx, apiKey, 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(stored) >= want
	})
	last := map[string]string{}
	got := map[string]bool{}
	for _, e := range stored {
		if strings.HasPrefix(e.InsertID, fmt.Sprintf("dmg-%03d-", damaged)) {
			t.Errorf("event %s of the damaged chunk was delivered", e.InsertID)
		}
		if got[e.InsertID] {
			t.Errorf("event %s delivered twice", e.InsertID)
		}
		got[e.InsertID] = true
		if p := last[e.DeviceID]; p >= e.InsertID {
			t.Errorf("%s: %s after %s", e.DeviceID, e.InsertID, p)
		}
		last[e.DeviceID] = e.InsertID
	}
	if len(got) != want {
		t.Errorf("%d distinct events delivered, want %d", len(got), want)
	}
	// The damaged chunk: dead letters with reason damaged, counted, one
	// error line; the lane holds nothing more.
	var dl struct {
		DeadLetters []struct {
			Reason string `json:"reason"`
		} `json:"dead_letters"`
		Total int `json:"total"`
	}
	getJSON(t, "http://"+r.AdminListen+"/relay/v1/deadletters?limit=1000", &dl)
	damagedN := 0
	for _, d := range dl.DeadLetters {
		if d.Reason == "damaged" {
			damagedN++
		}
	}
	n, err := r.Metric("relay_spool_damaged_records_total", `file="db"`)
	if err != nil {
		t.Fatal(err)
	}
	if damagedN == 0 || damagedN != dl.Total || float64(damagedN) != n || damagedN > per {
		t.Errorf("%d dead letters with reason damaged of %d, relay_spool_damaged_records_total{file=db} %v; want only the damaged chunk's (1 to %d), counted", damagedN, dl.Total, n, per)
	}
	t.Logf("%d dead letters with reason damaged", damagedN)
	var lanes struct {
		Lanes []struct {
			Records int `json:"records"`
		} `json:"lanes"`
	}
	polltest.Until(t, "the lane to be empty", func() bool {
		getJSON(t, "http://"+r.AdminListen+"/relay/v1/lanes", &lanes)
		for _, l := range lanes.Lanes {
			if l.Records != 0 {
				return false
			}
		}
		return true
	})
	if err := r.Stop(t, polltest.Max); err != nil {
		t.Fatalf("stop: %v\n%s", err, r.LogTail(4000))
	}
	logb, err := os.ReadFile(r.Log)
	if err != nil {
		t.Fatal(err)
	}
	if c := bytes.Count(logb, []byte("failed its checksum")); c != 1 {
		t.Errorf("%d log lines about the damaged chunk, want 1", c)
	}
	if bytes.Contains(logb, []byte("did not stop in time")) {
		t.Errorf("the relay did not stop promptly:\n%s", r.LogTail(4000))
	}
}

// getJSON decodes the JSON answer of a GET to url into v.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := (&http.Client{Timeout: polltest.Max}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}
