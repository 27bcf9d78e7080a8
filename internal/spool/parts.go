package spool

import (
	"context"
	"fmt"
	"time"

	"github.com/svcrelay/relay/internal/storage"
)

// Reading a chunk in parts.
//
// A chunk is one Append: one ingest request, up to 20 MB of events (43 KB
// gzipped on the wire). A reader that may hold less than that (the
// batcher's read-ahead budget) reads it with NextPart, in parts of at most
// maxBytes (at least one record): each part's records are copied into a
// buffer of the part's size, so that the reader never holds the whole
// chunk, whether it is in the WAL's memory or in bbolt. The chunk is
// acknowledged as a whole (Ack with its Seq) once every record of every
// part is done.

// NextPart is Next for a reader that is done with the chunks' Records
// slices (not with the bytes they alias, which stay valid as with Next)
// before it calls NextPart again, and that takes chunks in parts.
//
// The Records are carved from recs, grown when too small and dropped when
// the call waits long (see recIdleDrop), and NextPart returns it for the
// next call. The batcher's reader copies every record out at once; at
// 100-event requests a fresh slice per chunk was more than half of the
// bytes the relay allocated (72 per record). The returned []Chunk is reused
// the same way (valid until the next NextPart): at 1-event requests a
// fresh one per read was ~96 bytes per request.
//
// When the chunk at the read cursor is larger than maxBytes (> 0), it
// returns one Chunk holding the next records of it that fit in maxBytes (at
// least one): its First is the index of its first record in the chunk and
// its Total the chunk's record count; the cursor stays inside the chunk
// until its last part is returned. Otherwise it returns whole chunks (at
// least one, at most about maxBytes), as Next does.
func (l *Lane) NextPart(ctx context.Context, maxBytes int, recs []storage.Record) ([]storage.Chunk, []storage.Record, error) {
	slab := recSlab{buf: recs[:0]}
	chunks, err := l.nextChunks(ctx, maxBytes, &slab)
	for i := range chunks {
		if chunks[i].Total == 0 {
			chunks[i].Total = len(chunks[i].Records)
		}
	}
	return chunks, slab.buf, err
}

// partCursor is the reader's place inside a chunk it reads in parts.
type partCursor struct {
	seq uint64
	rec int // records returned so far; 0: no part read
}

// inParts reports whether a chunk of size bytes at the read cursor is read
// in parts: by NextPart (slab), when it is larger than maxBytes or its
// earlier parts were read.
func (l *Lane) inParts(size, maxBytes int, slab *recSlab) bool {
	return slab != nil && maxBytes > 0 && (size > maxBytes || l.part.rec != 0)
}

// cut returns the next part of chunk seq (encoded as v, n records) from the
// cursor: the records that fit in maxBytes (at least one), copied into a
// buffer of their size; it advances the cursor (past the chunk after its
// last part). The chunk's checksum is checked when its first part is cut:
// a chunk that fails it returns errPartDamaged, and is then read whole
// (from bbolt: moved to dead letters, reason damaged). The chunk is
// decoded whole at each part, so a part costs the decoding of the chunk;
// a chunk is cut in a few parts.
func (l *Lane) cut(seq uint64, acc int64, n int, v []byte, maxBytes int, slab *recSlab) (storage.Chunk, error) {
	if l.part.seq != seq || l.part.rec == 0 {
		if err := verifyChunk(v); err != nil {
			l.part = partCursor{}
			return storage.Chunk{}, errPartDamaged
		}
		l.part = partCursor{seq: seq}
	}
	var all storage.Chunk
	if err := decodeRecords(seq, v, &all, &recSlab{}); err != nil {
		return storage.Chunk{}, fmt.Errorf("lane %s chunk %d: %w", l.label, seq, err)
	}
	if len(all.Records) != n || l.part.rec >= n {
		return storage.Chunk{}, fmt.Errorf("lane %s chunk %d: %w", l.label, seq, errCorrupt)
	}
	rest := all.Records[l.part.rec:]
	end, k := 0, 0
	for k < len(rest) {
		r := &rest[k]
		m := len(r.OrderKey) + len(r.UserID) + len(r.Data)
		if k > 0 && end+m > maxBytes {
			break
		}
		end += m
		k++
	}
	cb := storage.GetBuf(end)
	ch := storage.Chunk{Seq: seq, Accepted: time.UnixMilli(acc), Size: end, Buffer: cb.Buffer(), First: l.part.rec, Total: n}
	ch.Records = slab.take(k)
	for i := range ch.Records {
		src, r := &rest[i], &ch.Records[i]
		r.OrderKey, cb.B = appendSub(cb.B, src.OrderKey)
		r.UserID, cb.B = appendSub(cb.B, src.UserID)
		r.Data, cb.B = appendSub(cb.B, src.Data)
	}
	l.part.rec += k
	if l.part.rec >= n {
		l.part = partCursor{}
		l.readSeq = seq + 1
	} else {
		l.readSeq = seq
	}
	return ch, nil
}

