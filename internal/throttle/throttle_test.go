package throttle

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		th, err := New(Config{}, reg)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		th.Pause([]string{"d:a", "u:b"}, start.Add(30*time.Second))
		th.Pause([]string{"d:a"}, start.Add(10*time.Second)) // never shortens
		if got := th.PausedUntil([]byte("d:a")); !got.Equal(start.Add(30 * time.Second)) {
			t.Fatalf("d:a paused until %v", got)
		}
		if got := th.PausedUntil([]byte("d:c")); !got.IsZero() {
			t.Fatalf("d:c paused until %v", got)
		}
		if n := gauge(t, reg, "relay_throttle_paused_keys"); n != 2 {
			t.Fatalf("gauge %v", n)
		}
		time.Sleep(29 * time.Second)
		if th.PausedUntil([]byte("u:b")).IsZero() {
			t.Fatal("u:b released early")
		}
		time.Sleep(time.Second)
		if !th.PausedUntil([]byte("u:b")).IsZero() || !th.PausedUntil([]byte("d:a")).IsZero() {
			t.Fatal("pause outlived its end")
		}
		th.Pause([]string{"d:x"}, time.Now().Add(40*time.Second)) // extends past a shorter one
		th.Pause([]string{"d:x"}, time.Now().Add(50*time.Second))
		if got := th.PausedUntil([]byte("d:x")); !got.Equal(time.Now().Add(50 * time.Second)) {
			t.Fatalf("d:x %v", got)
		}
		th.Pause([]string{"d:past"}, time.Now().Add(-time.Second))
		if th.PausedKeys() != 1 {
			t.Fatalf("paused keys %d", th.PausedKeys())
		}
	})
}

func TestPauseUntilNextUTCDay(t *testing.T) {
	loc := time.FixedZone("x", -5*3600)
	for _, tt := range []struct{ now, want time.Time }{
		{time.Date(2026, 3, 1, 23, 59, 59, 0, time.UTC), time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)},
		{time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)},
		{time.Date(2026, 12, 31, 12, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)},
		{time.Date(2026, 3, 1, 21, 0, 0, 0, loc), time.Date(2026, 3, 3, 0, 0, 0, 0, time.UTC)}, // 02:00 UTC on the 2nd
	} {
		th, _ := New(Config{Now: func() time.Time { return tt.now }}, nil)
		if got := th.PauseUntilNextDay([]string{"d:q"}); !got.Equal(tt.want) || !th.PausedUntil([]byte("d:q")).Equal(tt.want) {
			t.Errorf("PauseUntilNextDay at %v = %v, want %v", tt.now, got, tt.want)
		}
	}
}

func TestPauseUntilNextDay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th, _ := New(Config{}, nil)
		until := th.PauseUntilNextDay([]string{"d:q"})
		if !th.PausedUntil([]byte("d:q")).Equal(until) || time.Until(until) > 24*time.Hour {
			t.Fatalf("until %v now %v", until, time.Now())
		}
		time.Sleep(time.Until(until))
		if !th.PausedUntil([]byte("d:q")).IsZero() {
			t.Fatal("still paused at midnight")
		}
	})
}

// Millions of devices must not leak: expired pauses and idle paced keys go.
func TestBoundedMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th, _ := New(Config{PaceForget: time.Second}, nil)
		for round := 0; round < 20; round++ {
			keys := make([]Share, 10_000)
			for i := range keys {
				keys[i] = Share{Key: fmt.Sprintf("d:%d-%d", round, i), Share: 10}
			}
			th.Refused(keys, time.Now().Add(time.Second), 30)
			time.Sleep(2 * time.Second)
		}
		th.mu.Lock()
		np, nb := len(th.paused), len(th.paced)
		th.mu.Unlock()
		if np > 3*10_000+1024 || nb > 3*10_000+1024 {
			t.Fatalf("maps grew: %d paused, %d paced after 200k keys", np, nb)
		}
		if th.PausedKeys() != 0 || th.PacedKeys() != 0 {
			t.Fatal("expired keys counted")
		}
	})
}

func TestMaxKeysCapsPaced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th, _ := New(Config{MaxKeys: 100}, nil)
		for i := 0; i < 1000; i++ {
			th.Refused([]Share{{Key: fmt.Sprint(i), Share: 4}}, time.Now().Add(time.Second), 30)
		}
		if n := th.PacedKeys(); n > 100 {
			t.Fatalf("%d paced keys", n)
		}
		if th.PausedKeys() != 1000 {
			t.Fatal("pauses past MaxKeys not recorded")
		}
	})
}

