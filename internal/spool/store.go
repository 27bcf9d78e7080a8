package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
)

// The store goroutine owns every bbolt write: checkpoints, lanes, dead
// letters, compaction, and the recycling of WAL segments.
//
// A checkpoint picks a WAL position P and, in one transaction, puts every
// unacknowledged hot chunk before P, deletes the acknowledged chunks, and
// stores P as applied; then the hot chunks and the segments before P are
// freed. P is the WAL's published end, or the first unacknowledged chunk
// younger than flushAge (likely delivered soon). Past hotMaxBytes of hot
// chunks, or walMaxBytes of WAL since P, the WAL writer asks for a
// checkpoint of everything (force).

const (
	defaultCheckpointEvery = 100 * time.Millisecond
	// defaultFlushAge: an unacknowledged chunk this old goes into bbolt at
	// the next checkpoint (under load, delivery acks within tens of ms).
	defaultFlushAge    = 500 * time.Millisecond
	defaultWALMaxBytes = 64 << 20 // what a restart replays, at most
	// maxSpares bounds the WAL files kept for reuse: what a busy WAL holds
	// and one checkpoint frees, so that the writer rarely allocates a file
	// (whose fdatasyncs also write the extents' metadata). With 2, half
	// the rotations at 1M events/s made a new file; 8 gave +5% events/s.
	maxSpares = 8
	// defaultIdleAfter: nothing appended for this long, the WAL's files
	// are given back.
	defaultIdleAfter = 30 * time.Second
)

// storeState belongs to the store goroutine (and to Open before it starts).
type storeState struct {
	ops     []*op
	lanes   []*Lane
	touched []*Lane
	created []*Lane
	flush   []*hotChunk
	flushL  []*Lane // flush[i]'s lane

	live             int64 // bytes of the chunks in bbolt (committed)
	deadN, deadBytes int64 // committed dead letters

	applied   walPos // WAL position applied to bbolt (committed)
	oldestSeg uint64 // the oldest segment not yet reused or removed
	spareSeq  uint64 // names spare files

	lastCheckpoint time.Time
	lastAppend     int64     // walTotal when checkIdle last saw it change
	idleSince      time.Time // since then
	idle           bool      // nothing appended for Config.idleAfter

	compactFailed time.Time
	freelistStale bool // the last commit did not write the freelist
	replaying     bool // apply commits a replay: it writes the freelist

	lanesSeq                uint64          // the highest lane id in spool.db, at Open
	damaged, damagedCounted int64           // damaged WAL records replay skipped; of them counted
	reported                map[walPos]bool // damage replay reported (once)
	drainErr                error           // why the replay waits (drain.go)
	drainTried              time.Time

	lastRetire time.Time // the last look for lanes to retire (lanes.go)
}

// runStore is the store goroutine.
func (s *Spool) runStore() {
	defer close(s.storeDone)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		now := time.Now()
		final := false
		select {
		case <-s.walDone: // Close stopped the WAL writer
			final = true
		default:
		}
		force := s.force.Swap(false) || final
		s.mu.Lock()
		due := len(s.sops) > 0 || force || now.Sub(s.st.lastCheckpoint) >= s.cfg.checkpointEvery
		var acks []ackOp
		var end walPos
		var total int64
		ops := s.st.ops[:0]
		if due {
			ops = append(ops, s.sops...)
			s.sops = reuse(s.sops)
			acks, s.coldAcks = s.coldAcks, nil
			end, total = s.walEnd, s.walTotal
		}
		s.mu.Unlock()
		if due {
			if s.checkpoint(ops, acks, end, total, force, now) {
				s.afterCommit()
			}
			s.retryReplay(now)
			s.st.lastCheckpoint = now
			s.recycle()
			s.checkIdle(now)
			s.maybeRetire(now)
			s.st.ops = reuse(ops)
			if final {
				s.persistFreelist()
				s.updateFileBytes()
				return
			}
		}
		s.wait(timer)
	}
}

// wait waits for work, the next checkpoint's time while anything is
// pending, else for the idle tasks.
func (s *Spool) wait(timer *time.Timer) {
	d := time.Duration(-1)
	if s.pending() {
		s.armed.Store(true)
		d = max(time.Until(s.st.lastCheckpoint.Add(s.cfg.checkpointEvery)), 0)
	} else {
		s.armed.Store(false)
		switch {
		case s.pending(): // published meanwhile (the writer saw armed still set)
			s.armed.Store(true)
			d = s.cfg.checkpointEvery
		case s.st.freelistStale:
			d = idleFreelistDelay
		case !s.st.idle:
			d = s.cfg.idleAfter
		}
		if r := s.retireWait(); r >= 0 && (d < 0 || r < d) {
			d = r
		}
	}
	if s.draining.Load() { // the replay's next try (drain.go)
		r := s.cfg.drainEvery
		if d < 0 || d > r {
			d = r
		}
	}
	if d >= 0 {
		timer.Reset(d)
	}
	select {
	case <-s.storeWake:
		timer.Stop() // no stale tick can follow (Go 1.23 timers)
	case <-timer.C:
		if !s.pending() {
			s.idleTasks()
		}
	}
}

