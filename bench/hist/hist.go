// Package hist is a small log-linear latency histogram for the benchmark
// tools (HdrHistogram-like: relative error under 1/32, fixed memory, no
// allocation per Record).
//
// Invariants: values are non-negative integers (the tools use microseconds);
// a value v lands in the bucket whose lower bound is the largest one <= v, so
// a quantile read back is at most ~3% below the true value. A Hist is not
// safe for concurrent use: give each goroutine its own and Merge them.
package hist

import "math/bits"

const (
	subBits = 5 // 32 sub-buckets per power of two
	sub     = 1 << subBits
	groups  = 64 - subBits + 1
)

// Hist counts values in log-linear buckets. The zero value is ready to use.
type Hist struct {
	counts [groups * sub]uint64
	n      uint64
	max    uint64
	sum    uint64
}

func index(v uint64) int {
	if v < sub {
		return int(v)
	}
	g := bits.Len64(v) - subBits // >= 1
	return g*sub + int((v>>uint(g-1))&(sub-1))
}

func lower(i int) uint64 {
	g, s := i/sub, uint64(i%sub)
	if g == 0 {
		return s
	}
	return (sub | s) << uint(g-1)
}

// Record adds one value.
func (h *Hist) Record(v uint64) {
	h.counts[index(v)]++
	h.n++
	h.sum += v
	if v > h.max {
		h.max = v
	}
}

// Merge adds o's counts into h.
func (h *Hist) Merge(o *Hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	if o.max > h.max {
		h.max = o.max
	}
}

// Count is the number of recorded values.
func (h *Hist) Count() uint64 { return h.n }

// Max is the largest recorded value (0 when empty).
func (h *Hist) Max() uint64 { return h.max }

// Mean is the arithmetic mean (0 when empty).
func (h *Hist) Mean() float64 {
	if h.n == 0 {
		return 0
	}
	return float64(h.sum) / float64(h.n)
}

// Quantile returns the lower bound of the bucket holding quantile q (0..1);
// 0 when empty.
func (h *Hist) Quantile(q float64) uint64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	if rank < 1 {
		rank = 1
	}
	if rank >= h.n {
		return h.max
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			if l := lower(i); l < h.max {
				return l
			}
			return h.max
		}
	}
	return h.max
}

// Reset forgets every value.
func (h *Hist) Reset() { *h = Hist{} }
