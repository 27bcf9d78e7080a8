// Package spool is the relay's durable queue: one bbolt file holding, per
// lane, an ordered queue of chunks, plus a dead-letter store.
//
// A lane is one upstream destination (LaneKey: kind, api_key, options). A
// chunk is the group of records one Append wrote to a lane; a record is one
// event (or group identify, or mapping) with its ordering ids.
//
// # File
//
// Dir/spool.db is a bbolt file with a map freelist. The freelist is written
// by every commit while it is small next to what the commit writes
// (keepFreelist) and by Close; otherwise (while a large backlog drains)
// commits skip it and the next Open rebuilds it by checking every page of the file (about 1 s per 5 GB here),
// so that a restart with a backlog on disk, clean or after a crash, is
// usually a read of a few pages. The mapping's pages are advised (see
// advise.go): read-ahead for what a reader is about to copy, and dropped
// from the RSS once read. Buckets:
//
//	meta    format version; dead-letter count and bytes
//	lanes   8-byte big-endian lane id -> LaneKey + next seq and the live
//	        chunks, records and bytes of the lane (updated in every commit
//	        that touches the lane, so Open never scans a queue)
//	q<id>   one per lane: 8-byte big-endian seq -> encoded chunk
//	dead    8-byte big-endian id -> encoded dead letter
//
// The value encodings are in encode.go; each starts with a version byte.
// Another process opening the same Dir fails after about half a second with
// ErrLocked.
//
// # Durability
//
// Append returns only after the chunk is committed; under SyncAlways the
// commit is fdatasync'ed (bbolt: two fdatasyncs per commit, data then meta),
// under SyncNone it has reached the OS (it survives a crash of the process,
// not of the machine). Every commit is made by one writer goroutine that
// gathers every operation queued while the previous commit ran, up to
// Config.MaxCommitBytes of chunks (group commit): many concurrent Appends
// share one fsync, and a lone Append never waits for a timer. A chunk is
// written from the caller's Batch without a copy (Append's caller waits).
//
// Nothing is half-written: a refused Append (ErrFull, ErrDiskLow) is skipped
// inside the commit and does not fail its neighbours; a failed commit (e.g.
// ENOSPC) rolls the whole transaction back, fails every Append, Lane,
// PutDead and DeleteDead of it, keeps its acks for the next commit (started
// by the next Append or Ack, so a failing disk does not make the writer
// spin), and the spool goes on working with the next commit.
//
// # Order
//
// Chunks of a lane are read back in Append order: sequence numbers start at 1
// and increase by one per chunk within a lane, never reused (the next seq is
// stored with the lane). Each lane has one reader cursor (Lane.Next); it
// starts at the lane's oldest live chunk when the spool opens, so chunks that
// were read but not acknowledged before a crash are read again. Next reads
// only committed chunks, through a short read transaction, and copies them
// (one buffer per chunk; the records alias it).
//
// # Removal
//
// Ack queues a chunk's deletion; it rides in the next commit (an ack alone
// also wakes the writer) and nobody waits for it. A chunk acknowledged but
// not yet committed when the process dies is delivered again (the upstream
// dedups by insert_id). PutDead commits dead letters before it returns, so a
// caller that dead-letters some records of a chunk and then acks the chunk
// never loses them. Dead-letter ids increase and are never reused.
//
// # Space
//
// Append fails with ErrFull when the live bytes (encoded chunk sizes, as in
// Chunk.Size) would pass Config.MaxBytes, and with ErrDiskLow when the
// filesystem's free space (statfs, cached for 500ms, minus the bytes appended
// since) minus the chunk is under Config.MinFreeBytes. Acks of a commit are
// applied before its appends, so space they free serves the same commit.
// Dead letters, lanes and deletions are never refused for space. bbolt files
// never shrink, so when the live data is small next to the file, the writer
// compacts it into a new file and swaps it in (see compact.go).
//
// # Goroutines and locks
//
// Open starts the writer goroutine; Close stops it after the queued
// operations are committed, then closes the file. All methods are safe for
// concurrent use, except that each Lane has a single reader (Next).
//
// Locks: Spool.mu (the queue of operations, the lanes), Lane.mu (a lane's
// committed counters and its notification channel) and Spool.dbMu (the
// *bolt.DB: shared for read transactions, exclusive only for the compaction
// swap and Close). No two of them are ever held at once. The writer alone
// changes the file and the counters; it publishes them after each commit.
package spool
