package spool

import (
	"encoding/binary"
	"math/bits"
	"sync"
	"sync/atomic"
)

// Chunk memory is recycled by size class: 512 bytes, then four classes per
// power of two (2^k times 1¼, 1½, 1¾ and 2) up to 16 MiB, so that a buffer
// wastes at most a fifth of itself (a 1000-event request's chunk of ~513
// KB in a 640 KiB buffer, not a 1 MiB one). A chunk's buffer is shared: an
// Append hands its Batch's buffer to the spool, which keeps it while the
// chunk is only in the write-ahead log (see hot.go) and lends it to the
// lane's reader; a chunk read from bbolt is copied into a buffer of its
// own. Each holder has one reference, and the last Release gives the buffer
// back to its class's pool. A holder that cannot tell when it stops reading
// simply drops its Buffer: the memory is then collected, never reused under
// it.
const (
	minBufShift = 9
	maxBufShift = 24
	numClasses  = 1 + 4*(maxBufShift-minBufShift)
)

var bufPools [numClasses]sync.Pool // of *chunkBuf

// bufClass is the smallest class holding n bytes, -1 above the largest.
func bufClass(n int) int {
	if n <= 1<<minBufShift {
		return 0
	}
	k := bits.Len(uint(n-1)) - 1 // 2^k < n <= 2^(k+1)
	if k >= maxBufShift {
		return -1
	}
	step := 1 << (k - 2)
	sub := (n - 1<<k + step - 1) / step // 1..4
	return 1 + 4*(k-minBufShift) + sub - 1
}

// classSize is the capacity of class c's buffers.
func classSize(c int) int {
	if c == 0 {
		return 1 << minBufShift
	}
	k := (c-1)/4 + minBufShift
	return 1<<k + ((c-1)%4+1)<<(k-2)
}

// chunkBuf is a buffer of a class's capacity (or, beyond the classes, of
// exactly what was asked) with a count of its holders.
type chunkBuf struct {
	b []byte
	// idx, when a Batch built b, holds each record's offset and length in b
	// (OrderKey, UserID, Data: six per record), so that a hot chunk's reader
	// gets its records without decoding (and without touching) b.
	idx  []uint32
	refs atomic.Int32
}

// getBuf returns a buffer with room for n bytes, b of length 0, one
// reference held by the caller. Its contents are undefined.
func getBuf(n int) *chunkBuf {
	c := bufClass(n)
	if c < 0 {
		cb := &chunkBuf{b: make([]byte, 0, n)}
		cb.refs.Store(1)
		return cb
	}
	cb, _ := bufPools[c].Get().(*chunkBuf)
	if cb == nil {
		cb = &chunkBuf{b: make([]byte, 0, classSize(c))}
	}
	cb.b, cb.idx = cb.b[:0], cb.idx[:0]
	cb.refs.Store(1)
	return cb
}

// ref adds a holder.
func (cb *chunkBuf) ref() { cb.refs.Add(1) }

// release drops a holder; the last one gives the buffer back to its pool.
func (cb *chunkBuf) release() {
	if n := cb.refs.Add(-1); n > 0 {
		return
	} else if n < 0 {
		panic("spool: chunk buffer released more often than referenced")
	}
	if c := bufClass(cap(cb.b)); c >= 0 && cap(cb.b) == classSize(c) {
		bufPools[c].Put(cb)
	}
}

// Buffer is the memory a Chunk's records alias.
type Buffer struct {
	p *chunkBuf
	// Cap is the memory the buffer holds (a chunk rounded up to its class)
	// when the chunk was read, 0 for the zero Buffer.
	Cap int
}

// bufferOf is the Buffer of cb.
func bufferOf(cb *chunkBuf) Buffer { return Buffer{p: cb, Cap: cap(cb.b)} }

// Release says the caller no longer reads the chunk's records (or slices of
// them): once every holder released it, the memory is reused for other
// chunks. Call it at most once per Chunk returned by Next. The zero Buffer
// does nothing.
func (b Buffer) Release() {
	if b.p != nil {
		b.p.release()
	}
}

// Batch is a reusable builder of the records of one Append. Its buffer is
// the chunk's encoding (see encode.go); an Append that succeeds takes the
// buffer over (no copy) and leaves the Batch empty, and the next Add starts a
// fresh buffer from the pool. The zero value is an empty batch.
type Batch struct {
	cb *chunkBuf // nil until the first Add after an Append
	n  int
}

// Reset empties b, keeping its memory.
func (b *Batch) Reset() {
	if b.cb != nil {
		b.cb.b, b.cb.idx = b.cb.b[:0], b.cb.idx[:0]
	}
	b.n = 0
}

// Reserve makes room for about n more bytes of records (their data plus
// a few bytes each), so that a caller that knows the size of what it will
// add gets a buffer of the right class at once instead of growing into one.
func (b *Batch) Reserve(n int) {
	if b.cb == nil {
		b.grow(chunkHeaderLen + n)
		return
	}
	if cap(b.cb.b)-max(len(b.cb.b), chunkHeaderLen) < n {
		b.grow(max(len(b.cb.b), chunkHeaderLen) + n)
	}
}

