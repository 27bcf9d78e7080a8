package delivery

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

type pins struct{ n int }

// waitRunning returns once s runs (a runner's wait before its next
// request), or ctx's error.
func waitRunning(ctx context.Context, s *StopSwitch) error {
	for c := s.Resumed(); c != nil; c = s.Resumed() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c:
		}
	}
	return nil
}

func (p *pins) Pin()   { p.n++ }
func (p *pins) Unpin() { p.n-- }

func TestStopSwitch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &pins{}
		s := &StopSwitch{Lane: p}
		if err := waitRunning(t.Context(), s); err != nil || s.Stopped() {
			t.Fatalf("zero value: %v, stopped %v", err, s.Stopped())
		}
		if !s.Set(true, "first") || s.Set(true, "second") {
			t.Fatal("Set(true) must report running only the first time")
		}
		if st, why := s.State(); !st || why != "first" || !s.Stopped() || p.n != 1 {
			t.Fatalf("after Stop: %v %q, pins %d", st, why, p.n)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if err := waitRunning(ctx, s); err == nil {
			t.Fatal("Wait returned while stopped")
		}
		done := make(chan error, 1)
		go func() { done <- waitRunning(t.Context(), s) }()
		synctest.Wait()
		if !s.Set(false, "") || s.Set(false, "") {
			t.Fatal("Set(false) must report stopped only the first time")
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if st, why := s.State(); st || why != "" || s.Stopped() || p.n != 0 || s.Resumed() != nil {
			t.Fatalf("after Resume: %v %q, pins %d", st, why, p.n)
		}
	})
}
