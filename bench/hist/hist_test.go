package hist

import "testing"

func TestQuantiles(t *testing.T) {
	tests := []struct {
		name   string
		values func(h *Hist)
		q      float64
		lo, hi uint64
	}{
		{"empty", func(h *Hist) {}, 0.5, 0, 0},
		{"small exact", func(h *Hist) {
			for v := uint64(0); v < 31; v++ {
				h.Record(v)
			}
		}, 0.5, 15, 15},
		{"uniform 1..100000 p50", func(h *Hist) {
			for v := uint64(1); v <= 100000; v++ {
				h.Record(v)
			}
		}, 0.5, 48500, 50000},
		{"uniform 1..100000 p99", func(h *Hist) {
			for v := uint64(1); v <= 100000; v++ {
				h.Record(v)
			}
		}, 0.99, 96000, 99000},
		{"outlier is max", func(h *Hist) {
			h.Record(1)
			h.Record(1_000_000_007)
		}, 1, 1_000_000_007, 1_000_000_007},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var h Hist
			tc.values(&h)
			if got := h.Quantile(tc.q); got < tc.lo || got > tc.hi {
				t.Fatalf("Quantile(%v) = %d, want %d..%d", tc.q, got, tc.lo, tc.hi)
			}
		})
	}
}

func TestIndexMonotonic(t *testing.T) {
	prev := -1
	for v := uint64(0); v < 1<<20; v += 7 {
		i := index(v)
		if i < prev {
			t.Fatalf("index(%d) = %d < %d", v, i, prev)
		}
		if l := lower(i); l > v {
			t.Fatalf("lower(index(%d)) = %d > v", v, l)
		}
		prev = i
	}
}

func TestMerge(t *testing.T) {
	var a, b Hist
	a.Record(10)
	b.Record(1000)
	a.Merge(&b)
	if a.Count() != 2 || a.Max() != 1000 || a.Quantile(1) != 1000 {
		t.Fatalf("merged: n=%d max=%d q1=%d", a.Count(), a.Max(), a.Quantile(1))
	}
}
