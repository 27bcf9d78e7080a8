package spool

import "fmt"

// refuseMargin is the room under the hot memory's hard bound (twice
// HotMaxBytes) below which Refusing says appends are refused while
// checkpoints fail: Append refuses a chunk that does not fit, so with less
// than this left it refuses most requests (1 MiB: about the largest body
// the upstream takes). A bound under 4 MiB (tests) keeps a quarter of it.
const refuseMargin = 1 << 20

// Refusing returns why Append refuses chunks now, nil when it takes them:
// the spool is draining (see Draining; ErrDiskLow), or checkpoints fail (a
// full disk, an I/O error on spool.db) and the memory of the chunks they
// could not move into bbolt is within refuseMargin of its hard bound
// (ErrFull). While it is nil, a chunk of up to refuseMargin is taken;
// larger ones may be refused a little before it says so. It clears by
// itself: the store retries checkpoints every checkpoint interval, and
// delivery's acknowledgements free that memory. The quota (Config.MaxBytes)
// and the disk reserve (Config.MinFreeBytes) are the caller's to compare
// (Stats().LiveBytes, the filesystem's free space). It reads atomics only
// and takes no lock: cheap, from any goroutine (a readiness probe, a
// metrics collector).
func (s *Spool) Refusing() error {
	if err := s.Draining(); err != nil {
		return err
	}
	if !s.ckptFailed.Load() {
		return nil
	}
	hard := 2 * s.cfg.hotMax()
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
