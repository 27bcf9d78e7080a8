package spool

import (
	"bytes"

	bolt "go.etcd.io/bbolt"
)

// How a lane's queue bucket holds its chunks, under their seq keys.
//
// bbolt keeps values inside their leaf and splits a leaf only past four
// keys: a queue of large chunks has two per leaf, and every change
// rewrites the neighbour too. At 1000-event requests bbolt wrote 2.1 times
// the chunk bytes it was given, through the mapping into fresh buffers,
// and the leftovers fragmented the file. So a chunk of nestMinBytes or more
// is a bucket of its own, holding it under chunkValueKey: written once, and
// freed whole without being read. A smaller one is a plain value (a bucket
// would round it up to a page), as every chunk of a format 2 file is.
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

// chunkValue is the chunk under k, given what a cursor of q returned for it
// (v is nil for a bucket); nil when none.
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
