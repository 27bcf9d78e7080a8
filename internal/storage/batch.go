package storage

import (
	"encoding/binary"
	"math/bits"
	"sync"
	"sync/atomic"
)

// BatchHeaderLen is the room a Batch leaves at the start of its buffer for
// the header the local spool writes there on Append: its buffer is then the
// chunk's encoding, written to the WAL without a copy.
const BatchHeaderLen = 18

// A Batch given a verdict (Vet) writes it after the header, and one mark
// byte after each record's data: 1 when the record is clean against it
// (MarkClean), else 0 (see spool/encode.go).
const (
	verdictLen = 8
	markLen    = 1
)

// Chunk memory is recycled by size class: 512 bytes, then four classes per
// power of two (2^k times 1¼, 1½, 1¾ and 2) up to 16 MiB, so that a buffer
// wastes at most a fifth of itself (a 1000-event request's chunk of ~513
// KB in a 640 KiB buffer, not a 1 MiB one). A chunk's buffer is shared: an
// Append hands its Batch's buffer to the spool, which keeps it while the
// chunk is only in the write-ahead log (spool/hot.go) and lends it to the
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

var bufPools [numClasses]sync.Pool // of *Buf

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

// Buf is a buffer of a class's capacity (or, beyond the classes, of
// exactly what was asked) with a count of its holders. Its API is for the
// store that keeps a Batch's memory (the local spool).
type Buf struct {
	B []byte
	// Idx, when a Batch built B, holds each record's offset and length in B
	// (OrderKey, UserID, Data: six per record), so that a hot chunk's reader
	// gets its records without decoding (and without touching) B.
	Idx []uint32
	// Verdict, when a Batch built B with a verdict (Batch.Vet), is it: each
	// record's data is then followed by its mark byte.
	Verdict uint64
	refs    atomic.Int32
}

// GetBuf returns a buffer with room for n bytes, b of length 0, one
// reference held by the caller. Its contents are undefined.
func GetBuf(n int) *Buf {
	c := bufClass(n)
	if c < 0 {
		cb := &Buf{B: make([]byte, 0, n)}
		cb.refs.Store(1)
		return cb
	}
	cb, _ := bufPools[c].Get().(*Buf)
	if cb == nil {
		cb = &Buf{B: make([]byte, 0, classSize(c))}
	}
	cb.B, cb.Idx, cb.Verdict = cb.B[:0], cb.Idx[:0], 0
	cb.refs.Store(1)
	return cb
}

// Ref adds a holder.
func (cb *Buf) Ref() { cb.refs.Add(1) }

// Release drops a holder; the last one gives the buffer back to its pool.
func (cb *Buf) Release() {
	if n := cb.refs.Add(-1); n > 0 {
		return
	} else if n < 0 {
		panic("spool: chunk buffer released more often than referenced")
	}
	if c := bufClass(cap(cb.B)); c >= 0 && cap(cb.B) == classSize(c) {
		bufPools[c].Put(cb)
	}
}

// Buffer is the memory a Chunk's records alias.
type Buffer struct {
	p *Buf
	// Cap is the memory the buffer holds (a chunk rounded up to its class)
	// when the chunk was read, 0 for the zero Buffer.
	Cap int
}

// Buffer is the Buffer of cb, taking over the caller's reference.
func (cb *Buf) Buffer() Buffer { return Buffer{p: cb, Cap: cap(cb.B)} }

// Release says the caller no longer reads the chunk's records (or slices of
// them): once every holder released it, the memory is reused for other
// chunks. Call it at most once per Chunk returned by Next. The zero Buffer
// does nothing.
func (b Buffer) Release() {
	if b.p != nil {
		b.p.Release()
	}
}

// Batch is a reusable builder of the records of one Append. Its buffer is
// the chunk's encoding (see spool/encode.go); an Append that succeeds takes the
// buffer over (no copy) and leaves the Batch empty, and the next Add starts a
// fresh buffer from the pool. The zero value is an empty batch.
type Batch struct {
	cb      *Buf // nil until the first Add after an Append
	n       int
	verdict uint64 // Vet's
}

// Reset empties b, keeping its memory, and forgets its verdict.
func (b *Batch) Reset() {
	if b.cb != nil {
		b.cb.B, b.cb.Idx, b.cb.Verdict = b.cb.B[:0], b.cb.Idx[:0], 0
	}
	b.n, b.verdict = 0, 0
}

// Vet gives the records added next a tracking plan's verdict v (not zero):
// each record then carries a mark, set by MarkClean, that says whether it
// is clean against v (Record.Verdict is v or 0). Call it on an empty
// batch; it does nothing on one that holds records.
func (b *Batch) Vet(v uint64) {
	if b.n == 0 {
		b.verdict = v
	}
}

// MarkClean marks the last record added as clean against the batch's
// verdict (Vet); without one, or with no record, it does nothing.
func (b *Batch) MarkClean() {
	if b.n > 0 && b.cb.Verdict != 0 {
		b.cb.B[len(b.cb.B)-1] = 1
	}
}

