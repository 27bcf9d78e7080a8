package spool

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// keyUpstream (in meta) is the identity of the upstream the spool's records
// were accepted for: the relay refuses another while records wait.
var keyUpstream = []byte("upstream")

// SetUpstream stores, durably, the identity of the upstream the spool's
// records are accepted for (Stats().Upstream, after a restart too).
func (s *Spool) SetUpstream(id string) error {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		return ErrClosed
	}
	err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyUpstream, []byte(id)) })
	if err != nil {
		return fmt.Errorf("store spool upstream: %w", err)
	}
	s.upstream.Store(&id)
	return nil
}
