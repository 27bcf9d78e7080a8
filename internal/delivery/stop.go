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
	resumeC   chan struct{} // nil while running; closed by Resume
	isStopped atomic.Bool
}

// Stop stops the lane with reason; it reports whether it was running (a
// second Stop keeps the first reason).
func (s *StopSwitch) Stop(reason string) bool {
	s.mu.Lock()
	if s.resumeC != nil {
		s.mu.Unlock()
		return false
	}
	s.reason, s.resumeC = reason, make(chan struct{})
	s.isStopped.Store(true)
	s.mu.Unlock()
	if s.Lane != nil {
		s.Lane.Pin()
	}
	return true
}

// Resume resumes the lane; it reports whether it was stopped.
func (s *StopSwitch) Resume() bool {
	s.mu.Lock()
	if s.resumeC == nil {
		s.mu.Unlock()
		return false
	}
	close(s.resumeC)
	s.reason, s.resumeC = "", nil
	s.isStopped.Store(false)
	s.mu.Unlock()
	if s.Lane != nil {
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
