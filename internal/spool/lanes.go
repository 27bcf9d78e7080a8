package spool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
)

// Lane limits and retirement: every lane costs a lane record and a queue
// bucket, a Lane in memory, deliverer goroutines and metric series. The
// store retires an empty lane idle for RetireIdle (not pinned): forgotten,
// its record and bucket deleted, its reader answered storage.ErrRetired; an
// Append through it goes to the live lane of its key. Retirement and Append
// exclude each other through two atomics (the lane's retired flag, its
// Appends in progress), each side setting its own and then reading the
// other's. An idle lane's reader may end (storage.ErrIdle) to be started
// again at its next record (whenWork): an idle lane costs no goroutine.

// ErrTooManyLanes is returned by Spool.Lane (and by Append to a retired
// lane) when Config.MaxLanes lanes exist and the key names none of them.
var ErrTooManyLanes = errors.New("spool: too many lanes")

// ErrTooManyKeyLanes is returned where ErrTooManyLanes is when
// Config.MaxLanesPerKey lanes of the key's api_key exist. It wraps
// ErrTooManyLanes.
var ErrTooManyKeyLanes = fmt.Errorf("%w of one api_key", ErrTooManyLanes)

// retireEvery is how often the store looks for lanes to retire.
func (c Config) retireEvery() time.Duration {
	return min(max(c.RetireIdle/4, 10*time.Millisecond), time.Minute)
}

// IsRetired reports whether the lane was retired.
func (l *Lane) IsRetired() bool { return l.retired.Load() }

// Pin keeps the lane from being retired until as many Unpin calls (a
// stopped lane keeps its stop while empty).
func (l *Lane) Pin() { l.pins.Add(1) }

// Unpin undoes one Pin.
func (l *Lane) Unpin() { l.pins.Add(-1) }

// SetLaneLimits puts new lane limits (as Config's) in force; a lowered
// bound refuses new lanes only.
func (s *Spool) SetLaneLimits(maxLanes, maxLanesPerKey int, retireIdle time.Duration) {
	c := s.cfg
	c.MaxLanes, c.MaxLanesPerKey, c.RetireIdle = maxLanes, maxLanesPerKey, retireIdle
	s.laneCfg.Store(&c)
	wake(s.storeWake) // it may wait on the old idle time
}

// lanesFrom returns the lanes whose ID is at least id, oldest first, and a
// channel closed when the next lane is created: a caller learns of new
// lanes in time proportional to their number, not to every lane's.
func (s *Spool) lanesFrom(id uint64) ([]*Lane, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.lanes), func(i int) bool { return s.lanes[i].id >= id })
	if i == len(s.lanes) {
		return nil, s.lanesCh
	}
	return append([]*Lane(nil), s.lanes[i:]...), s.lanesCh
}

// refuseLaneLocked returns why a new lane of apiKey may not be created,
// counting those of created too, or nil. s.mu held.
func (s *Spool) refuseLaneLocked(apiKey string, created []*Lane) error {
	lc := s.laneCfg.Load()
	if m := lc.MaxLanes; m > 0 && len(s.lanes)+len(created) >= m {
		return ErrTooManyLanes
	}
	if m := lc.MaxLanesPerKey; m > 0 {
		n := s.byKey.count(apiKey)
		for _, l := range created {
			if l.key.APIKey == apiKey {
				n++
			}
		}
		if n >= m {
			return ErrTooManyKeyLanes
		}
	}
	return nil
}

// laneIndex finds the live lanes (Spool.lanes') by api_key, then kind and
// options: from a request's bytes without an allocation (Backend.Append), and
// counted per api_key. Its lock is taken alone or last.
type laneIndex struct {
	mu sync.RWMutex
	m  map[string][]*Lane
	// peak is len(m)'s largest since m was made: a map keeps that room,
	// so remove makes a smaller one when most of it is gone.
	peak int
}

func (x *laneIndex) add(l *Lane) {
	x.mu.Lock()
	if x.m == nil {
		x.m = make(map[string][]*Lane)
	}
	x.m[l.key.APIKey] = append(x.m[l.key.APIKey], l)
	x.peak = max(x.peak, len(x.m))
	x.mu.Unlock()
}

func (x *laneIndex) remove(l *Lane) {
	x.mu.Lock()
	ls := x.m[l.key.APIKey]
	if i := slices.Index(ls, l); i >= 0 {
		ls = slices.Delete(ls, i, i+1)
	}
	if len(ls) == 0 {
		delete(x.m, l.key.APIKey)
		if x.peak >= 1024 && len(x.m) < x.peak/4 {
			m := make(map[string][]*Lane, len(x.m)) // maps.Clone would keep the room
			maps.Copy(m, x.m)
			x.m, x.peak = m, len(m)
		}
	} else {
		x.m[l.key.APIKey] = ls
	}
	x.mu.Unlock()
}

// get is the live lane of k, nil when none.
func (x *laneIndex) get(k storage.LaneKey) *Lane { return findLane(x, k.Kind, k.APIKey, k.Options) }