// Add appends a record; the slices are copied.
func (b *Batch) Add(r Record) {
	need := 3*binary.MaxVarintLen64 + len(r.OrderKey) + len(r.UserID) + len(r.Data)
	if b.cb == nil || len(b.cb.b) == 0 {
		if b.cb == nil || cap(b.cb.b) < chunkHeaderLen+need {
			b.grow(chunkHeaderLen + need)
		}
		b.cb.b = b.cb.b[:chunkHeaderLen] // the header is written by Append
	} else if cap(b.cb.b)-len(b.cb.b) < need {
		b.grow(2 * (len(b.cb.b) + need)) // amortised; Append trims the excess
	}
	buf, idx := b.cb.b, b.cb.idx
	for _, f := range [3][]byte{r.OrderKey, r.UserID, r.Data} {
		buf = binary.AppendUvarint(buf, uint64(len(f)))
		idx = append(idx, uint32(len(buf)), uint32(len(f)))
		buf = append(buf, f...)
	}
	b.cb.b, b.cb.idx = buf, idx
	b.n++
}

// AddFunc appends a record whose data data appends to dst, the batch's own
// buffer: no copy of it is made. maxData bounds the data's length (it sizes
// the length prefix; a longer record is still right, at the cost of a copy).
// The order key and user id are copied; data must not keep dst.
func (b *Batch) AddFunc(orderKey, userID []byte, maxData int, data func(dst []byte) []byte) {
	width := uvarintLen(uint64(maxData))
	b.Reserve(len(orderKey) + len(userID) + 2*binary.MaxVarintLen64 + width + maxData)
	if len(b.cb.b) == 0 {
		b.cb.b = b.cb.b[:chunkHeaderLen] // the header is written by Append
	}
	buf, idx := b.cb.b, b.cb.idx
	for _, f := range [2][]byte{orderKey, userID} {
		buf = binary.AppendUvarint(buf, uint64(len(f)))
		idx = append(idx, uint32(len(buf)), uint32(len(f)))
		buf = append(buf, f...)
	}
	at := len(buf)
	buf = data(append(buf, make([]byte, width)...))
	n := len(buf) - at - width
	if need := uvarintLen(uint64(n)); need > width {
		// Longer than promised: make room for the longer prefix.
		buf = append(buf, make([]byte, need-width)...)
		copy(buf[at+need:], buf[at+width:len(buf)-(need-width)])
		width = need
	}
	putUvarintWidth(buf[at:at+width], uint64(n))
	idx = append(idx, uint32(at+width), uint32(n))
	b.cb.b, b.cb.idx = buf, idx
	b.n++
}

// uvarintLen is the length of x's shortest uvarint.
func uvarintLen(x uint64) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}

// putUvarintWidth writes x as a uvarint of exactly len(p) bytes (padded
// with continuation bytes, which binary.Uvarint decodes as the same value);
// len(p) must be at least uvarintLen(x).
func putUvarintWidth(p []byte, x uint64) {
	for i := range p[:len(p)-1] {
		p[i] = byte(x) | 0x80
		x >>= 7
	}
	p[len(p)-1] = byte(x)
}

// grow moves b's contents into a pooled buffer of at least n bytes.
func (b *Batch) grow(n int) {
	cb := getBuf(n)
	if b.cb != nil {
		cb.b = append(cb.b, b.cb.b...)
		cb.idx = append(cb.idx, b.cb.idx...)
		b.cb.release()
	}
	b.cb = cb
}

// fit copies the contents of a buffer more than half empty (it grew, or
// was reserved, well past them) into one of the right class: the spool
// holds a chunk's buffer until the chunk is delivered, and that memory is
// what the spool's bounds count. Append calls it in its caller's goroutine,
// where the chunk is in the cache.
func (b *Batch) fit() {
	cb := b.cb
	if cap(cb.b) > len(cb.b)+len(cb.b)/2 && bufClass(len(cb.b)) >= 0 {
		f := getBuf(len(cb.b))
		f.b = append(f.b, cb.b...)
		f.idx = append(f.idx, cb.idx...)
		cb.release()
		b.cb = f
	}
}

// take hands b's buffer over to the caller (Append) and empties b.
func (b *Batch) take() *chunkBuf {
	cb := b.cb
	b.cb, b.n = nil, 0
	return cb
}

// Records returns b's records, aliasing its buffer (valid until b is
// reset or appended): for a store that copies them (fleet mode's Append).
func (b *Batch) Records() []Record {
	if b.n == 0 {
		return nil
	}
	return b.cb.records(b.n, nil)
}

// Bytes is the encoded size of b (0 when empty): what Append counts against
// the quota and what Chunk.Size reports.
func (b *Batch) Bytes() int {
	if b.n == 0 {
		return 0
	}
	return len(b.cb.b)
}

// records returns the records of a chunk built by a Batch from its index
// (nil when cb has none), aliasing cb.b, in a slice taken from slab (nil: a
// fresh one).
func (cb *chunkBuf) records(n int, slab *recSlab) []Record {
	if len(cb.idx) != 6*n {
		return nil
	}
	rs := slab.take(n)
	field := func(i int) []byte {
		off, l := cb.idx[i], cb.idx[i+1]
		if l == 0 {
			return nil // as decodeChunk
		}
		return cb.b[off : off+l : off+l]
	}
	for i := range rs {
		rs[i] = Record{OrderKey: field(6 * i), UserID: field(6*i + 2), Data: field(6*i + 4)}
	}
	return rs
}
