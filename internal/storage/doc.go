// Package storage is the seam between the relay's accepting and delivering
// sides and the store that keeps records in between: the ingest appends a
// request's records (Appender), the delivery engine is handed ordered
// queues to read and acknowledge (Owner, Reader) and stores what will not
// be delivered (DeadLetters). Two backends implement it: the local spool
// (internal/spool, a WAL in front of bbolt, spool.Backend) and the
// fleet's spool on a NATS JetStream cluster (internal/fleet, Fleet.Backend).
// storagetest is the conformance suite both pass.
//
// The seam is written in its own types: what is stored (Record, LaneKey,
// Kind, DeadLetter, DeadFilter), the Batch a request's records are encoded
// into (its pooled buffer, Buf, is what the local spool keeps without a
// copy), the request and the message around them. Neither backend imports
// the other, and storage imports neither (TestImports).
//
// # Invariants
//
// Every backend keeps these; storagetest checks each of them.
//
//   - Durable when acknowledged: Append returns nil only once every record
//     of the request is durable (local: in the fsynced WAL; fleet: on a
//     quorum of the cluster), and a record appended is read back, after any
//     number of restarts, until a Reader acknowledged its message.
//   - All or nothing: a request is stored whole or not at all. A failed
//     Append returns an error for which errors.Is(err, ErrFull) (refused
//     for space; nothing was stored) or errors.Is(err, ErrUnavailable) (the
//     store did not answer; the request may or may not be stored, and is
//     then stored whole) holds, or another error after which nothing was
//     stored. A record of a failed request is never read half.
//   - Order per key: the records of one order key in one lane are read in
//     Append order, in one queue (one Reader at a time), also across
//     restarts. A message not acknowledged comes back, in front of every
//     later one of its queue, at the next restart (local) or owner (fleet):
//     a key's records may be read again, never overtaken.
//   - Acknowledgement: Ack follows the upstream's 200 for every record of
//     the message, or PutDead's return for those that will not be
//     delivered; an acknowledged message is not read again, even after a
//     restart (a crash between Ack and its being written down may bring it
//     back: the upstream deduplicates by insert_id).
//   - Dead letters: PutDead returns once they are durable and gives each an
//     ID that increases and is never reused; ListDead returns them by ID
//     with their lane, reason, answer and record as stored, until
//     DeleteDead.
//
// # Where the backends differ
//
// A queue is a lane (kind, api_key, options) in the local spool and a
// partition of a lane kind in the fleet (the lane then travels in each
// Message, and one partition carries many lanes). An engine keeps its
// per-key state per Reader and reads Message.Lane: that works for both.
// The local spool ignores Request.ID and Request.Accepted and takes the
// request's Batch over (no copy); the fleet deduplicates by Request.ID
// and copies the records. ListDead with limit <= 0 means no limit locally
// and 1000 in the fleet. Run hands the local spool's every lane (of Only's
// kinds), and lanes created later, to deliver, each a LaneQueue (see
// ErrIdle, ErrRetired). The fleet hands only the partitions this relay
// holds the lease of, and ends a deliver's context when the lease moves;
// delivery splits a partition into a Lane per lane it carries.
//
// # Goroutines
//
// Run owns one goroutine per queue it hands to deliver (none for a local
// lane between ErrIdle and its next record) and returns after every
// deliver returned. A Reader's Next has one caller at a time; Ack
// may be called from any goroutine.
package storage
