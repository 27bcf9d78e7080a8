package spool

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	berrors "go.etcd.io/bbolt/errors"
	"go.uber.org/zap"
)

// Draining: a relay killed on a full disk must come back, not crash-loop.
// When Open cannot replay the WAL for want of space, the spool opens
// draining: what bbolt holds is delivered and deleted (freeing pages),
// Append fails with ErrDiskLow, Stats().Refusing says why, nothing is
// written to the WAL and no lane retires. The store tries the replay again
// every drainRetry; once it succeeds, appends are taken again.

// drainRetry is how often a draining spool tries its replay again.
const drainRetry = 5 * time.Second

// noSpace reports whether err is the filesystem (or bbolt's MaxSize) full.
func noSpace(err error) bool {
	return err != nil && (errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, berrors.ErrMaxSizeReached))
}

// startDraining opens the spool draining (Open).
func (s *Spool) startDraining(err error) error {
	s.draining.Store(true)
	s.st.drainErr = err
	s.st.drainTried = time.Now()
	s.st.oldestSeg = s.st.applied.seg
	s.walEnd = s.st.applied
	s.log.Error("spool: no space left to replay the write-ahead log into spool.db; draining: delivering what spool.db holds, refusing new records, retrying the replay every 5s",
		zap.String("dir", s.cfg.Dir), zap.Error(err))
	return s.placeReaders()
}

// retryReplay tries a deferred replay again (the store's).
func (s *Spool) retryReplay(now time.Time) {
	if !s.draining.Load() || now.Sub(s.st.drainTried) < s.cfg.drainEvery || s.db == nil {
		return
	}
	s.st.drainTried = now
	err := guard(func() error {
		return s.replay(true)
	})
	switch {
	case err == nil:
		s.coldLive.Store(s.st.live)
		s.appliedTotal.Store(0)
		s.mu.Lock()
		s.walTotal = 0
		s.mu.Unlock()
		s.draining.Store(false)
		s.log.Info("spool: the write-ahead log is replayed; draining is over, appends are taken again")
	case noSpace(err):
		if err.Error() != s.st.drainErr.Error() {
			s.log.Warn("spool: the replay still lacks space; still draining", zap.Error(err))
		}
		s.st.drainErr = err
	default:
		s.st.drainErr = err
		s.log.Error("spool: the deferred replay failed; still draining", zap.Error(fmt.Errorf("wal replay: %w", err)))
	}
	if d := s.st.damaged - s.st.damagedCounted; d > 0 && s.m != nil {
		s.m.damagedWAL.Add(float64(d))
		s.st.damagedCounted = s.st.damaged
	}
}
