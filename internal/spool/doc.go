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
// Dir/wal/ holds the WAL's segment files (wal.go). Dir/spool.db is a bbolt
// file with a map freelist (on disk while small, when idle and after Close:
// keepFreelist), where a chunk lives once a checkpoint moved it there
// (store.go). Its buckets:
//
//	meta    format version; the spool's random id; dead-letter count and
//	        bytes; the WAL position applied to the file; the WAL end
//	        acknowledged when a checkpoint last committed (unless NoSync).
//	        Keys this version does not know are left alone
//	lanes   8-byte big-endian lane id -> LaneKey + next seq and the
//	        chunks, records and bytes of the lane in this file (kept in
//	        every transaction that touches the lane: Open never scans a
//	        queue)
//	q<id>   one per lane: 8-byte big-endian seq -> encoded chunk (a large
//	        one is a bucket of its own: chunkstore.go)
//	dead    8-byte big-endian id -> encoded dead letter
//
// Every value carries a version byte and a CRC-32C (encode.go). Another
// process opening the same Dir fails after about half a second.
//
// # Durability
//
// Append returns only after its chunk's record is in the WAL: fdatasync'ed
// (one per write, for every Append queued meanwhile: group commit), or under
// NoSync handed to the OS. A segment's name is durable before anything in
// it is acknowledged. The chunk stays in memory, "hot", sharing its Batch's
// buffer; a checkpoint moves the hot chunks not acknowledged soon enough
// into bbolt with the WAL position up to which bbolt is complete, and Open
// replays the WAL from there. A chunk delivered while hot never reaches
// bbolt.
//
// Nothing is half-written: a refused Append (ErrFull, ErrDiskLow) does not
// fail its neighbours; a failed WAL write fails every Append of it and the
// writer continues in a new segment. A failed checkpoint keeps its chunks
// hot; appends go on until the hot memory reaches twice its bound, then
// fail with ErrFull (while checkpoints succeed but lag, appends wait for
// them instead, at most 5 s). Stats().Refusing says why appends are
// refused while that lasts.
//
// # Order
//
// A lane's chunks are read back in Append order: seqs start at 1, increase
// by one per chunk and are never reused. Within a lane WAL order is seq
// order, so the chunks in bbolt precede the hot ones. Each lane has one
// reader cursor (Lane.NextPart), placed at the lane's oldest
// live chunk at Open: what was read but not acknowledged before a crash is
// read again.
//
// # Lanes, removal, space
//
// Lanes are bounded and an empty idle lane is retired (lanes.go). Ack never
// blocks: a hot chunk acknowledged is forgotten at once, one in bbolt is
// deleted by the next checkpoint; acks reach the WAL with the next write
// (not synced on their own), and one lost with the process means a chunk
// delivered again (the upstream dedups by insert_id). PutDead commits
// before it returns, so records dead-lettered before their chunk's Ack are
// never lost; dead-letter ids are never reused.
//
// Append fails with ErrFull past Config.MaxBytes of live bytes (hot and in
// bbolt) and with ErrDiskLow when the filesystem's free space (statfs,
// cached for 500ms, minus what was appended since) would fall under
// Config.MinFreeBytes. Dead letters, lanes and deletions are never refused
// for space. WAL segments are reused, an idle spool keeps none, and a
// mostly empty spool.db is compacted (compact.go).
//
// # Integrity
//
// Every record is checksummed and every read checks it; damage never
// crashes the spool and never passes silently. The WAL has one judge,
// readLog, for the replay and for Verify alike: damaged records are skipped
// exactly and what they lost is reported (a log line, the
// relay_spool_damaged_records_total counter, the bytes in Dir/quarantine/);
// what lost nothing raises no alarm. A chunk of bbolt failing its checksum
// is moved to dead letters (reason "damaged") when its reader reaches it.
// Open refuses (ErrDamaged) a spool.db that does not match the log or that
// bbolt cannot read (integrity.go); Verify (offline.go) reads and salvages
// what is left without bbolt. A replay short of disk space opens the spool
// draining (drain.go).
//
// # Goroutines and locks
//
// Open starts two goroutines: the WAL writer (walwriter.go: appends and
// acks into the WAL, hot chunks published to their lanes) and the store
// (store.go: every bbolt write and the WAL segments' reuse). Close stops the
// writer after the queued appends, then the store after a last checkpoint
// of everything, then closes the file. All methods are safe for concurrent
// use, except that each Lane has a single reader.
//
// Locks: Spool.mu (the queues of operations and acks, the WAL's published
// end, the lanes), Lane.mu (a lane's bbolt counters, its hot chunks, its
// notification channel), laneIndex.mu (taken alone or last) and Spool.dbMu
// (the *bolt.DB: shared for read transactions, exclusive only for the
// compaction swap and Close). Lane.mu is taken under Spool.mu (retirement,
// the dirty lanes), never the other way round; dbMu is held with neither.
// A hot chunk's buffer is shared by the spool and the reader, each holding
// a reference (storage.Buf).
package spool
