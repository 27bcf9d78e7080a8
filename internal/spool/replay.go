package spool

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"
)

// replay applies the WAL from applied on into bbolt, at Open: every chunk
// record not acknowledged later in the WAL is put, every acknowledged chunk
// in bbolt is deleted, in transactions of up to MaxCommitBytes (and one per
// segment), each storing how far it got. Then every segment is free: it is
// kept as a spare or removed, and the WAL writer starts a new one. A
// segment is read up to its first invalid record (see wal.go).
func (s *Spool) replay(applied walPos) error {
	segs, spares, err := walFiles(s.walDir)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	byID := make(map[uint64]*Lane, len(s.lanes))
	for _, l := range s.lanes {
		byID[l.id] = l
	}
	s.st.applied = applied
	last := applied.seg
	r := replayer{s: s, byID: byID, pos: applied}
	for _, no := range segs {
		last = max(last, no)
		if no < applied.seg {
			continue
		}
		data, err := os.ReadFile(filepath.Join(s.walDir, segName(no)))
		if err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		off := int64(0)
		if no == applied.seg {
			off = applied.off
		}
		for {
			rec, ok := nextRecord(data, no, off)
			if !ok {
				break
			}
			r.add(rec)
			off = rec.end
			if r.bytes >= int64(s.cfg.maxCommit()) {
				if err := r.apply(walPos{no, off}); err != nil {
					return err
				}
			}
		}
		if err := r.apply(walPos{no, off}); err != nil {
			return err
		}
	}
	s.w.nextNo = last + 1
	// Everything is in bbolt: the next segment is where the WAL starts.
	if err := r.apply(walPos{s.w.nextNo, 0}); err != nil {
		return err
	}
	if r.chunks > 0 || r.acks > 0 {
		s.log.Info("spool: replayed the write-ahead log",
			zap.Int("chunks", r.chunks), zap.Int("acks", r.acks), zap.Int("segments", len(segs)))
	}
	s.st.oldestSeg = s.st.applied.seg
	s.walEnd = s.st.applied

	// Spares first, then the old segments, up to maxSpares; remove the rest.
	for _, name := range spares {
		if n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(name, sparePrefix), ".wal"), 16, 64); err == nil {
			s.st.spareSeq = max(s.st.spareSeq, n)
		}
	}
	for _, name := range spares {
		s.keepOrRemove(filepath.Join(s.walDir, name))
	}
	for _, no := range segs {
		if err := s.freeSegment(filepath.Join(s.walDir, segName(no))); err != nil {
			return fmt.Errorf("wal: %w", err)
		}
	}

	return s.db.View(func(tx *bolt.Tx) error {
		for _, l := range s.lanes {
			l.next, l.aNext, l.readSeq = l.cold.nextSeq, l.cold.nextSeq, l.cold.nextSeq
			if k, _ := tx.Bucket(l.qname).Cursor().First(); k != nil {
				l.readSeq = binary.BigEndian.Uint64(k)
			}
		}
		return nil
	})
}

// keepOrRemove keeps the spare file at path for the WAL writer when there
// is room and it has the standard size, and removes it otherwise.
func (s *Spool) keepOrRemove(path string) {
	if fi, err := os.Stat(path); err == nil && fi.Size() == s.cfg.segBytes() && len(s.spares) < cap(s.spares) {
		s.spares <- path
		return
	}
	if err := removeIfExists(path); err != nil {
		s.log.Warn("spool: remove spare WAL file", zap.Error(err))
	}
}

// replayer gathers the records read back from the WAL until apply commits
// them.
type replayer struct {
	s     *Spool
	byID  map[uint64]*Lane
	pos   walPos // how far the committed transactions got
	puts  []replayChunk
	at    map[laneSeq]int // index in puts
	dels  []ackOp
	bytes int64

	chunks, acks int // totals, for the log
}

type laneSeq struct{ lane, seq uint64 }

type replayChunk struct {
	l        *Lane
	seq      uint64
	accepted int64
	records  int
	v        []byte // aliases the segment's bytes; nil once acknowledged
}

func (r *replayer) add(rec walRecord) {
	switch rec.typ {
	case recChunk:
		l := r.byID[rec.lane]
		if l == nil {
			r.s.log.Error("spool: WAL record of an unknown lane; skipped",
				zap.Uint64("lane", rec.lane), zap.Uint64("seq", rec.seq))
			return
		}
		acc, n, err := chunkHeader(rec.payload)
		if err != nil {
			r.s.log.Error("spool: WAL chunk does not decode; skipped",
				zap.String("lane", l.label), zap.Uint64("seq", rec.seq), zap.Error(err))
			return
		}
		if r.at == nil {
			r.at = make(map[laneSeq]int)
		}
		r.at[laneSeq{rec.lane, rec.seq}] = len(r.puts)
		r.puts = append(r.puts, replayChunk{l, rec.seq, acc, n, rec.payload})
		r.bytes += int64(len(rec.payload))
		r.chunks++
	case recAcks:
		for p := rec.payload; len(p) >= ackEntryLen; p = p[ackEntryLen:] {
			k := laneSeq{binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:])}
			r.acks++
			if i, ok := r.at[k]; ok {
				r.bytes -= int64(len(r.puts[i].v))
				r.puts[i].v = nil
				delete(r.at, k)
				continue
			}
			if l := r.byID[k.lane]; l != nil {
				r.dels = append(r.dels, ackOp{l, k.seq})
			}
		}
	}
}

// apply commits what was gathered and the position pos.
func (r *replayer) apply(pos walPos) error {
	s := r.s
	if len(r.puts) == 0 && len(r.dels) == 0 && pos == s.st.applied {
		return nil
	}
	live := s.st.live
	// Keep the freelist on disk: a relay killed again before the store
	// writes it (idleFreelist) would otherwise have the next Open check
	// every page of the file.
	s.db.NoFreelistSync = false
	defer func() { s.db.NoFreelistSync = true }()
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, a := range r.dels {
			n, err := s.txDelete(tx, a.lane, a.seq)
			if err != nil {
				return err
			}
			live -= int64(n)
		}
		for _, c := range r.puts {
			if c.v == nil {
				continue
			}
			if err := s.txPut(tx, c.l, c.seq, c.accepted, c.records, c.v); err != nil {
				return err
			}
			live += int64(len(c.v))
		}
		if err := s.txLanes(tx); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keyWAL, pos.encode())
	})
	if err != nil {
		for _, l := range s.st.touched {
			l.w, l.wOldest = l.cold, l.coldOldest
			l.wTouched, l.wOldStale = false, false
		}
		clear(s.st.touched)
		s.st.touched = s.st.touched[:0]
		return fmt.Errorf("wal replay: %w", err)
	}
	for _, l := range s.st.touched {
		l.cold, l.coldOldest = l.w, l.wOldest
		l.wTouched, l.wOldStale = false, false
	}
	clear(s.st.touched)
	s.st.touched = s.st.touched[:0]
	s.st.applied, r.pos = pos, pos
	s.st.live = live
	s.coldLive.Store(live)
	clear(r.puts)
	r.puts = r.puts[:0]
	clear(r.at)
	r.dels = r.dels[:0]
	r.bytes = 0
	return nil
}
