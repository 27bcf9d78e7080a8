package spool

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"
)

type opKind uint8

const (
	opAppend opKind = iota
	opLane
	opPutDead
	opDelDead
)

// op is one operation queued for the writer; its caller waits on done.
type op struct {
	kind     opKind
	lane     *Lane // opAppend: target; opLane: result
	batch    *Batch
	accepted int64 // unix ms
	key      LaneKey
	dls      []DeadLetter
	ids      []uint64
	err      error
	done     chan struct{} // capacity 1
}

func (o *op) size() int {
	if o.kind == opAppend {
		return len(o.batch.buf)
	}
	return 0
}

type ackOp struct {
	lane *Lane
	seq  uint64
}

// writerState belongs to the writer goroutine (and to Open before it starts).
type writerState struct {
	ops     []*op
	acks    []ackOp
	retry   []ackOp // acks of a failed commit, retried with the next one
	touched []*Lane
	created []*Lane

	live             int64 // committed live bytes
	deadN, deadBytes int64 // committed dead letters

	diskFree    int64 // free bytes at diskChecked
	diskChecked time.Time
	diskWritten int64 // bytes appended since diskChecked

	compactFailed time.Time
	trimmed       time.Time // last trimMapping
	trimDue       bool      // a commit since trimmed: trim when idle
	freelistStale bool      // the last commit did not write the freelist
}

// diskCheckEvery is how long a statfs result is trusted (bytes appended
// since are subtracted from it).
const diskCheckEvery = 500 * time.Millisecond

func (s *Spool) getOp(k opKind) *op {
	o := s.opPool.Get().(*op)
	o.kind = k
	return o
}

func (s *Spool) putOp(o *op) {
	done := o.done
	*o = op{done: done}
	s.opPool.Put(o)
}

func (s *Spool) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// do queues o for the writer and waits for its result.
func (s *Spool) do(ctx context.Context, o *op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.pending = append(s.pending, o)
	s.mu.Unlock()
	s.signal()
	<-o.done
	return o.err
}

// run is the writer goroutine: it commits everything queued, as soon as the
// previous commit returned, until Close.
func (s *Spool) run() {
	defer close(s.writerDone)
	for {
		ops, acks, closed := s.take()
		if len(ops) > 0 || len(acks) > 0 {
			acks = append(acks, s.w.retry...)
			s.w.retry = s.w.retry[:0]
			s.commit(ops, acks)
			s.maybeCompact()
			if now := time.Now(); now.Sub(s.w.trimmed) >= trimInterval && s.db != nil {
				trimMapping(s.db)
				s.w.trimmed = now
				s.w.trimDue = false
			} else {
				s.w.trimDue = true
			}
		} else if closed {
			s.persistFreelist()
			return
		}
	}
}

// trimInterval is how often the writer drops the mapping's pages from the
// RSS (see advise.go): the pages its own commits read (tails, branch pages,
// acked chunks' headers) and those delivery copied chunks from would
// otherwise stay resident. The kernel maps a file's page cache in large
// folios, so touching a leaf's header maps up to a megabyte around it.
// Relay --sync always under 1000-event load (~650k events/s): peak RSS
// (VmHWM) 609 MiB with a 1 s interval, 207–214 with 100 ms, 183–203 with
// 50 ms (RssFile 59–63 MiB); a trim takes ~120 µs.
const trimInterval = 50 * time.Millisecond

// A commit writes the freelist when its page ids (8 bytes each) take at most
// freelistMinBytes or 1/freelistShare of the chunk bytes the commit writes,
// so that Open — after a crash too — reads it instead of rebuilding it by
// checking every page of the file (about 1 s per 5 GB here). Appending big
// chunks leaves a fragmented freelist (bbolt rewrites the tail leaf, with
// up to three earlier chunks, on every append: ~4,400 free pages after a
// 1M-event build of 1000-event chunks), which the share keeps writing at a
// few percent of the commit; a drain (acks, no appends) frees far more, and
// then commits skip the freelist and a crash costs the scan. The clean
// Close writes it anyway.
const (
	freelistMinBytes = 16 << 10
	freelistShare    = 8
)

