package throttle

import (
	"fmt"
	"strings"
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

func TestNextUTCDay(t *testing.T) {
	loc := time.FixedZone("x", -5*3600)
	for _, tt := range []struct{ now, want time.Time }{
		{time.Date(2026, 3, 1, 23, 59, 59, 0, time.UTC), time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)},
		{time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)},
		{time.Date(2026, 12, 31, 12, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)},
		{time.Date(2026, 3, 1, 21, 0, 0, 0, loc), time.Date(2026, 3, 3, 0, 0, 0, 0, time.UTC)}, // 02:00 UTC on the 2nd
	} {
		if got := NextUTCDay(tt.now); !got.Equal(tt.want) {
			t.Errorf("NextUTCDay(%v) = %v, want %v", tt.now, got, tt.want)
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

// Millions of devices must not leak: expired pauses and refilled buckets go.
func TestBoundedMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th, _ := New(Config{PaceEPS: 30, PaceBurst: 30}, nil)
		for round := 0; round < 20; round++ {
			keys := make([]string, 10_000)
			for i := range keys {
				keys[i] = fmt.Sprintf("d:%d-%d", round, i)
				th.Take([]byte(keys[i]), 1)
			}
			th.Pause(keys, time.Now().Add(time.Second))
			time.Sleep(2 * time.Second)
		}
		th.mu.Lock()
		np, nb := len(th.paused), len(th.buckets)
		th.mu.Unlock()
		if np > 3*10_000+1024 || nb > 3*10_000+1024 {
			t.Fatalf("maps grew: %d paused, %d buckets after 200k keys", np, nb)
		}
		if th.PausedKeys() != 0 {
			t.Fatal("expired pauses counted")
		}
	})
}

func TestMaxKeysCapsBuckets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th, _ := New(Config{PaceEPS: 1, MaxKeys: 100}, nil)
		for i := 0; i < 1000; i++ {
			if ok, _ := th.Take([]byte(fmt.Sprint(i)), 1); !ok {
				t.Fatal("first take refused")
			}
		}
		if th.Buckets() > 100 {
			t.Fatalf("%d buckets", th.Buckets())
		}
	})
}

func TestPacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th, _ := New(Config{PaceEPS: 10, PaceBurst: 5}, nil)
		k := []byte("d:hot")
		for i := 0; i < 5; i++ {
			if ok, _ := th.Take(k, 1); !ok {
				t.Fatalf("take %d refused within burst", i)
			}
		}
		ok, at := th.Take(k, 1)
		if ok || time.Until(at) != 100*time.Millisecond {
			t.Fatalf("ok %v at +%v", ok, time.Until(at))
		}
		time.Sleep(100 * time.Millisecond)
		if ok, _ := th.Take(k, 1); !ok {
			t.Fatal("refused after refill")
		}
		// Over 10s, no more than burst + 10/s*10s events are granted.
		granted := 0
		for i := 0; i < 1000; i++ {
			if ok, _ := th.Take(k, 1); ok {
				granted++
			}
			time.Sleep(10 * time.Millisecond)
		}
		if granted > 5+100+1 || granted < 95 {
			t.Fatalf("granted %d in 10s at 10/s", granted)
		}
		off, _ := New(Config{}, nil)
		if ok, _ := off.Take(k, 1000); !ok || off.Pacing() {
			t.Fatal("pacing off refused")
		}
	})
}

func TestValidate(t *testing.T) {
	for _, c := range []Config{{PaceEPS: -1}, {PaceBurst: -1}, {MaxKeys: -1}} {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "negative") {
			t.Errorf("%+v: %v", c, err)
		}
	}
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
