// Package spool is the relay's durable queue: a write-ahead log (WAL) in
// front of one bbolt file that holds, per lane, an ordered queue of chunks,
// plus a dead-letter store.
//
// A lane is one upstream destination (LaneKey: kind, api_key, options). A
// chunk is the group of records one Append wrote to a lane; a record is one
// event (or group identify, or mapping) with its ordering ids.
//
// # Files
//
// Dir/wal/ holds the WAL's segment files (see wal.go): an Append is a record
// appended to the current segment. Dir/spool.db is a bbolt file with a map
// freelist, where a chunk lives once a checkpoint moved it there (see
// store.go). Its buckets:
//
//	meta    format version; the spool's random id; dead-letter count and
//	        bytes; the WAL position applied to the file (records before it
//	        need no replay); the WAL end acknowledged when a checkpoint
//	        last committed (unless NoSync). Other keys are left alone (later
//	        features add theirs)
//	lanes   8-byte big-endian lane id -> LaneKey + next seq and the
//	        chunks, records and bytes of the lane in this file (updated in
//	        every transaction that touches the lane, so Open never scans a
//	        queue)
//	q<id>   one per lane: 8-byte big-endian seq -> encoded chunk; a
//	        chunk of 32 KiB or more is a bucket of its own holding it
//	        under key 0x00, so that bbolt writes it once (chunkstore.go)
//	dead    8-byte big-endian id -> encoded dead letter
//
// The value encodings are in encode.go; each starts with a version byte and
// carries a CRC-32C (format 4).
// Another process opening the same Dir fails after about half a second
// ("locked by another process").
//
// The freelist is written by every transaction while it is small next to
// what the transaction writes (keepFreelist), when the spool goes idle, and
// by Close; otherwise the next Open rebuilds it by checking every page of
// the file (about 1 s per 5 GB here). The mapping's pages are advised (see
// advise.go).
//
// # Durability
//
// Append returns only after its chunk's record is in the WAL: unless
// NoSync, the segment is fdatasync'ed (one fdatasync per write, for
// every Append queued while the previous write ran: group commit; when the
// last write carried several appends and fewer are queued, the writer first
// yields up to 50 µs for as many, see takeWAL);
// under NoSync the record has reached the OS (it survives a crash of the
// process, not of the machine). A segment's name is made durable (directory
// fsync) before anything in it is acknowledged. A chunk is written from its
// Batch's buffer without a copy, and the spool keeps that buffer: the chunk
// is now "hot", in the WAL and in memory, not in bbolt.
//
// Checkpoints (store.go) move the hot chunks not acknowledged soon enough
// into bbolt, in one transaction that also stores the WAL position up to
// which bbolt is complete; Open replays the WAL from that position, so
// every acknowledged chunk not yet in bbolt comes back after a crash. A
// chunk delivered while hot is never written to bbolt: under load,
// delivery keeps up and bbolt sees only what waits.
//
// Nothing is half-written: a refused Append (ErrFull, ErrDiskLow) is skipped
// inside the write and does not fail its neighbours; a failed WAL write
// fails every Append of it, and the writer abandons that segment (zeroing
// the failed records' first header, so that a replay stops before them) and
// continues in a new one. A failed checkpoint keeps its chunks hot and its
// deletions queued for the next one; appends go on into the WAL until the
// hot chunks' memory reaches twice that bound, then fail with ErrFull.
// While checkpoints make progress but lag, appends wait for them instead
// (at most 5 s), as they would wait for bbolt without the WAL.
// Stats().Refusing says why appends are refused while that lasts (failing
// checkpoints at the memory bound, no space for a new WAL segment,
// draining), for a readiness probe.
//
// # Order
//
// Chunks of a lane are read back in Append order: sequence numbers start at
// 1 and increase by one per chunk within a lane, never reused (the next seq
// is stored with the lane). Within a lane, WAL order is seq order, so the
// chunks in bbolt always precede the hot ones. Each lane has one reader
// cursor (Lane.Next): it reads chunks in bbolt through a short read
// transaction (a copy per chunk) and hot chunks from memory (no copy: the
// reader shares the buffer); it starts at the lane's oldest live chunk when
// the spool opens, so chunks that were read but not acknowledged before a
// crash are read again. Lane.NextPart reads a chunk larger than its
// reader may hold in parts (copies of the records that fit, parts.go); the
// chunk is still acknowledged as a whole.
//
// # Lane limits and retirement (lanes.go)
//
// Config.MaxLanes and MaxLanesPerKey bound the lanes; a lane empty and
// without an Append for Config.RetireIdle (and not pinned) is retired:
// forgotten in memory, deleted from the file, its reader answered
// storage.ErrRetired; an Append through a retired Lane goes to the live
// lane of its key. A checkpoint looks only at the lanes appended to since
// the last one, and an idle lane's reader may end (storage.ErrIdle) to be
// started again at the lane's next record (whenWork): an idle lane costs
// no goroutine.
//
// # Removal
//
// Ack never blocks. A hot chunk acknowledged is forgotten at once (its
// memory is reused once the reader releases it too); a chunk in bbolt is
// deleted by the next checkpoint. Every ack is also written to the WAL with
// the next write (not synced on its own), so that a replay does not bring
// back chunks acknowledged before a crash; one not yet written when the
// process dies is delivered again (the upstream dedups by insert_id).
// PutDead commits dead letters to bbolt before it returns, so a caller that
// dead-letters some records of a chunk and then acks the chunk never loses
// them. Dead-letter ids increase and are never reused.
//
// # Space
//
// Append fails with ErrFull when the live bytes (encoded chunk sizes, as in
// Chunk.Size, hot and in bbolt) would pass Config.MaxBytes, and with
// ErrDiskLow when the filesystem's free space (statfs, cached for 500ms,
// minus the bytes appended since) minus the chunk is under
// Config.MinFreeBytes. Dead letters, lanes and deletions are never refused
// for space. WAL segments are reused once a checkpoint passed them (up to
// eight spares are kept), and an idle spool (nothing appended for 30 s) keeps
// no WAL file. bbolt files never shrink, so when the live data is small next
// to the file, the store compacts it into a new file and swaps it in (see
// compact.go).
//
// # Integrity
//
// Every record is checksummed and every read checks it (encode.go, wal.go).
// Damage never crashes the spool and never passes silently:
//
//   - the WAL is judged by one reader (readLog, wal.go) for the replay and
//     for Verify alike: the replay skips exactly the damaged records and
//     reports what they lost (a log line, the
//     relay_spool_damaged_records_total counter by events, the bytes in
//     Dir/quarantine/); what lost nothing (a write cut short, a reused
//     file's old bytes, a chunk acknowledged later) raises no alarm;
//   - a chunk of bbolt that fails its checksum is moved to dead letters with
//     reason "damaged" when the reader reaches it, never returned; that
//     write has a context of its own (the reader's may be done), and a
//     failed one leaves the chunk to be read again;
//   - Open refuses (ErrDamaged) a spool.db missing, empty or another
//     spool's while the log holds records, or one whose positions the log
//     does not reach, and a spool.db bbolt cannot read: the
//     file is checked before it is mapped and bbolt's panics and faults are
//     recovered (integrity.go). Verify (offline.go) reads and salvages what is
//     left without bbolt;
//   - a replay that lacks disk space opens the spool draining (drain.go).
//
// # Goroutines and locks
//
// Open starts two goroutines: the WAL writer (walwriter.go: appends and
// acks into the WAL, hot chunks published to their lanes) and the store
// (store.go: every bbolt write: checkpoints, lanes, dead letters,
// compaction, and the WAL segments' reuse). Close stops the writer after
// the queued appends are written, then the store after a last checkpoint of
// everything, then closes the file. All methods are safe for concurrent
// use, except that each Lane has a single reader (Next).
//
// Locks: Spool.mu (the queues of operations and acks, the WAL's published
// end, the lanes), Lane.mu (a lane's bbolt counters, its hot chunks, its
// notification channel) and Spool.dbMu (the *bolt.DB: shared for read
// transactions, exclusive only for the compaction swap and Close). No two
// of them are ever held at once. A hot chunk's buffer is shared by the
// spool and the reader, each holding a reference (storage.Buf); the spool
// drops its own when the chunk is acknowledged or put into bbolt.
package spool