// pending reports whether a checkpoint has anything to do.
func (s *Spool) pending() bool {
	if s.hotHeld.Load() > 0 {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.coldAcks) > 0 || len(s.sops) > 0 || s.walEnd != s.st.applied
}

// idleTasks: the freelist written, the spares and the WAL retired.
func (s *Spool) idleTasks() {
	if s.st.freelistStale {
		s.st.freelistStale = false
		if s.db != nil {
			if st := s.db.Stats(); (st.FreePageN+st.PendingPageN)*8 <= idleFreelistMaxBytes {
				s.persistFreelist()
			}
		}
	}
	now := time.Now()
	s.checkIdle(now)
	s.maybeRetire(now)
}

// afterCommit runs after a checkpoint that committed.
func (s *Spool) afterCommit() {
	s.maybeCompact()
	if s.db != nil {
		// Each page the commit touched maps up to a megabyte of folio
		// around it: a trim (~120 µs) is cheap next to the RSS they add
		// under load (up to 60 MB with a 50 ms interval).
		trimMapping(s.db)
	}
	s.updateFileBytes()
}

// trimDeleted is how many bytes a checkpoint deletes between two trims.
const trimDeleted = 4 << 20

// checkpoint commits the store's operations and a checkpoint in one
// transaction, answers the operations, and reports whether it committed
// anything. all puts every unacknowledged chunk up to end.
func (s *Spool) checkpoint(ops []*op, acks []ackOp, end walPos, endTotal int64, all bool, now time.Time) bool {
	// Only the lanes appended to since (markDirtyLocked).
	s.mu.Lock()
	s.st.lanes = append(s.st.lanes[:0], s.dirty...)
	s.mu.Unlock()
	lanes := s.st.lanes
	defer clear(lanes)
	defer s.pruneDirty()

	// P: the WAL's end, or the first young unacknowledged chunk.
	p, pTotal := end, endTotal
	if !all {
		cutoff := now.Add(-s.cfg.flushAge).UnixMilli()
		for _, l := range lanes {
			l.mu.Lock()
			for _, c := range l.hot.cs[l.hot.head:] {
				if !c.pos.less(p) {
					break
				}
				if !c.acked && c.accepted > cutoff {
					p, pTotal = c.pos, c.walAt
					break
				}
			}
			l.mu.Unlock()
		}
	}
	if p.less(s.st.applied) || s.draining.Load() {
		// Draining: nothing moves past what waits for its replay.
		p, pTotal = s.st.applied, s.appliedTotal.Load()
	}
	// The chunks to put: every unacknowledged one before P.
	flush, flushL := s.st.flush[:0], s.st.flushL[:0]
	for _, l := range lanes {
		l.mu.Lock()
		for _, c := range l.hot.cs[l.hot.head:] {
			if !c.pos.less(p) {
				break
			}
			if !c.acked {
				c.flushing = true
				flush = append(flush, c)
				flushL = append(flushL, l)
			}
		}
		if l.next > l.w.nextSeq {
			l.w.nextSeq = l.next
			s.touch(l)
		}
		l.mu.Unlock()
	}
	s.st.flush, s.st.flushL = flush, flushL
	defer func() { clear(flush); clear(flushL) }()
	// Unless NoSync, a commit records the acknowledged WAL end (replay
	// tells damage from a torn write by it): a WAL that moved needs one.
	if s.draining.Load() {
		end = s.synced
	}
	syncedMoved := !s.cfg.NoSync && s.synced.less(end)
	if len(ops) == 0 && len(acks) == 0 && len(flush) == 0 && p == s.st.applied && !syncedMoved {
		s.settle(false)
		return false
	}

	start := time.Now()
	written, err := s.apply(ops, acks, flush, flushL, p, end)
	if err != nil {
		err = fmt.Errorf("spool checkpoint: %w", err)
		// Logged once per error, not at every try.
		if msg := err.Error(); s.ckptErr.Load() == nil || msg != *s.ckptErr.Load() {
			s.log.Error("spool checkpoint failed; retrying every checkpoint interval until one succeeds", zap.Error(err))
			s.ckptErr.Store(&msg)
		}
		s.rollback(acks, flush, flushL)
	} else {
		if s.ckptErr.Swap(nil) != nil {
			s.log.Info("spool checkpoint succeeded again")
		}
		s.commitPublish(lanes, p, pTotal)
		s.m.checkpoints.Inc()
		s.m.checkpointSeconds.Observe(time.Since(start).Seconds())
		s.m.checkpointBytes.Add(float64(written))
	}
	s.mu.Lock()
	close(s.relief)
	s.relief = make(chan struct{})
	s.mu.Unlock()
	for _, o := range ops {
		if o.err == nil {
			o.err = err
		}
		o.done <- struct{}{}
	}
	return err == nil
}

