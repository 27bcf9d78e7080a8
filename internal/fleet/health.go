package fleet

import (
	"context"
	"fmt"

	"github.com/svcrelay/relay/internal/spool"
)

// Writable reports whether the events stream can take an append now: nil
// when its leader answers with a quorum of its replicas (itself included)
// current, ErrUnavailable otherwise (no leader, no answer before ctx ends,
// too few replicas). It is one request; a readiness check should bound ctx
// tightly (an append without a quorum waits PublishTimeout for its error).
func (f *Fleet) Writable(ctx context.Context) error {
	name := f.n.stream(spool.KindEvents)
	s, err := f.js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("fleet: stream %s: %w: %w", name, ErrUnavailable, err)
	}
	info := s.CachedInfo()
	if info == nil || info.Cluster == nil {
		return nil // a single server: it answered
	}
	c := info.Cluster
	if c.Leader == "" {
		return fmt.Errorf("fleet: stream %s has no leader: %w", name, ErrUnavailable)
	}
	current, size := 1, 1+len(c.Replicas)
	for _, r := range c.Replicas {
		if r.Current && !r.Offline {
			current++
		}
	}
	if current < size/2+1 {
		return fmt.Errorf("fleet: stream %s: %d of %d replicas current, no quorum: %w", name, current, size, ErrUnavailable)
	}
	return nil
}