// Verdict is the batch's verdict (Vet), 0 when it has none or no record:
// the local spool's chunk header says whether one follows it.
func (b *Batch) Verdict() uint64 {
	if b.n == 0 {
		return 0
	}
	return b.cb.Verdict
}

// Reserve makes room for about n more bytes of records (their data plus
// a few bytes each), so that a caller that knows the size of what it will
// add gets a buffer of the right class at once instead of growing into one.
func (b *Batch) Reserve(n int) {
	if b.cb == nil {
		b.grow(BatchHeaderLen + n)
		return
	}
	if cap(b.cb.B)-max(len(b.cb.B), BatchHeaderLen) < n {
		b.grow(max(len(b.cb.B), BatchHeaderLen) + n)
	}
}

// Add appends a record; the slices are copied.
func (b *Batch) Add(r Record) {
	if need := 3*binary.MaxVarintLen64 + len(r.OrderKey) + len(r.UserID) + len(r.Data); b.n > 0 && cap(b.cb.B)-len(b.cb.B) < need {
		b.grow(2 * (len(b.cb.B) + need)) // amortised; Append trims the excess
	}
	b.AddFunc(r.OrderKey, r.UserID, len(r.Data), func(dst []byte) []byte { return append(dst, r.Data...) })
}

// AddFunc appends a record whose data data appends to dst, the batch's own
// buffer: no copy of it is made. maxData bounds the data's length (it sizes
// the length prefix; a longer record is still right, at the cost of a copy).
// The order key and user id are copied; data must not keep dst.
func (b *Batch) AddFunc(orderKey, userID []byte, maxData int, data func(dst []byte) []byte) {
	width := uvarintLen(uint64(maxData))
	extra := 0 // the verdict and the mark, when there are
	if b.verdict != 0 {
		extra = verdictLen + markLen
	}
	b.Reserve(len(orderKey) + len(userID) + 2*binary.MaxVarintLen64 + width + maxData + extra)
	if len(b.cb.B) == 0 { // the first record: room for the header (Append writes it), then the verdict
		b.cb.B = b.cb.B[:BatchHeaderLen]
		if b.cb.Verdict = b.verdict; b.verdict != 0 {
			b.cb.B = binary.BigEndian.AppendUint64(b.cb.B, b.verdict)
		}
	}
	buf, idx := b.cb.B, b.cb.Idx
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
	if b.cb.Verdict != 0 {
		buf = append(buf, 0) // the mark: not clean until MarkClean
	}
	b.cb.B, b.cb.Idx = buf, idx
	b.n++
}

// uvarintLen is the length of x's shortest uvarint.
func uvarintLen(x uint64) int { return (bits.Len64(x|1) + 6) / 7 }

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
	cb := GetBuf(n)
	if b.cb != nil {
		cb.B = append(cb.B, b.cb.B...)
		cb.Idx = append(cb.Idx, b.cb.Idx...)
		cb.Verdict = b.cb.Verdict
		b.cb.Release()
	}
	b.cb = cb
}

// Fit copies the contents of a buffer more than half empty (it grew, or
// was reserved, well past them) into one of the right class: the spool
// holds a chunk's buffer until the chunk is delivered, and that memory is
// what the spool's bounds count. Append calls it in its caller's goroutine,
// where the chunk is in the cache.
func (b *Batch) Fit() {
	if n := len(b.cb.B); cap(b.cb.B) > n+n/2 && bufClass(n) >= 0 {
		b.grow(n)
	}
}

// Take hands b's buffer over to the caller (Append) and empties b.
func (b *Batch) Take() *Buf {
	cb := b.cb
	b.cb, b.n, b.verdict = nil, 0, 0
	return cb
}

// Records returns b's records, aliasing its buffer (valid until b is
// reset or appended): for a store that copies them (fleet mode's Append).
func (b *Batch) Records() []Record {
	if b.n == 0 {
		return nil
	}
	rs := make([]Record, b.n)
	b.cb.Records(rs)
	return rs
}

// Len is the number of records in b.
func (b *Batch) Len() int { return b.n }

// Encoded is b's buffer, the chunk's encoding with room for its header
// (nil when empty): valid until b is reset or appended.
func (b *Batch) Encoded() []byte {
	if b.n == 0 {
		return nil
	}
	return b.cb.B
}

// Bytes is the encoded size of b (0 when empty): what Append counts against
// the quota and what Chunk.Size reports.
func (b *Batch) Bytes() int { return len(b.Encoded()) }

// Records sets rs to the records of a chunk a Batch built, from its index,
// aliasing cb.B; rs has the chunk's length.
func (cb *Buf) Records(rs []Record) {
	field := func(i int) []byte {
		off, l := cb.Idx[i], cb.Idx[i+1]
		if l == 0 {
			return nil // as the spool's decoder
		}
		return cb.B[off : off+l : off+l]
	}
	for i := range rs {
		rs[i] = Record{OrderKey: field(6 * i), UserID: field(6*i + 2), Data: field(6*i + 4)}
		if cb.Verdict != 0 && cb.B[cb.Idx[6*i+4]+cb.Idx[6*i+5]] == 1 { // the mark after the data
			rs[i].Verdict = cb.Verdict
		}
	}
}
