package spool

import (
	"math/bits"
	"sync"
)

// Chunk buffers are recycled by size class (powers of two from 512 bytes to
// 16 MiB): Lane.Next copies every chunk it reads out of the mapping, and a
// fresh buffer per chunk (allocated, zeroed, collected) was ~3% of the
// relay's CPU at 100-event load plus most of its allocation volume. A caller
// that knows when a chunk is no longer read gives its Buffer back; one that
// does not simply drops it.
const (
	minBufShift = 9
	maxBufShift = 24
)

var bufPools [maxBufShift - minBufShift + 1]sync.Pool // of *[]byte

// bufClass is the smallest class holding n bytes, -1 above the largest.
func bufClass(n int) int {
	if n <= 1<<minBufShift {
		return 0
	}
	c := bits.Len(uint(n-1)) - minBufShift
	if c > maxBufShift-minBufShift {
		return -1
	}
	return c
}

// getBuf returns a buffer of n bytes (contents undefined) and its box for
// Release; the box is nil for sizes beyond the classes.
func getBuf(n int) ([]byte, *[]byte) {
	c := bufClass(n)
	if c < 0 {
		return make([]byte, n), nil
	}
	if p, _ := bufPools[c].Get().(*[]byte); p != nil {
		return (*p)[:n], p
	}
	b := make([]byte, 1<<(c+minBufShift))
	return b[:n], &b
}

// Buffer is the memory a Chunk's records alias.
type Buffer struct{ p *[]byte }

// Cap is the memory the buffer holds (a chunk rounded up to its class), 0
// for the zero Buffer.
func (b Buffer) Cap() int {
	if b.p == nil {
		return 0
	}
	return cap(*b.p)
}

// Release gives the buffer back for later reads. Call it once, and only
// when nothing reads the chunk's records (or slices of them) any more:
// their bytes are overwritten by a later chunk. The zero Buffer does
// nothing.
func (b Buffer) Release() {
	if b.p == nil {
		return
	}
	if c := bufClass(cap(*b.p)); c >= 0 && cap(*b.p) == 1<<(c+minBufShift) {
		bufPools[c].Put(b.p)
	}
}
