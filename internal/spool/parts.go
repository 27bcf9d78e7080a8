package spool

import (
	"context"
	"fmt"
	"time"

	"github.com/svcrelay/relay/internal/storage"
)

// partCursor is the reader's place inside a chunk it reads in parts.
type partCursor struct {
	seq uint64
	rec int // records returned so far; 0: no part read
}

// inParts reports whether NextPart reads the chunk of size bytes at the
// cursor in parts.
func (l *Lane) inParts(size, maxBytes int) bool {
	return maxBytes > 0 && (size > maxBytes || l.part.rec != 0)
}

// cut returns the next part of chunk seq (encoded as v, n records) and
// advances the cursor. The checksum is checked at the first part: a chunk
// that fails it returns errPartDamaged, to be read whole (from bbolt:
// dead-lettered). Each part decodes the whole chunk (cut in a few parts).
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
		r.Verdict = src.Verdict
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

var errPartDamaged = fmt.Errorf("chunk read in parts: %w", errChecksum)

// appendSub appends p to b, which has room for it, and returns the
// appended sub-slice.
func appendSub(b, p []byte) (sub, out []byte) {
	at := len(b)
	b = append(b, p...)
	return b[at:len(b):len(b)], b
}

// Wait blocks until the lane may have records after its read cursor, so
// that a reader can take its memory budget before it reads (NextPart with
// a done context). It returns ctx.Err() when ctx ends, ErrClosed when the
// spool closes and storage.ErrRetired once the lane is retired. onIdle,
// when not nil, is called each recIdleDrop of waiting (the reader drops
// what it keeps); when it returns true, Wait returns storage.ErrIdle.
func (l *Lane) Wait(ctx context.Context, onIdle func() bool) error {
	var idle <-chan time.Time // l.idle's, while armed
	// One defer outside the loop: in a loop it is heap-allocated.
	defer func() {
		if idle != nil {
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
			// Empty for good (the cursor of a lane retired before its
			// first read is before next).
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
			idle = l.idle.C
		}
		select {
		case <-ch:
		case <-idle:
			l.chunks = nil // dropped, not cleared: the caller may still read them
			idle = nil     // armed again above
			if onIdle() {
				l.idle = nil // an ended reader keeps no timer
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
// records after its read cursor or is retired (at once if so already). A
// later whenWork replaces an f not called yet.
func (l *Lane) whenWork(f func()) {
	l.mu.Lock()
	l.onWork = f
	if l.readSeq < l.next || l.retired.Load() {
		l.wakeLocked()
	}
	l.mu.Unlock()
}

// missingQueue is the error of a read that found no queue bucket: no
// damage when the lane was retired under its reader.
func (l *Lane) missingQueue() error {
	if l.retired.Load() {
		return fmt.Errorf("lane %s: %w", l.label, storage.ErrRetired)
	}
	return fmt.Errorf("lane %s: queue bucket missing: %w", l.label, errCorrupt)
}