// keepFreelist reports whether a commit writing written chunk bytes should
// write the freelist.
func (s *Spool) keepFreelist(written int) bool {
	st := s.db.Stats()
	return (st.FreePageN+st.PendingPageN)*8 <= max(freelistMinBytes, written/freelistShare)
}

// When the last commit skipped the freelist and no other follows within
// idleFreelistDelay, the writer commits it alone (idleFreelist), if its ids
// take at most idleFreelistMaxBytes: a relay that goes quiet — a backlog
// built while the upstream is down, the end of a burst — has it on disk
// for the next Open even after a crash, at the cost of one small commit.
const (
	idleFreelistDelay    = 50 * time.Millisecond
	idleFreelistMaxBytes = 1 << 20
)

func (s *Spool) idleFreelist() {
	s.w.freelistStale = false
	if s.db == nil {
		return
	}
	if st := s.db.Stats(); (st.FreePageN+st.PendingPageN)*8 > idleFreelistMaxBytes {
		return
	}
	s.persistFreelist()
}

// persistFreelist commits the freelist once more, whatever its size, so that
// the next Open does not rebuild it (Close; idleFreelist). Best effort: a
// failure only makes that Open slower.
func (s *Spool) persistFreelist() {
	if s.db == nil {
		return
	}
	s.db.NoFreelistSync = false
	if err := s.db.Update(func(*bolt.Tx) error { return nil }); err != nil {
		s.log.Warn("spool: write the freelist", zap.Error(err))
		return
	}
	s.w.freelistStale = false
}

// take waits for queued operations and takes them: every ack, and the
// operations that fit in MaxCommitBytes (at least one).
func (s *Spool) take() (ops []*op, acks []ackOp, closed bool) {
	for {
		s.mu.Lock()
		if len(s.pending) > 0 || len(s.acks) > 0 || s.closed {
			n, size, max := 0, 0, s.cfg.maxCommit()
			for n < len(s.pending) {
				sz := s.pending[n].size()
				if n > 0 && size+sz > max {
					break
				}
				size += sz
				n++
			}
			ops = append(s.w.ops[:0], s.pending[:n]...)
			rest := copy(s.pending, s.pending[n:])
			clear(s.pending[rest:])
			s.pending = s.pending[:rest]
			// Swap the ack slices: the writer's spare becomes the queue.
			acks, s.acks = s.acks, s.w.acks[:0]
			closed = s.closed
			s.mu.Unlock()
			s.w.ops = ops
			return ops, acks, closed
		}
		s.mu.Unlock()
		if !s.w.freelistStale && !s.w.trimDue {
			<-s.wake
			continue
		}
		t := time.NewTimer(idleFreelistDelay)
		select {
		case <-s.wake:
		case <-t.C:
			if s.w.freelistStale {
				s.idleFreelist()
			}
			if s.w.trimDue && s.db != nil {
				// The commits since the last trim touched pages: a
				// relay that went quiet gives them back now.
				trimMapping(s.db)
				s.w.trimmed = time.Now()
			}
			s.w.trimDue = false
		}
		t.Stop()
	}
}

func (s *Spool) touch(l *Lane) {
	if !l.wTouched {
		l.wTouched = true
		s.w.touched = append(s.w.touched, l)
	}
}

// commit applies ops and acks in one transaction and answers every waiter.
func (s *Spool) commit(ops []*op, acks []ackOp) {
	start := time.Now()
	records, err := s.apply(ops, acks)
	if err == nil {
		s.publish()
		if records > 0 {
			s.m.commitSeconds.Observe(time.Since(start).Seconds())
			s.m.commitRecords.Observe(float64(records))
		}
		s.m.commits.Inc()
	} else {
		err = fmt.Errorf("spool commit: %w", err)
		s.log.Error("spool commit failed", zap.Error(err))
		s.rollback(acks)
	}
	for _, o := range ops {
		if o.err == nil {
			o.err = err
		}
		o.done <- struct{}{}
	}
	s.w.acks = acks[:0]
	clear(s.w.ops)
	s.w.ops = s.w.ops[:0]
	s.updateFileBytes()
}

