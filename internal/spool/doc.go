// Package spool is the relay's durable queue: one bbolt file holding, per
// lane, an ordered queue of chunks, plus a dead-letter store.
//
// A lane is one upstream destination (LaneKey: kind, api_key, options). A
// chunk is the group of records one Append wrote to a lane; a record is one
// event (or group identify, or mapping) with its ordering ids.
//
// Durability: Append returns only after the chunk is committed; under
// SyncAlways the commit is fdatasync'ed, under SyncNone it has reached the OS
// (it survives a crash of the process, not of the machine). Every commit is
// made by one writer goroutine that gathers every operation queued while the
// previous commit ran (group commit): many concurrent Appends share one fsync,
// and a lone Append never waits for a timer.
//
// Order: chunks of a lane are read back in Append order (sequence numbers
// increase by one per chunk within a lane). Each lane has one reader cursor
// (Lane.Next); it starts at the lane's oldest chunk when the spool opens, so
// chunks that were read but not acknowledged before a crash are read again.
//
// Removal: Ack queues a chunk's deletion; it rides in the next commit and
// nobody waits for it. A chunk acknowledged but not yet committed when the
// process dies is delivered again (the upstream dedups by insert_id).
// PutDead commits dead letters before it returns, so a caller that dead-letters
// some records of a chunk and then acks the chunk never loses them.
//
// Space: Append fails with ErrFull when the live bytes would pass
// Config.MaxBytes, and with ErrDiskLow when the filesystem's free space is
// under Config.MinFreeBytes; nothing of a failed Append is written. bbolt files
// never shrink, so when the live data is small next to the file, the writer
// compacts it into a new file and swaps it in (see compact.go).
//
// Goroutines: Open starts the writer goroutine; Close stops it after the
// queued operations are committed. All methods are safe for concurrent use,
// except that each Lane has a single reader (Next).
package spool
