// Package sim is the relay's simulated upstream: a real HTTP server that
// answers the upstream API's routes by the rules of ../shared/api/, keeps
// what it ingested in memory for tests to read, and lets tests inject faults.
// The relay's sandbox mode, its tests and bench/ all use it.
package sim

import (
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"
)

// Config configures a Sim. Zero values mean the upstream's documented rules.
type Config struct {
	// EPSThreshold is the per-device and per-user events/s limit; 0 means 30.
	EPSThreshold int
	// RateWindow is the window the rate is averaged over; 0 means 10s.
	RateWindow time.Duration
	// DedupWindow is how long an insert_id is remembered per device; 0 means 7 days.
	DedupWindow time.Duration
	// MaxBodyBytes is the 413 limit; 0 means 1 MB (1,000,000 bytes... see the doc).
	MaxBodyBytes int
	// CountOnly makes /2/httpapi answer 200 after counting events, without
	// validating or storing them (the peak-rate benchmark sink).
	CountOnly bool
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Sim is a simulated upstream. Create it with New; serve it with Serve.
type Sim struct{}

// New returns a simulator. log may be nil.
func New(cfg Config, log *zap.Logger) *Sim { panic("unimplemented") }

// Handler returns the simulator's routes, including its control routes
// under /sim/ (read what was ingested, inject faults) for black-box tests.
func (s *Sim) Handler() http.Handler { panic("unimplemented") }

// Serve serves on ln until Close.
func (s *Sim) Serve(ln net.Listener) error { panic("unimplemented") }

// Close stops serving.
func (s *Sim) Close() error { panic("unimplemented") }
