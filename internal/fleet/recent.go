package fleet

import (
	"encoding/binary"
	"sync"
)

// Recent publishes. The owner of a partition reads back, a moment later,
// the messages this relay published to it: the committer keeps the
// records' encoding it compressed into each such message (by message id,
// with the body's checksum, from before the publish: the consumer may
// deliver the message before the publish's answer arrives), and Next
// takes it instead of
// decompressing the body it was delivered, once that body's checksum is
// checked and found to be the same (decodeWith). Only what comes from
// decompressing is spared: the consumer delivers every body as before,
// and everything Next checks (delivery order, checksum) it still checks.
// A message published by another relay, or evicted, is decompressed.
type recent struct {
	mu    sync.Mutex
	m     map[string]recentBody
	order []string // put order, taken ones included
	bytes int
}

type recentBody struct {
	sum   uint32   // the body's checksum (its trailer)
	plain [][]byte // decodeWith's
	size  int
}

// Bounds of what recent holds: an owner reads what was published within
// milliseconds; what it has not read by then (a paused partition, a
// backlog) is decompressed when read.
const (
	recentMaxBytes = 16 << 20
	recentMaxMsgs  = 4096
)

// put keeps plain, compressed into body, the message published with id.
func (r *recent) put(id string, body []byte, plain [][]byte) {
	size := partsLen(plain)
	if len(body) < 4 || size > recentMaxBytes {
		return
	}
	k := id
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[string]recentBody)
	}
	if old, ok := r.m[k]; ok {
		r.bytes -= old.size
	}
	r.m[k] = recentBody{binary.BigEndian.Uint32(body[len(body)-4:]), plain, size}
	r.bytes += size
	r.order = append(r.order, k)
	for len(r.order) > 0 && (r.bytes > recentMaxBytes || len(r.order) > recentMaxMsgs) {
		old := r.order[0]
		r.order[0] = ""
		r.order = r.order[1:]
		if v, ok := r.m[old]; ok {
			r.bytes -= v.size
			delete(r.m, old)
		}
	}
}

// take returns and forgets the encoding kept for the message published
// with id, when body is the one it was compressed into; nil otherwise.
func (r *recent) take(id string, body []byte) [][]byte {
	if id == "" || len(body) < 4 {
		return nil
	}
	k := id
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.m[k]
	if !ok {
		return nil
	}
	delete(r.m, k)
	r.bytes -= v.size
	if v.sum != binary.BigEndian.Uint32(body[len(body)-4:]) {
		return nil
	}
	return v.plain
}

// drop forgets the encoding kept for id (its publish failed).
func (r *recent) drop(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if v, ok := r.m[id]; ok {
		r.bytes -= v.size
		delete(r.m, id)
	}
}

// reading tells whether this relay has partition s open.
func (f *Fleet) reading(s slot) bool {
	f.readersMu.Lock()
	defer f.readersMu.Unlock()
	return f.readers[s] > 0
}

// addReader counts a Partition of s opened (n 1) or closed (n -1).
func (f *Fleet) addReader(s slot, n int) {
	f.readersMu.Lock()
	defer f.readersMu.Unlock()
	if f.readers == nil {
		f.readers = make(map[slot]int)
	}
	f.readers[s] += n
	if f.readers[s] <= 0 {
		delete(f.readers, s)
	}
}
