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

// refusing is Stats().Refusing: draining (drain.go); checkpoints failing
// (a full disk, an I/O error on spool.db) while the hot chunks' memory is
// within refuseMargin of its hard bound (a chunk of up to refuseMargin is
// taken while it is nil); the last new WAL segment not made for want of
// space, while a segment's worth is still not free and no spare waits. It
// clears by itself: checkpoints are retried, acks free memory, free space
// is measured at each call. It takes no lock.
func (s *Spool) refusing() error {
	if s.draining.Load() {
		return errors.New("spool draining: no space left on the data dir's filesystem to replay the write-ahead log; delivering what spool.db holds")
	}
	if s.walNoSpace.Load() && len(s.spares) == 0 {
		// The next append that finds a segment's worth free makes one
		// and clears walNoSpace.
		var st syscall.Statfs_t
		if err := syscall.Statfs(s.walDir, &st); err != nil {
			return fmt.Errorf("spool: no space was left for a new write-ahead log segment, and the free space of %s is unknown: %w", s.walDir, err)
		}
		if free, need := int64(st.Bavail)*int64(st.Bsize), s.cfg.segmentBytes; free < need {
			return fmt.Errorf("spool: no space left for a new write-ahead log segment (%d bytes free in %s, %d needed): appends are refused until space is freed", free, s.walDir, need)
		}
	}
	cause := s.ckptErr.Load()
	hard := 2 * s.cfg.hotMaxBytes
	held := s.hotHeld.Load()
	if cause == nil || held <= hard-min(refuseMargin, hard/4) {
		return nil
	}
	return fmt.Errorf("spool checkpoints fail (%s) and the write-ahead log's chunks not yet in spool.db hold %d of the %d bytes of memory allowed: appends are refused until a checkpoint succeeds or delivery frees memory", *cause, held, hard)
}
