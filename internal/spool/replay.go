package spool

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
)

// replay applies the WAL from the applied position on into bbolt: every chunk record not
// acknowledged later is put, every acknowledged chunk in bbolt deleted, in
// transactions of up to maxCommitBytes that each store how far they got.
// Then every segment is freed and the WAL writer starts a new one.
//
// Damage is skipped exactly and reported (readLog's verdict); a write cut
// short at the log's end was never acknowledged: every record acknowledged
// before synced (the WAL end spool.db last recorded) was fsynced before that
// was committed, and one past it was acknowledged, if at all, within the
// last checkpoint's lag, which a bad tail cannot tell apart.
//
// Replay refuses (errMismatch) a WAL that is not this spool.db's: another
// spool's id in a recStart, a lane id spool.db never assigned, a recorded
// position the files do not reach. live: a replay deferred by a full disk
// (drain.go), whose lanes' readers run already and are woken, not placed.
func (s *Spool) replay(live bool) error {
	applied := s.st.applied
	lr, err := readLog(s.walDir, s.id[:], applied, s.synced)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	if m := lr.mismatch(); m != "" {
		return fmt.Errorf("%w: %s", errMismatch, m)
	}
	byID := make(map[uint64]*Lane, len(s.lanes))
	keys := make(map[uint64]storage.LaneKey, len(s.lanes)) // for the damage report
	for _, l := range s.lanes {
		byID[l.id], keys[l.id] = l, l.key
	}
	last := applied.seg
	for _, no := range lr.files {
		last = max(last, no)
	}
	s.w.nextNo = last + 1
	r := replayer{s: s, byID: byID}
	for _, d := range lr.damage {
		s.reportDamage(lr, d, keys)
	}
	for _, d := range lr.harmless {
		if s.firstReport(d) {
			s.log.Warn("spool: write-ahead log records failed their checksum but held nothing still needed; skipped",
				zap.String("segment", segName(d.seg)), zap.Int64("from", d.from), zap.Int64("to", d.to), zap.Int("records", d.records),
				zap.String("what", d.what))
		}
	}
	for _, d := range lr.torn {
		if s.firstReport(d) {
			s.log.Warn("spool: a write cut short at the end of the write-ahead log (never acknowledged) was dropped",
				zap.String("segment", segName(d.seg)), zap.Int64("from", d.from), zap.Int64("to", d.to))
		}
	}
	chunks, acked, acks := lr.pending()
	for k := range acked {
		if l := byID[k.lane]; l != nil {
			r.dels = append(r.dels, ackOp{l, k.seq})
		}
	}
	for _, rec := range chunks {
		r.add(rec)
		if r.err != nil {
			return r.err
		}
		if r.bytes >= int64(s.cfg.maxCommitBytes) {
			if err := r.apply(walPos{rec.pos.seg, rec.end}); err != nil {
				return err
			}
		}
	}
	// Everything is in bbolt: the next segment is where the WAL starts.
	r.final = true
	if err := r.apply(walPos{s.w.nextNo, 0}); err != nil {
		return err
	}
	if r.chunks > 0 || acks > 0 {
		s.log.Info("spool: replayed the write-ahead log",
			zap.Int("chunks", r.chunks), zap.Int("acks", acks), zap.Int("segments", len(lr.files)))
	}
	s.st.oldestSeg = s.st.applied.seg
	s.mu.Lock()
	s.walEnd = s.st.applied
	s.mu.Unlock()

	// Spares first, then the old segments, up to maxSpares; remove the rest.
	for _, name := range lr.spares {
		if n, ok := parseSegName(strings.TrimPrefix(name, sparePrefix)); ok {
			s.st.spareSeq = max(s.st.spareSeq, n)
		}
		if err := s.freeSegment(filepath.Join(s.walDir, name)); err != nil {
			s.log.Warn("spool: remove spare WAL file", zap.Error(err))
		}
	}
	for _, no := range lr.files {
		if err := s.freeSegment(filepath.Join(s.walDir, segName(no))); err != nil {
			return fmt.Errorf("wal: %w", err)
		}
	}

	if live {
		for _, l := range s.Lanes() {
			l.mu.Lock()
			l.next, l.aNext = max(l.next, l.cold.nextSeq), max(l.aNext, l.cold.nextSeq)
			l.watched = true // wake whoever may wait
			l.wakeLocked()
			l.mu.Unlock()
		}
		return nil
	}
	return s.placeReaders()
}

// placeReaders puts each lane's read cursor at its oldest chunk in bbolt,
// and its next seqs after its newest (Open). Draining, a lane's published
// end is just past its last chunk in bbolt instead: the next seq spool.db
// recorded counts chunks only the WAL holds, and a reader that reached it
// would skip them once the deferred replay put them into bbolt.
func (s *Spool) placeReaders() error {
	draining := s.draining.Load()
	return s.db.View(func(tx *bolt.Tx) error {
		for _, l := range s.lanes {
			l.next, l.aNext, l.readSeq = l.cold.nextSeq, l.cold.nextSeq, l.cold.nextSeq
			c := tx.Bucket(l.qname).Cursor()
			if k, _ := c.First(); k != nil {
				l.readSeq = binary.BigEndian.Uint64(k)
			}
			if draining {
				l.next = 0
				if k, _ := c.Last(); k != nil {
					l.next = binary.BigEndian.Uint64(k) + 1
				}
				l.readSeq = min(l.readSeq, l.next)
			}
		}
		return nil
	})
}

