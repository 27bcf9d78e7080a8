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

// The store goroutine owns every bbolt write: checkpoints (below), lane
// creation, dead letters, compaction, and the recycling of WAL segments.
//
// A checkpoint picks a WAL position P and, in one transaction, puts into
// bbolt every unacknowledged hot chunk before P, deletes the acknowledged
// chunks in bbolt, and stores P as applied; then the hot chunks before P
// are dropped from memory and the segments before P's reused. P is the
// WAL's published end, or the first unacknowledged chunk younger than
// flushAge (about to be delivered: never written twice). Past hotMaxBytes
// of hot chunks, or walMaxBytes of WAL since P, the WAL writer asks for a
// checkpoint of everything (force).

const (
	// defaultCheckpointEvery is how often the store checkpoints while
	// there is anything to checkpoint.
	defaultCheckpointEvery = 100 * time.Millisecond
	// defaultFlushAge: an unacknowledged chunk accepted this long ago is
	// put into bbolt by the next checkpoint. Under load, delivery
	// acknowledges a chunk within tens of milliseconds.
	defaultFlushAge = 500 * time.Millisecond
	// defaultWALMaxBytes bounds the WAL since the applied position, and
	// with it what a restart replays.
	defaultWALMaxBytes = 64 << 20
	// maxSpares bounds the WAL files kept for reuse. It covers what a
	// busy WAL holds (defaultWALMaxBytes of defaultSegmentBytes segments,
	// plus the current one) and the several segments one checkpoint
	// frees at once, so that under load the writer reuses a file instead
	// of allocating a new one, whose fdatasyncs also write the extents'
	// metadata. With 2, half the rotations at 1M events/s made a new
	// file; 8 gave +5% events/s (median of 4 interleaved runs). Spares
	// are only what the WAL once held, and are removed when the spool
	// goes idle.
	maxSpares = 8
	// defaultIdleAfter: when nothing was appended for this long, the WAL
	// writer gives up its segment and the spare files are removed, so that
	// an idle spool gives the WAL's disk space back.
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
	lastCkptErr   string

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
		final := isClosed(s.walDone) // Close stopped the WAL writer
		force := s.force.Swap(false) || final
		s.mu.Lock()
		due := len(s.sops) > 0 || force || now.Sub(s.st.lastCheckpoint) >= s.cfg.checkpointEvery
		var acks []ackOp
		var end walPos
		var total int64
		ops := s.st.ops[:0]
		if due {
			ops = append(ops, s.sops...)
			clear(s.sops)
			s.sops = s.sops[:0]
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
			clear(ops)
			s.st.ops = ops[:0]
			if final {
				s.persistFreelist()
				s.updateFileBytes()
				return
			}
		}
		s.wait(timer)
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// wait waits for work: queued operations, a forced checkpoint, Close, or
// the next checkpoint's time while anything is pending; when nothing is,
// for the idle tasks (freelist, trim, spares) or for ever.
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

// idleTasks run when the store has been idle for a while: the freelist
// written for a fast next Open, the spares and the WAL retired.
func (s *Spool) idleTasks() {
	if s.st.freelistStale {
		s.idleFreelist()
	}
	now := time.Now()
	s.checkIdle(now)
	s.maybeRetire(now)
}

// afterCommit runs after a checkpoint that committed: compaction, trimming,
// the file sizes.
func (s *Spool) afterCommit() {
	s.maybeCompact()
	if s.db != nil {
		// The commit touched pages (tails, branch pages, the headers of
		// deleted chunks, the neighbours bbolt rewrote); the kernel maps a
		// file's page cache in large folios, so each touch maps up to a
		// megabyte around it. A trim takes ~120 µs, a checkpoint commits
		// at most every checkpointInterval: cheap next to what the pages
		// add to the RSS under load (up to 60 MB with a 50 ms interval).
		trimMapping(s.db)
	}
	s.updateFileBytes()
}

// trimDeleted is how many bytes of deleted chunks a checkpoint's
// transaction deletes between two trims of the mapping (see apply).
const trimDeleted = 4 << 20

// checkpoint commits the store's operations and a checkpoint (see above)
// in one transaction, answers the operations, and reports whether it
// committed anything. all puts every unacknowledged chunk up to end.
func (s *Spool) checkpoint(ops []*op, acks []ackOp, end walPos, endTotal int64, all bool, now time.Time) bool {
	// Only the lanes appended to since their last checkpoint (lanes.go):
	// the others have no hot chunk and nothing new to record.
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
		// Draining: the WAL from the applied position on waits for its
		// replay; nothing may move past it.
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
		l.w.nextSeq = max(l.w.nextSeq, l.next)
		l.mu.Unlock()
	}
	s.st.flush, s.st.flushL = flush, flushL
	defer func() { clear(flush); clear(flushL) }()
	// Unless NoSync, a commit also records the acknowledged WAL end
	// (replay tells damage from a torn write by it), so a WAL that moved
	// is reason enough for one.
	if s.draining.Load() {
		end = s.synced
	}
	syncedMoved := !s.cfg.NoSync && s.synced.less(end)
	if len(ops) == 0 && len(acks) == 0 && len(flush) == 0 && p == s.st.applied && !syncedMoved {
		for _, l := range lanes {
			l.w.nextSeq = l.cold.nextSeq
		}
		return false
	}

	start := time.Now()
	written, err := s.apply(ops, acks, flush, flushL, lanes, p, end)
	if err != nil {
		err = fmt.Errorf("spool checkpoint: %w", err)
		// Once per state change (and when the error changes), not every
		// checkpointInterval: a full disk fails every checkpoint.
		if msg := err.Error(); !s.ckptFailed.Load() || msg != s.st.lastCkptErr {
			s.log.Error("spool checkpoint failed; retrying every checkpoint interval until one succeeds", zap.Error(err))
			s.st.lastCkptErr = msg
		}
		s.rollback(acks, flush, flushL, lanes)
		cause := err.Error()
		s.ckptErr.Store(&cause)
		s.ckptFailed.Store(true)
	} else {
		if s.ckptFailed.Load() {
			s.log.Info("spool checkpoint succeeded again")
			s.st.lastCkptErr = ""
		}
		s.ckptFailed.Store(false)
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

// apply runs the transaction of a checkpoint. It changes only the store's
// working state (Lane.w, storeState), which commitPublish or rollback then
// settle. It returns the bytes of the chunks it put.
func (s *Spool) apply(ops []*op, acks []ackOp, flush []*hotChunk, flushL []*Lane, lanes []*Lane, p, end walPos) (written int, err error) {
	if s.db == nil {
		return 0, errors.New("spool file is not open after a failed compaction")
	}
	tx, err := s.db.Begin(true)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			_ = guard(tx.Rollback)
		}
	}()
	// bbolt panics on a page it cannot parse (a damaged file): the
	// checkpoint fails instead, and is logged.
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w: %v", ErrDamaged, v)
		}
	}()
	live := s.st.live
	deadN, deadBytes := s.st.deadN, s.st.deadBytes

	// Deletions first, so that the pages they free serve this commit.
	// Each maps the pages around its chunk's header (see afterCommit);
	// dropping them every few megabytes keeps a checkpoint that deletes a
	// drained backlog's worth of chunks from mapping all of it at once.
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
	for _, l := range lanes {
		if l.w.nextSeq != l.cold.nextSeq {
			s.touch(l)
		}
	}
	if err := s.txLanes(tx); err != nil {
		return 0, err
	}
	if deadChanged {
		v := binary.BigEndian.AppendUint64(seqKey(uint64(deadN)), uint64(deadBytes))
		if err = tx.Bucket(bucketMeta).Put(keyDead, v); err != nil {
			return 0, err
		}
	}
	if p != s.st.applied {
		if err = tx.Bucket(bucketMeta).Put(keyWAL, p.encode()); err != nil {
			return 0, err
		}
	}
	if end != s.synced && s.synced.less(end) {
		if err = s.putSynced(tx.Bucket(bucketMeta), end); err != nil {
			return 0, err
		}
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

// txDelete deletes chunk seq of l in tx, if it is there, and returns its
// size.
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
	_, n, herr := chunkHeader(v)
	if herr != nil {
		n = 0
	}
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
// working state becomes their bbolt state; else it is dropped (l.cold is
// written only by the store goroutine).
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
	clear(s.st.touched)
	s.st.touched = s.st.touched[:0]
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

// commitPublish makes a committed checkpoint visible: the lanes' bbolt
// state, the hot chunks before p dropped (the spool's references released),
// the acknowledgements that came while their chunk was being put queued as
// deletions, the applied position, the new lanes.
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
	clear(s.st.created)
	s.st.created = s.st.created[:0]
}