func (s *Spool) apply(ops []*op, acks []ackOp) (records int, err error) {
	if s.db == nil {
		return 0, errors.New("spool file is not open after a failed compaction")
	}
	tx, err := s.db.Begin(true)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	live := s.w.live
	deadN, deadBytes := s.w.deadN, s.w.deadBytes

	// Deletions first, so that the space they free serves this commit's appends.
	for _, a := range acks {
		l := a.lane
		q := tx.Bucket(l.qname)
		if q == nil {
			continue // a lane created by a commit that failed
		}
		k := seqKey(a.seq)
		v := q.Get(k)
		if v == nil {
			continue // acknowledged twice, or never written
		}
		_, n, herr := chunkHeader(v)
		if herr != nil {
			n = 0
		}
		sz := len(v)
		if err = q.Delete(k); err != nil {
			return 0, err
		}
		s.touch(l)
		l.wDeleted = true
		l.w.chunks--
		l.w.records -= uint64(n)
		l.w.bytes -= uint64(sz)
		live -= int64(sz)
	}

	lanes := tx.Bucket(bucketLanes)
	dead := tx.Bucket(bucketDead)
	deadChanged := false
	var now time.Time
	for _, o := range ops {
		switch o.kind {
		case opLane:
			if o.lane = s.findLane(o.key); o.lane != nil {
				continue
			}
			id, err := lanes.NextSequence()
			if err != nil {
				return 0, err
			}
			l := newLane(s, id, o.key, laneState{nextSeq: 1})
			if _, err := tx.CreateBucket(l.qname); err != nil {
				return 0, err
			}
			s.w.created = append(s.w.created, l)
			s.touch(l)
			o.lane = l
		case opPutDead:
			for i := range o.dls {
				id, err := dead.NextSequence()
				if err != nil {
					return 0, err
				}
				v := encodeDead(nil, &o.dls[i])
				if err := dead.Put(seqKey(id), v); err != nil {
					return 0, err
				}
				o.dls[i].ID = id
				deadN++
				deadBytes += int64(len(v))
			}
			deadChanged = true
		case opDelDead:
			for _, id := range o.ids {
				k := seqKey(id)
				if v := dead.Get(k); v != nil {
					deadN--
					deadBytes -= int64(len(v))
					if err := dead.Delete(k); err != nil {
						return 0, err
					}
				}
			}
			deadChanged = true
		case opAppend:
			l, b := o.lane, o.batch
			sz := int64(len(b.buf))
			if s.cfg.MaxBytes > 0 && live+sz > s.cfg.MaxBytes {
				o.err = ErrFull
				s.m.rejectedFull.Inc()
				continue
			}
			if min := s.cfg.minFree(); min > 0 {
				if now.IsZero() {
					now = time.Now()
				}
				if s.diskFree(now)-sz < min {
					o.err = ErrDiskLow
					s.m.rejectedDisk.Inc()
					continue
				}
			}
			q := tx.Bucket(l.qname)
			q.FillPercent = 1.0
			putChunkHeader(b.buf, o.accepted, b.n)
			// bbolt keeps b.buf until the commit; Append's caller waits for it.
			if err := q.Put(seqKey(l.w.nextSeq), b.buf); err != nil {
				o.err = fmt.Errorf("spool append: %w", err)
				continue
			}
			s.touch(l)
			if l.w.chunks == 0 {
				l.wOldest = o.accepted
			}
			l.wAppended = true
			l.w.nextSeq++
			l.w.chunks++
			l.w.records += uint64(b.n)
			l.w.bytes += uint64(sz)
			live += sz
			s.w.diskWritten += sz
			records += b.n
		}
	}

	for _, l := range s.w.touched {
		if l.wDeleted {
			l.wOldest = 0
			if k, v := tx.Bucket(l.qname).Cursor().First(); k != nil {
				l.wOldest, _, _ = chunkHeader(v)
			}
		}
		if err = lanes.Put(seqKey(l.id), encodeLane(nil, l.key, l.w)); err != nil {
			return 0, err
		}
	}
	if deadChanged {
		v := binary.BigEndian.AppendUint64(seqKey(uint64(deadN)), uint64(deadBytes))
		if err = tx.Bucket(bucketMeta).Put(keyDead, v); err != nil {
			return 0, err
		}
	}
	written := 0
	for _, o := range ops {
		written += o.size()
	}
	s.db.NoFreelistSync = !s.keepFreelist(written)
	if err = tx.Commit(); err != nil {
		return 0, err
	}
	s.w.freelistStale = s.db.NoFreelistSync
	s.w.live = live
	s.w.deadN, s.w.deadBytes = deadN, deadBytes
	return records, nil
}

