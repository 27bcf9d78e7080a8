package delivery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zaptest"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/throttle"
)

// runHarness is a harness whose spool retires a lane idle for retire and
// hands the pipeline every lane kind (its Run keeps the events' only).
func runHarness(t *testing.T, retire time.Duration) *harness {
	t.Helper()
	return runHarnessOn(t, retire, false)
}

// runHarnessOn is runHarness, in a synctest bubble when inProcess (see
// newSyncHarness).
func runHarnessOn(t *testing.T, retire time.Duration, inProcess bool) *harness {
	t.Helper()
	h := newHarnessOn(t, sim.Config{}, Config{}, throttle.Config{}, inProcess)
	if err := h.sp.Close(); err != nil {
		t.Fatal(err)
	}
	var err error
	h.sp, err = spool.Open(spool.Config{Dir: h.dir, NoSync: true, MinFreeBytes: -1, RetireIdle: retire}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.reg = prometheus.NewRegistry()
	h.p, err = New(h.cfg, spool.NewBackend(h.sp), h.send, h.thr, zaptest.NewLogger(t), h.reg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// Run runs a runner per lane of its kind only, answers the lane control and
// relay_lane_stopped from them, keeps a runner (and its stop) across Runs,
// and forgets it when the spool retires its lane.
func TestRunLanes(t *testing.T) {
	h := runHarness(t, 50*time.Millisecond)
	h.down(simtest.Down503, 0) // the lane keeps its record: it does not retire
	h.add("key-one", ev{Device: "device-1"})
	l := h.lane("key-one", "")
	gi, err := h.sp.Lane(context.Background(), storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	var b storage.Batch
	b.Add(storage.Record{Data: []byte(`{}`)})
	if err := h.sp.Append(context.Background(), gi, &b); err != nil {
		t.Fatal(err)
	}
	h.start()
	polltest.Until(t, "events lane running", func() bool { return h.p.lane(l.ID()) != nil })
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	second := make(chan error, 1)
	go func() { second <- h.p.Run(cancelled) }()
	select {
	case err := <-second:
		if !errors.Is(err, ErrAlreadyRunning) {
			t.Fatalf("second Run: %v", err)
		}
	case <-time.After(polltest.Max):
		t.Fatal("a second Run did not return") // it runs the lanes beside the first
	}
	if err := h.p.StopLane(gi.ID()); !errors.Is(err, ErrUnknownLane) {
		t.Fatalf("StopLane of a group identify lane: %v", err)
	}
	if err := h.p.StopLane(l.ID()); err != nil {
		t.Fatal(err)
	}
	if got := stoppedSeries(t, h.reg); got != l.Key().Label()+"=1" {
		t.Fatalf("relay_lane_stopped: %q", got)
	}
	// The stop state survives a restart of Run; the runner runs again.
	h.stop()
	h.up()
	h.start()
	if st := h.p.LaneStatus(); len(st) != 1 || st[0].ID != l.ID() || !st[0].Stopped {
		t.Fatalf("status after restart: %+v", st)
	}
	// Resumed, the lane is drained, retired by the spool and forgotten.
	if err := h.p.ResumeLane(l.ID()); err != nil {
		t.Fatal(err)
	}
	polltest.Until(t, "retired lane forgotten", func() bool {
		return h.sim.Stats().Ingested == 1 && len(h.p.LaneStatus()) == 0
	})
	if got := stoppedSeries(t, h.reg); got != "" {
		t.Fatalf("relay_lane_stopped of a forgotten lane: %q", got)
	}
	// A new lane of the same key is a new runner.
	h.mu.Lock()
	clear(h.lanes)
	h.mu.Unlock()
	h.add("key-one", ev{Device: "device-1"})
	polltest.Until(t, "new lane delivered", func() bool {
		st := h.p.LaneStatus()
		return h.sim.Stats().Ingested == 2 && (len(st) == 0 || st[0].ID != l.ID())
	})
	if err := h.p.ResumeLane(gi.ID()); !errors.Is(err, ErrUnknownLane) {
		t.Fatalf("ResumeLane of a group identify lane: %v", err)
	}
	h.stop()
	if gi.Stats().Records != 1 {
		t.Fatalf("the group identify lane's record went: %+v", gi.Stats())
	}
}

// stoppedSeries returns relay_lane_stopped's series as "lane=value,...".
func stoppedSeries(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "relay_lane_stopped" {
			continue
		}
		if !strings.HasPrefix(mf.GetHelp(), "1 while a lane sends nothing") {
			t.Fatalf("help: %q", mf.GetHelp())
		}
		for _, m := range mf.GetMetric() {
			out = append(out, fmt.Sprintf("%s=%g", m.GetLabel()[0].GetValue(), m.GetGauge().GetValue()))
		}
	}
	return strings.Join(out, ",")
}

// A runner whose records are all done ends (storage.ErrIdle) and holds no
// goroutine; Run runs it again at its lane's next record (each record is
// delivered) and keeps it while the lane lives; a Run that ended does not
// start it.
func TestRunIdleLane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := runHarnessOn(t, time.Hour, true)
		// The events' pipeline exports no gauge of running lanes (the form
		// kinds' do): count them here.
		lanes := prometheus.NewGauge(prometheus.GaugeOpts{Name: "lanes"})
		h.p.m.lanes = lanes
		running := func() float64 {
			var m dto.Metric
			if err := lanes.Write(&m); err != nil {
				t.Fatal(err)
			}
			return m.GetGauge().GetValue()
		}
		h.start()
		for i := range 3 {
			h.add("key-one", ev{Device: "device-1"})
			polltest.Until(t, fmt.Sprintf("record %d delivered and the runner ended", i), func() bool {
				return h.lane("key-one", "").Stats().Records == 0 && running() == 0 && h.sim.Stats().Ingested == int64(i+1)
			})
		}
		l := h.lane("key-one", "")
		if h.p.lane(l.ID()) == nil {
			t.Fatal("an idle lane's runner is forgotten")
		}
		h.stop()
		h.add("key-one", ev{Device: "device-1"})
		time.Sleep(50 * time.Millisecond) // fake time
		synctest.Wait()                   // a runner started by the add would be running
		if running() != 0 || l.Stats().Records != 1 {
			t.Fatalf("a runner ran after Run returned: running %v, lane %+v", running(), l.Stats())
		}
	})
}