// rollback forgets a failed checkpoint: the lanes' working state, the
// chunks' flushing marks (those acknowledged meanwhile are released now).
// Its acks are kept for the next checkpoint.
func (s *Spool) rollback(acks []ackOp, flush []*hotChunk, flushL []*Lane, lanes []*Lane) {
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
	for _, l := range lanes {
		l.w, l.wOldest = l.cold, l.coldOldest // checkpoint set their nextSeq
	}
	s.settle(false)
	clear(s.st.created)
	s.st.created = s.st.created[:0]
	s.mu.Lock()
	s.coldAcks = append(acks, s.coldAcks...)
	s.mu.Unlock()
}

// recycle reuses or removes the WAL segments before the applied one: their
// records are all in bbolt or acknowledged.
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

// freeSegment makes the segment (or spare) file at path, whose records are
// all in bbolt or acknowledged, a spare for the WAL writer (a segment is
// renamed out of the segments' names) while there are fewer than
// maxSpares, the spool is not idle and the file has the standard size;
// otherwise it removes it. A missing file (a number the writer skipped, or
// removed already) is no error.
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

// checkIdle notices when nothing was appended for Config.idleAfter: then
// the spare WAL files are removed and the WAL writer is asked to give up
// its segment, which the next checkpoint frees; an idle spool keeps no WAL
// on disk.
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
	for removed := false; ; {
		select {
		case sp := <-s.spares:
			if err := removeIfExists(sp); err != nil {
				s.log.Warn("spool: remove spare WAL file", zap.Error(err))
			}
			removed = true
			continue
		default:
		}
		if removed {
			s.updateFileBytes()
		}
		break
	}
	if end.off > 0 {
		s.retire.Store(true)
		wake(s.walWake)
	}
}

