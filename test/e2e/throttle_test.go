package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// TestThrottlePauseAtBinaryLevel drives one device far above the upstream's
// rate limit through the real binary and requires, from the simulator's
// request log: after each 429 naming the device, no request holding that
// device arrives before --throttle-pause has passed, while other devices'
// events are delivered inside every such window; and the 429s are not
// hammered (about one per pause).
func TestThrottlePauseAtBinaryLevel(t *testing.T) {
	if testing.Short() {
		t.Skip("binary-level test; skipped under -short")
	}
	t.Parallel()
	const (
		apiKey = "e2e-throttle-api-key"
		hot    = "hot-device"
		pause  = 2 * time.Second
		run    = 7 * time.Second
	)
	bin := harness.Build(t)
	dir := t.TempDir()
	// 5 events/s over the sim's 10 s window: 50 events of one device and the
	// next request with it is answered 429 (and stays so for the sim's 30 s
	// penalty, so the relay's every retry after a pause meets a 429 again).
	sm := harness.StartSim(t, bin, dir, "--eps-threshold", "5")
	r := harness.StartRelay(t, bin, dir, &harness.RelayOpts{
		DataDir:   filepath.Join(dir, "data"),
		IngestURL: sm.Base,
		Extra: []string{
			"--flush-interval", "20ms",
			"--max-batch-events", "20",
			"--throttle-pause", pause.String(),
			"--drain-timeout", "1s",
		},
	})
	hc := harness.NewClient()
	post := func(events []string) {
		t.Helper()
		body := fmt.Sprintf(`{"api_key":%q,"events":[%s]}`, apiKey, strings.Join(events, ","))
		code, b, err := r.Post(hc, "/2/httpapi", []byte(body))
		if err != nil || code != 200 {
			t.Fatalf("post: %d %s %v", code, b, err)
		}
	}
	var hotEvents []string
	for i := range 300 {
		hotEvents = append(hotEvents, fmt.Sprintf(`{"event_type":"hot","device_id":%q,"insert_id":"hot-%04d","event_properties":{"seq":%d}}`, hot, i, i))
	}
	t0 := time.Now()
	post(hotEvents)

	// Cold devices: 20 events/s over 40 devices (0.5/s each, far under 5).
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			post([]string{fmt.Sprintf(`{"event_type":"cold","device_id":"cold-%02d","insert_id":"cold-%05d"}`, i%40, i)})
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	maxPaused := 0.0
	wg.Go(func() {
		for ctx.Err() == nil {
			if v, err := r.Metric("relay_delivery_paused_devices"); err == nil {
				maxPaused = max(maxPaused, v)
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	})
	wg.Wait()
	if err := r.Stop(t, 15*time.Second); err != nil {
		t.Fatalf("relay exit after SIGTERM: %v\n%s", err, r.LogTail(4000))
	}
	bg := context.Background()
	recs, err := sm.Ctl.Requests(bg, 0)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := sm.Ctl.Events(bg, apiKey, 0)
	if err != nil {
		t.Fatal(err)
	}

	has := func(rc sim.Record, dev string) bool { return slices.Contains(rc.Devices, dev) }
	hasCold := func(rc sim.Record) bool {
		return slices.ContainsFunc(rc.Devices, func(d string) bool { return strings.HasPrefix(d, "cold-") })
	}
	var windows []time.Time // arrival times of the 429s that named the hot device
	for _, rc := range recs {
		if rc.Status == 429 && has(rc, hot) {
			windows = append(windows, rc.Time)
		}
	}
	if len(windows) < 2 {
		t.Fatalf("only %d 429s for the hot device in %v: the test proved little (statuses: %v)", len(windows), run, statuses(recs))
	}
	const slack = 2 * time.Millisecond // two processes' wall clocks read on one machine
	end := recs[len(recs)-1].Time
	checked := 0
	for _, w := range windows {
		until := w.Add(pause)
		coldInside := 0
		for _, rc := range recs {
			if !rc.Time.After(w) || !rc.Time.Before(until.Add(-slack)) {
				continue
			}
			if has(rc, hot) {
				t.Errorf("request %d holds %s %v after its 429 at %v: inside the %v pause", rc.Seq, hot, rc.Time.Sub(w), w.Format("15:04:05.000"), pause)
			}
			if rc.Status == 200 && hasCold(rc) {
				coldInside++
			}
		}
		if until.Before(end) { // a window wholly inside the run
			checked++
			if coldInside == 0 {
				t.Errorf("no other device delivered during the pause after the 429 at %v", w.Format("15:04:05.000"))
			}
		}
	}
	if checked == 0 {
		t.Errorf("no pause window ended inside the run")
	}
	// No hammering: about one 429 per pause (the first, plus one retry per
	// pause that ends within the run).
	if limit := int(time.Since(t0)/pause) + 2; len(windows) > limit {
		t.Errorf("%d 429s for the hot device in %v: more than one per %v pause", len(windows), time.Since(t0).Round(time.Millisecond), pause)
	}
	if maxPaused < 1 {
		t.Errorf("relay_delivery_paused_devices never above 0 while the device was paused")
	}
	// Whatever of the hot device got in, got in in order.
	var hotSeqs []int
	coldStored := 0
	for _, e := range stored {
		if e.DeviceID != hot {
			coldStored++
			continue
		}
		var ev harness.SeqEvent
		if err := json.Unmarshal(e.Raw, &ev); err != nil {
			t.Fatal(err)
		}
		hotSeqs = append(hotSeqs, ev.EventProperties.Seq)
	}
	if !slices.IsSorted(hotSeqs) {
		t.Errorf("hot device's events ingested out of order: %v", hotSeqs)
	}
	t.Logf("%d 429s for %s (windows checked: %d), %d requests %v, hot events ingested %d of 300, cold %d, max paused devices %v",
		len(windows), hot, checked, len(recs), statuses(recs), len(hotSeqs), coldStored, maxPaused)
}

func statuses(recs []sim.Record) map[int]int {
	m := map[int]int{}
	for _, rc := range recs {
		m[rc.Status]++
	}
	return m
}
