package spool

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// keyUpstream (in meta) is the identity of the upstream the spool's records
// were accepted for (the sandbox guard): the relay refuses to start
// against another one while records wait, unless told to.
var keyUpstream = []byte("upstream")

// SetUpstream stores the identity of the upstream the spool's records are
// accepted for (durably: it is committed before it returns); Stats().Upstream
// reads it, also after a restart (Open loads it).
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