// A paced key gets at most cap + rate*t events in any t, in requests of at
// most cap; the cap halves on further refusals (never on a second answer
// during the pause), never grows back to a refused share, and grows slowly
// on admitted requests.
func TestAdaptivePacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		th, _ := New(Config{}, reg)
		k := []byte("d:hot")
		if ok, _, paced := th.Take(k, nil); !ok || paced {
			t.Fatal("unpaced key refused or paced")
		}
		pause := 30 * time.Second
		th.Refused([]Share{{Key: "d:hot", Share: 1000}}, time.Now().Add(pause), 0)
		if c := th.Cap("d:hot"); c != 30 {
			t.Fatalf("first cap %d, want eps 30", c)
		}
		if n := gauge(t, reg, "relay_throttle_paced_keys"); n != 1 {
			t.Fatalf("paced gauge %v", n)
		}
		// A second 429 for a request sent before the first: no halving.
		th.Refused([]Share{{Key: "d:hot", Share: 500}}, time.Now().Add(pause), 0)
		if c := th.Cap("d:hot"); c != 30 {
			t.Fatalf("cap %d after a 429 inside the pause", c)
		}
		time.Sleep(pause)
		// Over 10s: at most cap + 27/s*10s events, in runs of at most cap.
		granted, run, maxRun := 0, 0, 0
		for i := 0; i < 2000 && granted < 400; i++ {
			ok, at, paced := th.Take(k, []byte("u:someone"))
			if !paced {
				t.Fatal("paced key not reported")
			}
			if ok {
				granted++
				run++
				maxRun = max(maxRun, run)
				continue
			}
			run = 0
			time.Sleep(time.Until(at))
		}
		if maxRun > 30 {
			t.Fatalf("run of %d events past the cap of 30", maxRun)
		}
		// Further refusal with a share of 30: cap 15, ceiling 29.
		th.Refused([]Share{{Key: "d:hot", Share: 30}}, time.Now().Add(pause), 30)
		if c := th.Cap("d:hot"); c != 15 {
			t.Fatalf("cap %d after a further 429, want 15", c)
		}
		time.Sleep(pause)
		for i := 0; i < 10_000; i++ {
			th.Admitted([]string{"d:hot", "d:not-paced"})
		}
		if c := th.Cap("d:hot"); c != 29 { // the first refusal (share 1000) set no ceiling
			t.Fatalf("cap grew to %d, want the ceiling 29 (under the refused share 30)", c)
		}
		th.Refused([]Share{{Key: "d:hot", Share: 2}}, time.Now().Add(pause), 30)
		time.Sleep(pause)
		th.Refused([]Share{{Key: "d:hot", Share: 1}}, time.Now().Add(pause), 30)
		if c := th.Cap("d:hot"); c != 1 {
			t.Fatalf("cap %d, want 1", c)
		}
		time.Sleep(pause)
		th.Admitted([]string{"d:hot"})
		if c := th.Cap("d:hot"); c != 1 {
			t.Fatalf("cap %d grew past a refused share of 2", c)
		}
	})
}

// The rate: over a long run a paced key gets 0.9*eps events/s, and a user
// and a device paced together both give a token.
func TestPacingRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th, _ := New(Config{}, nil)
		th.Refused([]Share{{Key: "d:a", Share: 20}, {Key: "u:b", Share: 100}}, time.Now(), 10) // no pause
		start := time.Now()
		granted := 0
		for time.Since(start) < 100*time.Second {
			ok, at, _ := th.Take([]byte("d:a"), []byte("u:b"))
			if ok {
				granted++
				continue
			}
			time.Sleep(time.Until(at))
		}
		// cap 10 (half of 20, at most eps 10); 9/s for 100s plus the cap.
		if granted > 900+10 || granted < 880 {
			t.Fatalf("granted %d in 100s at 9/s", granted)
		}
		// u:b alone: it gave a token for every event of d:a.
		for {
			if ok, _, _ := th.Take([]byte("d:a"), []byte("u:b")); !ok {
				break
			}
		}
		if ok, _, _ := th.Take([]byte("u:b"), nil); ok {
			t.Fatal("u:b had tokens left that d:a's events should have taken")
		}
	})
}
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// AnyPaused lets the batcher skip per-event pause lookups: it must be true
// whenever some key is paused, so a false answer can be trusted.
func TestAnyPaused(t *testing.T) {
	th, err := New(Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if th.AnyPaused() {
		t.Fatal("a new throttle reports pauses")
	}
	th.Pause([]string{"d:past"}, time.Now().Add(-time.Second))
	if th.AnyPaused() {
		t.Fatal("a pause in the past counted")
	}
	th.Pause([]string{"u:a"}, time.Now().Add(time.Minute))
	if !th.AnyPaused() || th.PausedUntil([]byte("u:a")).IsZero() {
		t.Fatal("a pause in the future not reported")
	}
}

// TestPaceAll: with PaceAll a key never refused is paced from its first
// event: a full cap of DefaultEPS, then PaceShare*DefaultEPS a second, so in
// any window of W seconds at most cap + rate*W of its events go out.
func TestPaceAll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th, err := New(Config{PaceAll: true, DefaultEPS: 10, PaceShare: 0.5}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !th.AnyPaced() {
			t.Fatal("AnyPaced is false under PaceAll")
		}
		taken := 0
		for range 100 {
			ok, at, paced := th.Take([]byte("d:a"), []byte("u:b"))
			if !paced {
				t.Fatal("a key of PaceAll not paced")
			}
			if !ok {
				if want := time.Now().Add(2 * time.Second); !at.Equal(want) { // 10 tokens at 5/s
					t.Fatalf("refused until %v, want %v", at, want)
				}
				break
			}
			taken++
		}
		if taken != 10 {
			t.Fatalf("first burst %d events, want the cap of 10", taken)
		}
		time.Sleep(time.Second)
		for range 5 {
			if ok, _, _ := th.Take([]byte("d:a"), nil); !ok {
				t.Fatal("refused after a second's refill")
			}
		}
		if ok, _, _ := th.Take([]byte("d:a"), nil); ok {
			t.Fatal("more than the rate's worth after a second")
		}
		th.Admitted([]string{"d:a", "d:a", "d:a"})
		if c := th.Cap("d:a"); c != 10 {
			t.Fatalf("cap grew to %d past DefaultEPS", c)
		}
		off, _ := New(Config{}, nil)
		if ok, _, paced := off.Take([]byte("d:a"), nil); !ok || paced || off.AnyPaced() {
			t.Fatal("a key paced without PaceAll and without a 429")
		}
	})
}

// Cap is key's per-request cap, 0 when key is not paced.
func (t *Throttle) Cap(key string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.paced[key]; p != nil {
		return int(p.cap)
	}
	return 0
}
