package spool

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// keyUpstream (in meta) is the identity of the upstream the spool's records
// were accepted for (issue 18's sandbox guard): the relay refuses to start
// against another one while records wait, unless told to.
var keyUpstream = []byte("upstream")

// Upstream returns the upstream identity stored by SetUpstream, "" when
// none was (a spool made before the guard, or never started).
func (s *Spool) Upstream() (string, error) {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		return "", ErrClosed
	}
	var id string
	err := s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketMeta); b != nil {
			id = string(b.Get(keyUpstream))
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("read spool upstream: %w", err)
	}
	return id, nil
}

// SetUpstream stores the identity of the upstream the spool's records are
// accepted for (durably: it is committed before it returns).
func (s *Spool) SetUpstream(id string) error {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		return ErrClosed
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		return b.Put(keyUpstream, []byte(id))
	})
	if err != nil {
		return fmt.Errorf("store spool upstream: %w", err)
	}
	return nil
}
