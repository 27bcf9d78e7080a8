package spool

import (
	"bytes"

	bolt "go.etcd.io/bbolt"
)

// How a lane's queue bucket holds its chunks, under their sequence keys.
//
// bbolt keeps a leaf's values inside the leaf, and splits a leaf only when it
// holds more than four keys: a queue of large chunks has two per leaf, and
// every change to a leaf rewrites it whole. Appending a chunk rewrote its
// neighbour; acknowledging one rewrote the other; a checkpoint that appended
// to the last leaf rewrote what the previous one had written. At 1000-event
// requests bbolt wrote 2.1 times the chunk bytes it was given (7.5 GB for
// 3.5 GB in 8 s), each rewrite copied the neighbour through the mapping
// into a fresh page buffer (file-backed RSS, heap), and the leftovers of
// rewritten leaves fragmented the file (bbolt's freelist index of them
// held 2.3 MB of heap on a 10M-event backlog).
//
// So a chunk of nestMinBytes or more is a bucket of its own, holding the
// chunk under chunkValueKey: its leaf is written once, when the chunk is
// put, and freed whole, without being read, when the chunk is deleted; the
// queue's leaves hold only the 40-byte bucket headers. A smaller chunk is a
// plain value, as before: a bucket of its own would round it up to a page.
// Files written before this (format 2) hold plain values only, and are
// read the same way.
const nestMinBytes = 32 << 10

var chunkValueKey = []byte{0}

// putChunk puts chunk v under k in q, replacing what k held.
func putChunk(q *bolt.Bucket, k, v []byte) error {
	if ck, old := q.Cursor().Seek(k); bytes.Equal(ck, k) {
		if err := deleteChunk(q, k, old == nil); err != nil {
			return err
		}
	}
	if len(v) < nestMinBytes {
		return q.Put(k, v)
	}
	b, err := q.CreateBucket(k)
	if err != nil {
		return err
	}
	b.FillPercent = 1.0
	return b.Put(chunkValueKey, v)
}

// chunkValue is the chunk under k, given what a cursor of q returned for
// it (v is nil for a bucket); nil when k holds none. Valid for the life of
// the transaction.
func chunkValue(q *bolt.Bucket, k, v []byte) []byte {
	if v != nil || k == nil {
		return v
	}
	if b := q.Bucket(k); b != nil {
		return b.Get(chunkValueKey)
	}
	return nil
}

// chunkAt is the chunk under k in q (nil when there is none), and whether
// it is a bucket of its own.
func chunkAt(q *bolt.Bucket, k []byte) (v []byte, nested bool) {
	ck, v := q.Cursor().Seek(k)
	if !bytes.Equal(ck, k) {
		return nil, false
	}
	return chunkValue(q, k, v), v == nil
}

// deleteChunk deletes the chunk under k in q, a bucket of its own when
// nested.
func deleteChunk(q *bolt.Bucket, k []byte, nested bool) error {
	if nested {
		return q.DeleteBucket(k)
	}
	return q.Delete(k)
}