// A commit writes the freelist when its page ids (8 bytes each) take at most
// freelistMinBytes or 1/freelistShare of the chunk bytes the commit writes,
// so that Open — after a crash too — reads it instead of rebuilding it by
// checking every page of the file (about 1 s per 5 GB here). A drain (acks,
// no puts) frees far more, and then commits skip the freelist and a crash
// costs the scan. The clean Close writes it anyway.
const (
	freelistMinBytes = 16 << 10
	freelistShare    = 8
)

// keepFreelist reports whether a commit writing written chunk bytes and
// deleting freed should write the freelist. bbolt's counts are those of the
// transaction's start: the pages it frees are estimated from freed. Without
// them a drain's commit wrote the freelist of everything it deleted, and
// on a full disk with no free run that long it could not delete at all.
func (s *Spool) keepFreelist(written, freed int) bool {
	st := s.db.Stats()
	ids := st.FreePageN + st.PendingPageN + freed/s.db.Info().PageSize
	return ids*8 <= max(freelistMinBytes, written/freelistShare)
}

// When the last commit skipped the freelist and no other follows within
// idleFreelistDelay, the store commits it alone (idleFreelist), if its ids
// take at most idleFreelistMaxBytes: a relay that goes quiet — a backlog
// built while the upstream is down, the end of a burst — has it on disk
// for the next Open even after a crash, at the cost of one small commit.
const (
	idleFreelistDelay    = 50 * time.Millisecond
	idleFreelistMaxBytes = 1 << 20
)

func (s *Spool) idleFreelist() {
	s.st.freelistStale = false
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
	s.st.freelistStale = false
}

// updateFileBytes publishes the disk space of the bbolt file and the WAL.
func (s *Spool) updateFileBytes() {
	var n int64
	if fi, err := os.Stat(s.path); err == nil {
		n = fileBytes(fi)
	}
	s.fileBytes.Store(n + walDirBytes(s.walDir))
}