// apply runs the transaction of a checkpoint (or replay). It changes only
// the store's working state (Lane.w, storeState), which settle then makes
// the lanes' or drops. It returns the bytes of the chunks it put.
func (s *Spool) apply(ops []*op, acks []ackOp, flush []*hotChunk, flushL []*Lane, p, end walPos) (written int, err error) {
	if s.db == nil {
		return 0, errors.New("spool file is not open after a failed compaction")
	}
	tx, err := s.db.Begin(true)
	if err != nil {
		return 0, err
	}
	defer func() {
		// bbolt panics on a page it cannot parse: the checkpoint fails.
		if v := recover(); v != nil {
			err = fmt.Errorf("%w: %v", ErrDamaged, v)
		}
		if err != nil {
			_ = guard(tx.Rollback)
		}
	}()
	live := s.st.live
	deadN, deadBytes := s.st.deadN, s.st.deadBytes

	// Deletions first, so that the pages they free serve this commit; the
	// pages they map are dropped every few megabytes (see afterCommit).
	unmapped, freed := 0, 0
	for i, a := range acks {
		n, err := s.txDelete(tx, a.lane, a.seq)
		if err != nil {
			return 0, err
		}
		live -= int64(n)
		freed += n
		if unmapped += n; unmapped >= trimDeleted || i == len(acks)-1 && unmapped > 0 {
			if s.cfg.beforeTrim != nil {
				s.cfg.beforeTrim()
			}
			trimTx(s.db, tx)
			unmapped = 0
		}
	}

	lanesB := tx.Bucket(bucketLanes)
	dead := tx.Bucket(bucketDead)
	deadChanged := false
	for _, o := range ops {
		switch o.kind {
		case opLane:
			if o.lane = s.findLane(o.key); o.lane != nil {
				continue
			}
			s.mu.Lock()
			o.err = s.refuseLaneLocked(o.key.APIKey, s.st.created)
			s.mu.Unlock()
			if o.err != nil {
				continue
			}
			id, err := lanesB.NextSequence()
			if err != nil {
				return 0, err
			}
			l := newLane(s, id, o.key, laneState{nextSeq: 1})
			if _, err := tx.CreateBucket(l.qname); err != nil {
				return 0, err
			}
			s.st.created = append(s.st.created, l)
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
		}
	}

	for i, c := range flush {
		if err := s.txPut(tx, flushL[i], c.seq, c.accepted, c.records, c.cb.B); err != nil {
			return 0, err
		}
		live += int64(c.size)
		written += c.size
	}
	err = s.txLanes(tx)
	meta := tx.Bucket(bucketMeta)
	if deadChanged && err == nil {
		err = meta.Put(keyDead, binary.BigEndian.AppendUint64(seqKey(uint64(deadN)), uint64(deadBytes)))
	}
	if p != s.st.applied && err == nil {
		err = meta.Put(keyWAL, p.encode())
	}
	if s.synced.less(end) && err == nil {
		err = s.putSynced(meta, end)
	}
	if err != nil {
		return 0, err
	}
	s.db.NoFreelistSync = !s.st.replaying && !s.keepFreelist(written, freed)
	if err = tx.Commit(); err != nil {
		return 0, err
	}
	s.st.freelistStale = s.db.NoFreelistSync
	if s.synced.less(end) {
		s.synced = end
	}
	s.st.live = live
	s.st.deadN, s.st.deadBytes = deadN, deadBytes
	return written, nil
}

// txDelete deletes chunk seq of l in tx, if there, and returns its size.
func (s *Spool) txDelete(tx *bolt.Tx, l *Lane, seq uint64) (int, error) {
	q := tx.Bucket(l.qname)
	if q == nil {
		return 0, nil // a lane created by a commit that failed
	}
	k := seqKey(seq)
	v, nested := chunkAt(q, k)
	if v == nil {
		return 0, nil // acknowledged twice, or never put
	}
	_, n, _ := chunkHeader(v) // 0 when damaged
	sz := len(v)
	if err := deleteChunk(q, k, nested); err != nil {
		return 0, err
	}
	s.touch(l)
	l.wOldStale = true
	l.w.chunks--
	l.w.records -= uint64(n)
	l.w.bytes -= uint64(sz)
	return sz, nil
}