// errPartDamaged is returned by cut for a chunk that fails its checksum.
var errPartDamaged = fmt.Errorf("chunk read in parts: %w", errChecksum)

// appendSub appends p to b, which has room for it (no reallocation, so
// earlier sub-slices stay valid), and returns the appended sub-slice.
func appendSub(b, p []byte) (sub, out []byte) {
	at := len(b)
	b = append(b, p...)
	return b[at:len(b):len(b)], b
}

// Wait blocks until the lane may have records after its read cursor, so
// that a reader can take its memory budget before it reads (with a context
// that is already done, NextPart then returns what there is at once, or the
// context's error when every chunk there was acknowledged meanwhile). It
// returns ctx.Err() when ctx ends, ErrClosed when the spool closes and
// storage.ErrRetired once the lane is retired. onIdle, when not nil, is called each
// time the wait has lasted recIdleDrop more (the reader then drops what it
// keeps for reuse: an idle lane keeps nothing); when it returns true, Wait
// returns storage.ErrIdle (the reader may end: see whenWork). Reader goroutine only.
func (l *Lane) Wait(ctx context.Context, onIdle func() bool) error {
	var idle <-chan time.Time
	// One deferred call outside the loop: a defer in a loop is allocated
	// on the heap, once per Wait, which the 1-event requests' lanes call
	// for every chunk.
	armed := false
	defer func() {
		if armed {
			l.idle.Stop()
		}
	}()
	for {
		l.mu.Lock()
		has, ch := l.readSeq < l.next, l.notify
		if !has {
			l.watched = true // about to wait on ch
		}
		l.mu.Unlock()
		select {
		case <-l.s.closing:
			return ErrClosed
		case <-l.retiredC:
			// Empty for good (a lane retired before its reader first
			// read has its cursor before next, and no queue bucket).
			return storage.ErrRetired
		default:
		}
		if has {
			return nil
		}
		if idle == nil && onIdle != nil {
			if l.idle == nil {
				l.idle = time.NewTimer(recIdleDrop)
			} else {
				l.idle.Reset(recIdleDrop)
			}
			armed = true
			idle = l.idle.C
		}
		select {
		case <-ch:
		case <-idle:
			l.chunks = nil // dropped, not cleared: the caller may still read them
			idle = nil     // armed again above
			if onIdle() {
				l.idle = nil // an ended reader keeps no timer
				armed = false
				return storage.ErrIdle
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-l.s.closing:
			return ErrClosed
		case <-l.retiredC:
			return storage.ErrRetired
		}
	}
}

// whenWork calls f once, in a goroutine of its own, when the lane may have
// records after its read cursor or is retired: at once if it does or is
// already. A reader that ended on storage.ErrIdle so holds no goroutine while the
// lane is idle; the next reader goes on from the same cursor. A later
// whenWork replaces an f not called yet. f is not called after the spool
// closes.
func (l *Lane) whenWork(f func()) {
	l.mu.Lock()
	if l.readSeq < l.next || l.retired.Load() {
		l.mu.Unlock()
		go f()
		return
	}
	l.onWork = f
	l.mu.Unlock()
}

// missingQueue is the error of a read that found no queue bucket: the lane
// was retired under its reader (empty and idle, its bucket deleted since
// the reader looked), which is storage.ErrRetired and no damage; only a live
// lane's missing bucket is.
func (l *Lane) missingQueue() error {
	if l.retired.Load() {
		return fmt.Errorf("lane %s: %w", l.label, storage.ErrRetired)
	}
	return fmt.Errorf("lane %s: queue bucket missing: %w", l.label, errCorrupt)
}
