package spool

import (
	"slices"
	"sort"

	"github.com/svcrelay/relay/internal/storage"
)

// hotChunk is a chunk in the WAL and in memory, not (yet) in bbolt.
type hotChunk struct {
	seq      uint64
	accepted int64 // unix ms
	records  int
	size     int
	pos      walPos       // its WAL record
	walAt    int64        // WAL bytes written (since Open) before its record
	cb       *storage.Buf // the spool's reference; nil once released
	acked    bool
	flushing bool // a checkpoint is copying it into bbolt
}

// hotList is a lane's hot chunks in seq (and WAL) order; acknowledged ones
// stay until they reach the head. Guarded by Lane.mu.
type hotList struct {
	cs   []*hotChunk // cs[head:] are live
	head int
	// The unacknowledged chunks' totals.
	chunks, records, bytes int64
}

func (h *hotList) len() int { return len(h.cs) - h.head }

func (h *hotList) push(c *hotChunk) {
	h.cs = append(h.cs, c)
	h.count(c, 1)
}

// count adds c to the unacknowledged totals (n 1) or takes it out (n -1).
func (h *hotList) count(c *hotChunk, n int64) {
	h.chunks += n
	h.records += n * int64(c.records)
	h.bytes += n * int64(c.size)
}

// firstSeq is the seq of the first chunk in the list, or def when empty.
func (h *hotList) firstSeq(def uint64) uint64 {
	if h.len() == 0 {
		return def
	}
	return h.cs[h.head].seq
}

// index is the position in cs of the first chunk with seq >= seq.
func (h *hotList) index(seq uint64) int {
	live := h.cs[h.head:]
	return h.head + sort.Search(len(live), func(i int) bool { return live[i].seq >= seq })
}

// find returns the chunk with seq, or nil.
func (h *hotList) find(seq uint64) *hotChunk {
	if i := h.index(seq); i < len(h.cs) && h.cs[i].seq == seq {
		return h.cs[i]
	}
	return nil
}

// ack marks c acknowledged and returns the spool's reference to release
// (nil while a checkpoint copies it: the checkpoint releases it).
func (h *hotList) ack(c *hotChunk) *storage.Buf {
	c.acked = true
	h.count(c, -1)
	var cb *storage.Buf
	if !c.flushing {
		cb, c.cb = c.cb, nil
	}
	h.popAcked()
	return cb
}

// popAcked drops acknowledged chunks from the head.
func (h *hotList) popAcked() {
	for h.head < len(h.cs) && h.cs[h.head].acked && !h.cs[h.head].flushing {
		h.cs[h.head] = nil
		h.head++
	}
	h.compact()
}

// popBefore drops the chunks before p, calling f for each.
func (h *hotList) popBefore(p walPos, f func(*hotChunk)) {
	for h.head < len(h.cs) && h.cs[h.head].pos.less(p) {
		c := h.cs[h.head]
		if !c.acked {
			h.count(c, -1)
		}
		f(c)
		h.cs[h.head] = nil
		h.head++
	}
	h.compact()
}

// compact moves the live chunks to the front once most are dropped.
func (h *hotList) compact() {
	if h.head == len(h.cs) {
		h.cs, h.head = h.cs[:0], 0
		return
	}
	if h.head >= 64 && h.head*2 >= len(h.cs) {
		h.cs, h.head = slices.Delete(h.cs, 0, h.head), 0
	}
}

// oldestUnacked is the first unacknowledged chunk's acceptance, 0 if none.
func (h *hotList) oldestUnacked() int64 {
	for _, c := range h.cs[h.head:] {
		if !c.acked {
			return c.accepted
		}
	}
	return 0
}
