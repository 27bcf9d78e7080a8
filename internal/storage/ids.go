package storage

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync/atomic"
)

// IDs makes Request.IDs unique across relays and restarts within the
// store's deduplication window: a random prefix per IDs and a counter. The
// id is what lets the store absorb its own retried appends. Safe for
// concurrent use.
type IDs struct {
	prefix string
	n      atomic.Uint64
}

// NewIDs returns an IDs with a fresh random prefix.
func NewIDs() (*IDs, error) {
	var b [9]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("storage: request id prefix: %w", err)
	}
	return &IDs{prefix: hex.EncodeToString(b[:]) + "-"}, nil
}

// Next returns a fresh id (at most 32 bytes).
func (ids *IDs) Next() string {
	return ids.prefix + strconv.FormatUint(ids.n.Add(1), 36)
}
