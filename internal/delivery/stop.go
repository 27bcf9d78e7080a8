package delivery

import (
	"sync"
	"sync/atomic"
)

// Pinner keeps a spool lane from being retired while it is pinned: a
// stopped lane stays known even when empty, so that its stop is not lost.
type Pinner interface {
	Pin()
	Unpin()
}

// StopSwitch is a lane's stop state: stopped by an upstream that refuses
// its api_key or URL, or by an operator, and resumed by an operator or a
// restart. The zero value is running; it must not be copied after use.
type StopSwitch struct {
	// Lane, when not nil, is pinned while stopped.
	Lane Pinner

	mu        sync.Mutex
	reason    string
	resumeC   chan struct{} // nil while running; closed on resuming
	isStopped atomic.Bool
}

// Set stops the lane with reason, or resumes it; it reports whether that
// changed its state (a second stop keeps the first reason).
func (s *StopSwitch) Set(stop bool, reason string) bool {
	s.mu.Lock()
	if (s.resumeC != nil) == stop {
		s.mu.Unlock()
		return false
	}
	if stop {
		s.reason, s.resumeC = reason, make(chan struct{})
	} else {
		close(s.resumeC)
		s.reason, s.resumeC = "", nil
	}
	s.isStopped.Store(stop)
	s.mu.Unlock()
	switch {
	case s.Lane == nil:
	case stop:
		s.Lane.Pin()
	default:
		s.Lane.Unpin()
	}
	return true
}

// Stopped reports whether the lane is stopped (an atomic read).
func (s *StopSwitch) Stopped() bool { return s.isStopped.Load() }

// State returns whether the lane is stopped, and why.
func (s *StopSwitch) State() (stopped bool, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resumeC != nil, s.reason
}

// Resumed returns a channel closed when the lane resumes, or nil while it
// runs.
func (s *StopSwitch) Resumed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resumeC
}