// findLane returns the lane of key, committed or created in this commit.
func (s *Spool) findLane(key LaneKey) *Lane {
	s.mu.Lock()
	l := s.byKey[key]
	s.mu.Unlock()
	if l != nil {
		return l
	}
	for _, l := range s.w.created {
		if l.key == key {
			return l
		}
	}
	return nil
}

// publish makes a successful commit visible.
func (s *Spool) publish() {
	for _, l := range s.w.touched {
		l.mu.Lock()
		l.st, l.oldest = l.w, l.wOldest
		if l.wAppended {
			close(l.notify)
			l.notify = make(chan struct{})
		}
		l.mu.Unlock()
		l.wTouched, l.wAppended, l.wDeleted = false, false, false
	}
	clear(s.w.touched)
	s.w.touched = s.w.touched[:0]
	s.liveBytes.Store(s.w.live)
	s.deadN.Store(s.w.deadN)
	if len(s.w.created) > 0 {
		s.mu.Lock()
		for _, l := range s.w.created {
			s.lanes = append(s.lanes, l)
			s.byKey[l.key] = l
		}
		close(s.lanesCh)
		s.lanesCh = make(chan struct{})
		s.mu.Unlock()
		clear(s.w.created)
		s.w.created = s.w.created[:0]
	}
}

// rollback forgets a failed commit's working state. Its acks are kept for
// the next commit, which the next Append or Ack starts (not at once: a
// commit that keeps failing must not make the writer spin).
func (s *Spool) rollback(acks []ackOp) {
	for _, l := range s.w.touched {
		l.w, l.wOldest = l.st, l.oldest // l.st is written only by this goroutine
		l.wTouched, l.wAppended, l.wDeleted = false, false, false
	}
	clear(s.w.touched)
	s.w.touched = s.w.touched[:0]
	clear(s.w.created)
	s.w.created = s.w.created[:0]
	s.w.retry = append(s.w.retry[:0], acks...)
}

// diskFree estimates the filesystem's free bytes: a statfs at most every
// diskCheckEvery, minus what was appended since.
func (s *Spool) diskFree(now time.Time) int64 {
	if now.Sub(s.w.diskChecked) >= diskCheckEvery || now.Before(s.w.diskChecked) {
		var st syscall.Statfs_t
		if err := syscall.Statfs(s.cfg.Dir, &st); err != nil {
			s.log.Warn("spool: statfs failed", zap.Error(err))
			return s.w.diskFree - s.w.diskWritten
		}
		s.w.diskFree = int64(st.Bavail) * int64(st.Bsize)
		s.w.diskChecked = now
		s.w.diskWritten = 0
	}
	return s.w.diskFree - s.w.diskWritten
}

// updateFileBytes publishes the disk space the file takes: its allocated
// blocks (bbolt grows the file in steps of up to 16 MiB whose unwritten tail
// is sparse), or its length when the blocks are unknown.
func (s *Spool) updateFileBytes() {
	fi, err := os.Stat(s.path)
	if err != nil {
		return
	}
	n := fi.Size()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		n = min(n, st.Blocks*512)
	}
	s.fileBytes.Store(n)
}
