package delivery

import (
	"testing"
	"time"
)

func TestRetryWaits(t *testing.T) {
	r := NewRetry(100*time.Millisecond, time.Second)
	for i := range 50 {
		d := r.Next()
		if d <= 0 || d > time.Second {
			t.Fatalf("wait %d = %v, want in (0, 1s]", i, d)
		}
	}
	r.Reset()
	if d := r.Next(); d > 150*time.Millisecond {
		t.Fatalf("after Reset: %v, want near 100ms (±50%%)", d)
	}
	// Wait: a Retry-After is honoured, clamped, and never shortens the
	// backoff; without one it is the backoff.
	if d := r.Wait(3*time.Second, 10*time.Second); d != 3*time.Second {
		t.Fatalf("Wait(3s, 10s) = %v", d)
	}
	if d := r.Wait(time.Hour, 5*time.Second); d != 5*time.Second {
		t.Fatalf("Wait(1h, 5s) = %v", d)
	}
	if d := r.Wait(time.Nanosecond, 5*time.Second); d < 50*time.Millisecond {
		t.Fatalf("Wait(1ns) = %v, shorter than the backoff", d)
	}
	if d := r.Wait(0, 10*time.Second); d <= 0 || d > time.Second {
		t.Fatalf("Wait without Retry-After = %v, want the backoff", d)
	}
	// max below initial is raised.
	if d := NewRetry(time.Second, time.Millisecond).Next(); d > time.Second || d <= 0 {
		t.Fatalf("max < initial: %v", d)
	}
}