// txPut puts a chunk (encoded in v, which bbolt keeps until the commit)
// into l's queue in tx.
func (s *Spool) txPut(tx *bolt.Tx, l *Lane, seq uint64, accepted int64, records int, v []byte) error {
	q := tx.Bucket(l.qname)
	if q == nil {
		return fmt.Errorf("lane %s: queue bucket missing: %w", l.label, errCorrupt)
	}
	q.FillPercent = 1.0
	if err := putChunk(q, seqKey(seq), v); err != nil {
		return err
	}
	s.touch(l)
	if l.w.chunks == 0 {
		l.wOldest = accepted
	}
	l.w.chunks++
	l.w.records += uint64(records)
	l.w.bytes += uint64(len(v))
	l.w.nextSeq = max(l.w.nextSeq, seq+1)
	return nil
}

// txLanes writes the lane records of the touched lanes.
func (s *Spool) txLanes(tx *bolt.Tx) error {
	lanes := tx.Bucket(bucketLanes)
	for _, l := range s.st.touched {
		if l.wOldStale {
			l.wOldest = firstAccepted(tx.Bucket(l.qname))
		}
		if err := lanes.Put(seqKey(l.id), encodeLane(nil, l.key, l.w)); err != nil {
			return err
		}
	}
	return nil
}

// settle ends a transaction for the lanes it touched: committed, their
// working state becomes their bbolt state; else it is dropped.
func (s *Spool) settle(committed bool) {
	for _, l := range s.st.touched {
		if committed {
			l.mu.Lock() // readers read l.cold (and a deferred replay runs beside them)
			l.cold, l.coldOldest = l.w, l.wOldest
			l.mu.Unlock()
		} else {
			l.w, l.wOldest = l.cold, l.coldOldest
		}
		l.wTouched, l.wOldStale = false, false
	}
	s.st.touched = reuse(s.st.touched)
}

func (s *Spool) touch(l *Lane) {
	if !l.wTouched {
		l.wTouched = true
		s.st.touched = append(s.st.touched, l)
	}
}

// findLane returns the lane of key, committed or created in this commit.
func (s *Spool) findLane(key storage.LaneKey) *Lane {
	if l := s.byKey.get(key); l != nil {
		return l
	}
	for _, l := range s.st.created {
		if l.key == key {
			return l
		}
	}
	return nil
}

// commitPublish makes a committed checkpoint visible: the hot chunks before
// p dropped (those acknowledged while being put queued as deletions), the
// applied position, the new lanes.
func (s *Spool) commitPublish(lanes []*Lane, p walPos, pTotal int64) {
	s.settle(true)
	var held, unacked int64
	var later []ackOp
	for _, l := range lanes {
		l.mu.Lock()
		l.hot.popBefore(p, func(c *hotChunk) {
			if !c.flushing {
				return // acknowledged before the checkpoint, released then
			}
			c.flushing = false
			if c.acked {
				later = append(later, ackOp{l, c.seq})
			} else {
				unacked += int64(c.size)
			}
			c.cb.Release()
			c.cb = nil
			held += int64(c.size)
		})
		l.mu.Unlock()
	}
	s.hotHeld.Add(-held)
	s.hotUnacked.Add(-unacked)
	s.coldLive.Store(s.st.live)
	s.deadN.Store(s.st.deadN)
	s.st.applied = p
	s.appliedTotal.Store(pTotal)
	s.mu.Lock()
	if len(later) > 0 {
		s.coldAcks = append(s.coldAcks, later...)
	}
	if len(s.st.created) > 0 {
		for _, l := range s.st.created {
			s.lanes = append(s.lanes, l)
			s.byKey.add(l)
		}
		close(s.lanesCh)
		s.lanesCh = make(chan struct{})
	}
	s.mu.Unlock()
	s.st.created = reuse(s.st.created)
}

// rollback forgets a failed checkpoint but its acks, kept for the next.
func (s *Spool) rollback(acks []ackOp, flush []*hotChunk, flushL []*Lane) {
	var held int64
	for i, c := range flush {
		l := flushL[i]
		l.mu.Lock()
		c.flushing = false
		if c.acked && c.cb != nil {
			c.cb.Release()
			c.cb = nil
			held += int64(c.size)
		}
		l.hot.popAcked()
		l.mu.Unlock()
	}
	s.hotHeld.Add(-held)
	s.settle(false)
	s.st.created = reuse(s.st.created)
	s.mu.Lock()
	s.coldAcks = append(acks, s.coldAcks...)
	s.mu.Unlock()
}

