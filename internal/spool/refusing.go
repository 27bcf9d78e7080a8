package spool

import (
	"errors"
	"fmt"
	"syscall"
)

// refuseMargin is the room under the hot memory's hard bound (twice
// hotMaxBytes) below which refusing says appends are refused while
// checkpoints fail: Append refuses a chunk that does not fit, so with less
// than this left it refuses most requests (1 MiB: about the largest body
// the upstream takes). A bound under 4 MiB (tests) keeps a quarter of it.
const refuseMargin = 1 << 20

// refusing returns why Append refuses chunks now, nil when it takes them
// (Stats().Refusing).
// The reasons:
//   - the spool is draining (drain.go; ErrDiskLow);
//   - checkpoints fail (a full disk, an I/O error on spool.db) and the
//     memory of the chunks they could not move into bbolt is within
//     refuseMargin of its hard bound (ErrFull). While it is nil a
//     chunk of up to refuseMargin is taken; larger ones may be refused a
//     little before it says so;
//   - the WAL's last new segment could not be made for want of space, and
//     the filesystem still has less free than a segment and no spare file
//     waits (Append fails with the write's error).
//
// It clears by itself, with or without appends: the store retries
// checkpoints every checkpoint interval, delivery's acknowledgements free
// memory, and free space is measured at each call. The quota
// (Config.MaxBytes) and the disk reserve (Config.MinFreeBytes) are the
// caller's to compare (Stats().LiveBytes, the filesystem's free space). It
// reads atomics (and, after a segment failed for want of space, the
// filesystem's free space) and takes no lock: cheap, from any goroutine (a
// readiness probe, a metrics collector).
func (s *Spool) refusing() error {
	if s.draining.Load() {
		return errors.New("spool draining: no space left on the data dir's filesystem to replay the write-ahead log; delivering what spool.db holds")
	}
	if err := s.walRefusing(); err != nil {
		return err
	}
	if !s.ckptFailed.Load() {
		return nil
	}
	hard := 2 * s.cfg.hotMaxBytes
	held := s.hotHeld.Load()
	if held <= hard-min(refuseMargin, hard/4) {
		return nil
	}
	cause := "unknown error"
	if p := s.ckptErr.Load(); p != nil {
		cause = *p
	}
	return fmt.Errorf("spool checkpoints fail (%s) and the write-ahead log's chunks not yet in spool.db hold %d of the %d bytes of memory allowed: appends are refused until a checkpoint succeeds or delivery frees memory", cause, held, hard)
}

// walRefusing is refusing's word on the WAL: non-nil while its last new
// segment could not be made for want of space and the next one would not
// fit either. Once a segment's worth is free (or a spare file waits), the
// next append makes one and clears walNoSpace.
func (s *Spool) walRefusing() error {
	if !s.walNoSpace.Load() || len(s.spares) > 0 {
		return nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.walDir, &st); err != nil {
		return fmt.Errorf("spool: no space was left for a new write-ahead log segment, and the free space of %s is unknown: %w", s.walDir, err)
	}
	free, need := int64(st.Bavail)*int64(st.Bsize), s.cfg.segmentBytes
	if free >= need {
		return nil
	}
	return fmt.Errorf("spool: no space left for a new write-ahead log segment (%d bytes free in %s, %d needed): appends are refused until space is freed", free, s.walDir, need)
}