// quarantineDir is where damaged bytes are kept, under the spool's Dir.
const quarantineDir = "quarantine"

// firstReport reports whether d is seen for the first time (a deferred
// replay is tried again).
func (s *Spool) firstReport(d walDamage) bool {
	k := walPos{d.seg, d.from}
	if s.st.reported[k] {
		return false
	}
	s.st.reported[k] = true
	return true
}

// reportDamage reports damage that lost acknowledged records: a log line,
// the damaged-records counter (by events), the bytes in a quarantine file.
func (s *Spool) reportDamage(lr *logRead, d walDamage, keys map[uint64]storage.LaneKey) {
	if !s.firstReport(d) {
		return
	}
	s.st.damaged += int64(d.lost())
	fields := []zap.Field{
		zap.String("segment", segName(d.seg)), zap.Int64("from", d.from), zap.Int64("to", d.to),
		zap.Int64("bytes", d.to-d.from), zap.String("lane", lr.laneLabels(d, keys)),
		zap.Int("records", d.records), zap.Int("events", d.events), zap.String("what", d.what),
	}
	if d.unreadable > 0 {
		fields = append(fields, zap.Int("events_unknown_records", d.unreadable))
	}
	data := lr.data(d.seg)
	if from, to := min(d.from, int64(len(data))), min(d.to, int64(len(data))); to > from {
		dir := filepath.Join(s.cfg.Dir, quarantineDir)
		path := filepath.Join(dir, fmt.Sprintf("wal-%016x-%d-%d.bin", d.seg, d.from, d.to))
		if err := cmp.Or(os.MkdirAll(dir, 0o750), os.WriteFile(path, data[from:to], 0o600)); err != nil {
			fields = append(fields, zap.NamedError("quarantine_error", err))
		} else {
			fields = append(fields, zap.String("quarantine", path))
		}
	}
	s.log.Error("spool: damaged write-ahead log records skipped; acknowledged records in them are lost", fields...)
}

// replayer gathers the log's chunks until apply commits them.
type replayer struct {
	s     *Spool
	byID  map[uint64]*Lane
	puts  []*hotChunk
	putL  []*Lane // puts[i]'s lane
	dels  []ackOp // chunks of spool.db the log acknowledges
	bytes int64

	final  bool  // the last apply: also records the acknowledged end
	err    error // a chunk that refuses the replay (errMismatch)
	chunks int   // total, for the log
}

type laneSeq struct{ lane, seq uint64 }

// add gathers a chunk record the log does not acknowledge.
func (r *replayer) add(rec walRecord) {
	l := r.byID[rec.lane]
	if l == nil {
		if rec.lane > r.s.st.lanesSeq {
			r.err = fmt.Errorf("%w: the write-ahead log holds records of lane %d, which spool.db never had",
				errMismatch, rec.lane)
			return
		}
		// A lane spool.db had and removed (empty lanes are retired).
		r.s.log.Warn("spool: WAL record of a removed lane; skipped",
			zap.Uint64("lane", rec.lane), zap.Uint64("seq", rec.seq))
		return
	}
	acc, n, err := chunkHeader(rec.payload)
	if err != nil {
		r.s.log.Error("spool: WAL chunk does not decode; skipped",
			zap.String("lane", l.label), zap.Uint64("seq", rec.seq), zap.Error(err))
		return
	}
	v := upgradeChunk(rec.payload) // aliases the segment's bytes
	r.puts = append(r.puts, &hotChunk{seq: rec.seq, accepted: acc, records: n, size: len(v), cb: &storage.Buf{B: v}})
	r.putL = append(r.putL, l)
	r.bytes += int64(len(v))
	r.chunks++
}

// apply commits what was gathered and the position pos, in a transaction
// of the store's (Spool.apply) that always writes the freelist: a relay
// killed again before the store writes it (idleTasks) would otherwise
// have the next Open check every page of the file.
func (r *replayer) apply(pos walPos) error {
	s := r.s
	if len(r.puts) == 0 && len(r.dels) == 0 && pos == s.st.applied {
		return nil
	}
	end := s.synced
	if r.final {
		end = pos
	}
	s.st.replaying = true
	_, err := s.apply(nil, r.dels, r.puts, r.putL, pos, end)
	s.st.replaying = false
	s.settle(err == nil)
	if err != nil {
		return fmt.Errorf("wal replay: %w", err)
	}
	s.st.applied = pos
	s.coldLive.Store(s.st.live)
	r.puts, r.putL, r.dels, r.bytes = reuse(r.puts), reuse(r.putL), r.dels[:0], 0
	return nil
}
