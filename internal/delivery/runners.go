package delivery

import (
	"fmt"
	"sync"
)

// Runners is a fleet-mode delivery's lane runners by id (made per lane and
// partition by DeliverPartition's Start), for the lane control and the
// metrics. The zero value is empty; its lock is never held across a call
// out.
type Runners[R comparable] struct {
	mu sync.Mutex
	m  map[uint64]R
}

// Add records r under id.
func (s *Runners[R]) Add(id uint64, r R) {
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[uint64]R)
	}
	s.m[id] = r
	s.mu.Unlock()
}

// Remove forgets id if it is still r.
func (s *Runners[R]) Remove(id uint64, r R) {
	s.mu.Lock()
	if s.m[id] == r {
		delete(s.m, id)
	}
	s.mu.Unlock()
}

// Get returns the runner of id (the zero R when unknown).
func (s *Runners[R]) Get(id uint64) R {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[id]
}

// All returns every runner, in no order.
func (s *Runners[R]) All() []R {
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := make([]R, 0, len(s.m))
	for _, r := range s.m {
		rs = append(rs, r)
	}
	return rs
}

// Control calls f with the runner of id, or fails wrapping ErrUnknownLane.
func (s *Runners[R]) Control(id uint64, f func(R)) error {
	s.mu.Lock()
	r, ok := s.m[id]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("delivery: lane %d: %w", id, ErrUnknownLane)
	}
	f(r)
	return nil
}