// recycle frees the WAL segments before the applied one.
func (s *Spool) recycle() {
	if s.st.oldestSeg >= s.st.applied.seg {
		return
	}
	defer s.updateFileBytes()
	for ; s.st.oldestSeg < s.st.applied.seg; s.st.oldestSeg++ {
		if err := s.freeSegment(filepath.Join(s.walDir, segName(s.st.oldestSeg))); err != nil {
			s.log.Warn("spool: remove WAL segment", zap.Error(err))
		}
	}
}

// freeSegment makes the segment (or spare) file at path a spare for the
// WAL writer while fewer than maxSpares wait, the spool is not idle and the
// file has the standard size; otherwise it removes it. A missing file is no
// error.
func (s *Spool) freeSegment(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return nil
	}
	if !s.st.idle && fi.Size() == s.cfg.segmentBytes && len(s.spares) < cap(s.spares) {
		sp := path
		if !strings.HasPrefix(filepath.Base(path), sparePrefix) {
			s.st.spareSeq++
			sp = filepath.Join(s.walDir, fmt.Sprintf("%s%016x.wal", sparePrefix, s.st.spareSeq))
			err = os.Rename(path, sp)
		}
		if err == nil {
			select {
			case s.spares <- sp:
				return nil
			default:
				path = sp
			}
		}
	}
	return removeIfExists(path)
}

// checkIdle notices when nothing was appended for idleAfter: then the
// spares are removed and the WAL writer gives up its segment.
func (s *Spool) checkIdle(now time.Time) {
	s.mu.Lock()
	total, end := s.walTotal, s.walEnd
	s.mu.Unlock()
	if total != s.st.lastAppend || s.st.idleSince.IsZero() {
		s.st.lastAppend, s.st.idleSince, s.st.idle = total, now, false
		return
	}
	if now.Sub(s.st.idleSince) < s.cfg.idleAfter {
		return
	}
	s.st.idle = true
	if len(s.spares) > 0 {
		for len(s.spares) > 0 {
			select {
			case sp := <-s.spares:
				if err := removeIfExists(sp); err != nil {
					s.log.Warn("spool: remove spare WAL file", zap.Error(err))
				}
			default: // the writer took it
			}
		}
		s.updateFileBytes()
	}
	if end.off > 0 {
		s.retire.Store(true)
		wake(s.walWake)
	}
}

// A commit writes the freelist when its page ids (8 bytes each) take at
// most freelistMinBytes or 1/freelistShare of the chunk bytes it writes, so
// that Open, after a crash too, reads it instead of checking every page (1
// s per 5 GB here). A drain's commits skip it; Close writes it anyway.
const (
	freelistMinBytes = 16 << 10
	freelistShare    = 8
)

// keepFreelist reports whether a commit writing written chunk bytes and
// deleting freed should write the freelist. bbolt's counts are the
// transaction's start's, so freed is added: else a drain's commit wrote the
// freelist of all it deleted, and on a full disk could not delete at all.
func (s *Spool) keepFreelist(written, freed int) bool {
	st := s.db.Stats()
	ids := st.FreePageN + st.PendingPageN + freed/s.db.Info().PageSize
	return ids*8 <= max(freelistMinBytes, written/freelistShare)
}

// When the last commit skipped the freelist and none follows within
// idleFreelistDelay, the store commits it alone if its ids take at most
// idleFreelistMaxBytes: a relay gone quiet has it on disk even after a
// crash.
const (
	idleFreelistDelay    = 50 * time.Millisecond
	idleFreelistMaxBytes = 1 << 20
)

// persistFreelist commits the freelist, whatever its size. Best effort: a
// failure only makes the next Open slower.
func (s *Spool) persistFreelist() {
	if s.db == nil {
		return
	}
	s.db.NoFreelistSync = false
	if err := s.db.Update(func(*bolt.Tx) error { return nil }); err != nil {
		s.log.Warn("spool: write the freelist", zap.Error(err))
		return
	}
	s.st.freelistStale = false
}

// updateFileBytes publishes the disk space of the bbolt file and of the
// regular files of the WAL's directory.
func (s *Spool) updateFileBytes() {
	var n int64
	if fi, err := os.Stat(s.path); err == nil {
		n = fileBytes(fi)
	}
	ents, _ := os.ReadDir(s.walDir)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fileBytes(fi)
		}
	}
	s.fileBytes.Store(n)
}
