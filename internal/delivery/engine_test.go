package delivery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// ackRunner is a minimal kind: it acknowledges every chunk it reads.
type ackRunner struct {
	l    *spool.Lane
	sp   *spool.Spool
	runs *atomic.Int32
	st   StopSwitch
}

func (r *ackRunner) Run(ctx, _ context.Context) error {
	r.runs.Add(1)
	for {
		if err := waitRunning(ctx, &r.st); err != nil {
			return err
		}
		cs, err := r.l.Next(ctx, 1<<20)
		if err != nil {
			return err
		}
		for _, c := range cs {
			r.l.Ack(c.Seq)
		}
	}
}

func (r *ackRunner) Status() LaneStatus {
	stopped, reason := r.st.State()
	return LaneStatus{ID: r.l.ID(), Label: r.l.Key().Label(), Stopped: stopped, StopReason: reason}
}
func (r *ackRunner) Stop(reason string) { r.st.Stop(reason) }
func (r *ackRunner) Resume()            { r.st.Resume() }

// The engine runs a runner per lane of its kind only, answers the lane
// control and relay_lane_stopped from them, keeps a runner (and its stop)
// across Runs, and forgets it when the spool retires its lane.
func TestEngine(t *testing.T) {
	sp, err := spool.Open(spool.Config{Dir: t.TempDir(), NoSync: true, MinFreeBytes: -1, RetireIdle: 50 * time.Millisecond}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	var runs atomic.Int32
	e, err := NewEngine(EngineConfig[*ackRunner]{Name: "test", Kind: storage.KindGroupIdentify, NewRunner: func(q storage.LaneQueue) *ackRunner {
		l := q.Lane().(*spool.Lane)
		r := &ackRunner{l: l, sp: sp, runs: &runs}
		r.st.Lane = l
		return r
	}}, spool.NewBackend(sp))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(NewStoppedCollector(func() []LaneStatus { return engineStatus(e) }, true)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	add := func(kind storage.Kind, key string) *spool.Lane {
		l, err := sp.Lane(ctx, storage.LaneKey{Kind: kind, APIKey: key})
		if err != nil {
			t.Fatal(err)
		}
		var b storage.Batch
		b.Add(storage.Record{Data: []byte(`{}`)})
		if err := sp.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
		return l
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(polltest.Max); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v (status %+v, runs %d)", what, polltest.Max, engineStatus(e), runs.Load())
			}
		}
	}
	ev := add(storage.KindEvents, "k")
	gi := add(storage.KindGroupIdentify, "k")
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(runCtx) }()
	waitFor("gi lane running", func() bool { return runs.Load() == 1 })
	if err := e.Run(runCtx); !errors.Is(err, ErrAlreadyRunning) {
		t.Fatalf("second Run: %v", err)
	}
	if err := e.StopLane(ev.ID()); !errors.Is(err, ErrUnknownLane) {
		t.Fatalf("StopLane of an events lane: %v", err)
	}
	if err := e.StopLane(gi.ID()); err != nil {
		t.Fatal(err)
	}
	if got := stoppedSeries(t, reg); got != gi.Key().Label()+"=1" {
		t.Fatalf("relay_lane_stopped: %q", got)
	}
	// Stop state survives a restart of Run; the runner is started again.
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	runCtx, cancel = context.WithCancel(ctx)
	defer func() {
		cancel()
		<-done
	}()
	go func() { done <- e.Run(runCtx) }()
	waitFor("gi lane runs again", func() bool { return runs.Load() == 2 })
	if st := engineStatus(e); len(st) != 1 || st[0].ID != gi.ID() || !st[0].Stopped {
		t.Fatalf("status after restart: %+v", st)
	}
	// Resumed, the lane is drained, retired by the spool and forgotten.
	if err := e.ResumeLane(gi.ID()); err != nil {
		t.Fatal(err)
	}
	waitFor("retired lane forgotten", func() bool { return len(engineStatus(e)) == 0 })
	if got := stoppedSeries(t, reg); got != "" {
		t.Fatalf("relay_lane_stopped of a forgotten lane: %q", got)
	}
	// A new lane of the same key is a new runner.
	add(storage.KindGroupIdentify, "k")
	waitFor("new lane runs", func() bool { return runs.Load() == 3 && len(engineStatus(e)) == 1 })
	if err := e.ResumeLane(ev.ID()); !errors.Is(err, ErrUnknownLane) {
		t.Fatalf("ResumeLane of an events lane: %v", err)
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

// idleRunner acknowledges every chunk and ends (storage.ErrIdle) as soon as
// its lane has nothing to read.
type idleRunner struct {
	ackRunner
	running *atomic.Int32
}

func (r *idleRunner) Run(ctx, _ context.Context) error {
	r.runs.Add(1)
	r.running.Add(1)
	defer r.running.Add(-1)
	for {
		if err := r.l.Wait(ctx, func() bool { return true }); err != nil {
			return err
		}
		cs, err := r.l.Next(ctx, 1<<20)
		if err != nil {
			return err
		}
		for _, c := range cs {
			r.l.Ack(c.Seq)
		}
	}
}

// A runner that ends idle (storage.ErrIdle) holds no goroutine; the engine
// runs it again at its lane's next record (each record is read), and
// forgets it when the lane retires; a Run that ended does not start it.
func TestEngineIdleRunner(t *testing.T) {
	sp, err := spool.Open(spool.Config{Dir: t.TempDir(), NoSync: true, MinFreeBytes: -1, RetireIdle: time.Hour}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	var runs, running atomic.Int32
	e, err := NewEngine(EngineConfig[*idleRunner]{Kind: storage.KindUserMap, NewRunner: func(q storage.LaneQueue) *idleRunner {
		l := q.Lane().(*spool.Lane)
		return &idleRunner{ackRunner: ackRunner{l: l, sp: sp, runs: &runs}, running: &running}
	}}, spool.NewBackend(sp))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	l, err := sp.Lane(ctx, storage.LaneKey{Kind: storage.KindUserMap, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 2 minutes (runs %d, running %d, lane %+v)", what, runs.Load(), running.Load(), l.Stats())
			}
		}
	}
	for i := range 3 {
		var b storage.Batch
		b.Add(storage.Record{Data: []byte(`{}`)})
		if err := sp.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
		wait(fmt.Sprintf("record %d read and the runner ended", i), func() bool {
			return l.Stats().Records == 0 && running.Load() == 0 && runs.Load() >= int32(i+1)
		})
	}
	if _, ok := e.Lane(l.ID()); !ok {
		t.Fatal("an idle lane's runner is forgotten")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	n := runs.Load()
	var b storage.Batch
	b.Add(storage.Record{Data: []byte(`{}`)})
	if err := sp.Append(context.Background(), l, &b); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if runs.Load() != n || running.Load() != 0 {
		t.Fatalf("a runner started after Run returned: runs %d -> %d", n, runs.Load())
	}
}

// engineStatus is the status of e's lanes, by lane id.
func engineStatus(e *Engine[*ackRunner]) []LaneStatus {
	var out []LaneStatus
	for _, r := range e.Runners() {
		out = append(out, r.Status())
	}
	slices.SortFunc(out, func(a, b LaneStatus) int { return cmp.Compare(a.ID, b.ID) })
	return out
}