// findLane is get from a key's parts, strings or bytes.
func findLane[T string | []byte](x *laneIndex, kind storage.Kind, apiKey, options T) *Lane {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for _, l := range x.m[string(apiKey)] {
		if l.key.Kind == kind && l.key.Options == string(options) {
			return l
		}
	}
	return nil
}

func (x *laneIndex) count(apiKey string) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.m[apiKey])
}

// beginAppend marks an Append in progress on the lane the records go to
// (l, or the live lane of l's key) and returns it; the caller decrements
// its appending count when done.
func (s *Spool) beginAppend(ctx context.Context, l *Lane) (*Lane, error) {
	for {
		l.appending.Add(1)
		if !l.retired.Load() {
			return l, nil
		}
		l.appending.Add(-1)
		nl, err := s.Lane(ctx, l.key)
		if err != nil {
			return nil, err
		}
		l = nl // l itself while a retirement that saw this Append is called off
	}
}

// retireWait is how long an idle store may wait before it looks for lanes
// to retire, -1 when there is none it could.
func (s *Spool) retireWait() time.Duration {
	lc := s.laneCfg.Load()
	if lc.RetireIdle <= 0 {
		return -1
	}
	s.mu.Lock()
	n := len(s.lanes)
	s.mu.Unlock()
	if n == 0 {
		return -1
	}
	return max(time.Until(s.st.lastRetire.Add(lc.retireEvery())), 0)
}

// maybeRetire retires the empty lanes idle for RetireIdle, at most every
// retireEvery. Store goroutine only.
func (s *Spool) maybeRetire(now time.Time) {
	// Draining, a lane whose chunks are all in the WAL looks empty.
	lc := s.laneCfg.Load()
	if lc.RetireIdle <= 0 || now.Sub(s.st.lastRetire) < lc.retireEvery() || s.draining.Load() {
		return
	}
	s.st.lastRetire = now
	cutoff := now.Add(-lc.RetireIdle).UnixMilli()
	var gone []*Lane
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.lanes = slices.DeleteFunc(s.lanes, func(l *Lane) bool {
		if l.lastUse.Load() > cutoff || !s.retireLocked(l) {
			return false
		}
		gone = append(gone, l)
		s.byKey.remove(l)
		return true
	})
	if len(gone) > 0 {
		// Settled, and not to stay reachable.
		s.dirty = slices.DeleteFunc(s.dirty, (*Lane).IsRetired)
	}
	s.mu.Unlock()
	if len(gone) == 0 {
		return
	}
	for _, l := range gone {
		close(l.retiredC)
		l.mu.Lock()
		l.wakeLocked() // its reader sees storage.ErrRetired
		l.mu.Unlock()
	}
	if err := s.deleteLanes(gone); err != nil {
		// Their empty records are loaded, and retired again, at next Open.
		s.log.Warn("spool: delete retired lanes", zap.Int("lanes", len(gone)), zap.Error(err))
	}
	s.log.Debug("spool: retired idle empty lanes", zap.Int("lanes", len(gone)))
}

// retireLocked retires l if it is empty and no Append to it is in
// progress. s.mu held, store goroutine (which alone writes l.cold).
func (s *Spool) retireLocked(l *Lane) bool {
	l.mu.Lock()
	empty := l.cold.chunks == 0 && l.hot.len() == 0 && l.next == l.cold.nextSeq && !l.wTouched
	l.mu.Unlock()
	if !empty || l.pins.Load() > 0 {
		return false
	}
	l.retired.Store(true)
	// Every later Append sees the flag; one in progress, or one that
	// published since the check above (counted in appending until then),
	// calls it off.
	l.mu.Lock()
	empty = l.appending.Load() == 0 && l.hot.len() == 0 && l.next == l.cold.nextSeq
	l.mu.Unlock()
	if !empty {
		l.retired.Store(false)
	}
	return empty
}

// deleteLanes deletes the lane records and queue buckets of retired lanes.
func (s *Spool) deleteLanes(ls []*Lane) error {
	if s.db == nil {
		return errors.New("spool file is not open")
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		lanes := tx.Bucket(bucketLanes)
		for _, l := range ls {
			if err := lanes.Delete(seqKey(l.id)); err != nil {
				return err
			}
			if err := tx.DeleteBucket(l.qname); err != nil && !errors.Is(err, berrors.ErrBucketNotFound) {
				return err
			}
		}
		return nil
	})
}

// markDirtyLocked adds the lanes of the published (or skipped) appends to
// those the next checkpoint looks at: it costs the lanes that changed, not
// every lane. s.mu held.
func (s *Spool) markDirtyLocked(ops []*op) {
	for _, o := range ops {
		if o.seq == 0 || o.lane.dirty {
			continue
		}
		o.lane.dirty = true
		s.dirty = append(s.dirty, o.lane)
	}
}

// pruneDirty drops from the dirty lanes those a checkpoint settled. Store
// goroutine only.
func (s *Spool) pruneDirty() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dirty = slices.DeleteFunc(s.dirty, func(l *Lane) bool {
		l.mu.Lock()
		l.dirty = l.hot.len() > 0 || l.next != l.cold.nextSeq
		l.mu.Unlock()
		return !l.dirty
	})
}
