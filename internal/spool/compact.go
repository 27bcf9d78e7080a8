package spool

// Compaction gives disk space back: bbolt never shrinks its file, and a
// drained backlog leaves it as large as the largest backlog. After a
// checkpoint the store compacts when
//
//	high-water mark >= Config.CompactMinFileBytes (default 4 MiB), and
//	pages in use <= compactPercent (default 25) % of the high-water mark, and
//	pages in use <= compactMaxUsed (16 MiB).
//
// Checkpoints wait for a compaction (~57 ms for 1.3 MB live, 2.6 s for
// 120 MB here), hence the last bound: a file keeps its peak size while more
// stays live. A compacted file is dense, so the rule fires again only after
// the data grew fourfold and drained.
//
// bbolt.Compact copies every bucket into spool.db.compact (one fdatasync),
// then, with readers held off (dbMu), the copy is renamed over spool.db, the
// directory fsync'ed and the file reopened. A crash leaves the old or the
// new file complete; Open removes a leftover copy. A failed compaction is
// retried after a minute.

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"
)

const (
	compactMaxUsed    = 16 << 20
	compactRetryAfter = time.Minute
)

func (s *Spool) maybeCompact() {
	min := s.cfg.CompactMinFileBytes
	if min < 0 || s.db == nil || s.fileBytes.Load() < min {
		return
	}
	var hw int64
	if err := s.db.View(func(tx *bolt.Tx) error { hw = tx.Size(); return nil }); err != nil {
		return
	}
	used := hw - int64(s.db.Stats().FreeAlloc)
	if hw < min || used*100 > hw*int64(s.cfg.compactPercent) || used > compactMaxUsed {
		return
	}
	file := s.fileBytes.Load()
	if time.Since(s.st.compactFailed) < compactRetryAfter { // never failed: the zero time, long ago
		return
	}
	start := time.Now()
	if err := s.compact(); err != nil {
		s.st.compactFailed = time.Now()
		s.log.Error("spool compaction failed", zap.Error(err))
		return
	}
	s.updateFileBytes()
	s.m.compactions.Inc()
	s.log.Info("spool compacted",
		zap.Int64("file_bytes_before", file), zap.Int64("file_bytes_after", s.fileBytes.Load()),
		zap.Int64("live_bytes", s.st.live), zap.Duration("took", time.Since(start)))
}

// compact copies the file and swaps the copy in. On error the old file stays
// in use, unless reopening failed: then s.db is nil and commits fail.
func (s *Spool) compact() error {
	tmp := s.path + ".compact"
	if err := removeIfExists(tmp); err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	dst, err := bolt.Open(tmp, 0o600, &bolt.Options{
		NoSync:         true,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	// A damaged page of the old file fails the compaction, not the process.
	if err = cmp.Or(guard(func() error { return bolt.Compact(dst, s.db, 64<<20) }), dst.Sync(), dst.Close()); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("compact: %w", err)
	}

	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if err := s.db.Close(); err != nil {
		s.log.Warn("spool: close before compaction swap", zap.Error(err))
	}
	s.db = nil
	renameErr := cmp.Or(os.Rename(tmp, s.path), syncDir(filepath.Dir(s.path)))
	db, err := s.openDB()
	if err != nil {
		return fmt.Errorf("compact: reopen: %w", err)
	}
	s.db = db
	if renameErr != nil {
		os.Remove(tmp)
		return fmt.Errorf("compact: swap: %w", renameErr)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return cmp.Or(d.Sync(), d.Close())
}
