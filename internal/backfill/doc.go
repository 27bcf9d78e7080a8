// Package backfill delivers history (files of events) to a project through
// the relay's own spool and delivery engine, paced at the upstream's
// documented limits, resumable after a crash and idempotent across runs.
// `relay backfill` and `relay migrate` (internal/operator) run it.
//
// # Inputs
//
// Each input is JSON lines, plain or gzipped, or a zip archive of such
// files (what `relay export` writes, or the upstream's export archive). A
// line is an envelope ({"events": [...]}: its events; its api_key and
// options are not used, Config.APIKey names the project), an exported
// record (it has $insert_id, event_time, server_upload_time, uuid or
// svc_id: mapped to an ingestion event, see fromExport; the fields
// ingestion does not take are dropped and counted in Counts.Dropped), or an
// HTTP V2 event as it is. An event without insert_id gets one derived from
// its line's text and position (zip entry, byte offset, index in the
// envelope), so reading the same file again gives the same ids. A line that
// is not JSON, and an event the ingest would refuse (event.Parse, each
// alone), become dead letters at once; the rest go on as the ingest would
// spool them (a missing time is the time it was read).
//
// # Durability and resumption
//
// Dir holds a spool (the daemon's: write-ahead log and bbolt) and
// backfill.state.json: the project label, the upstream, and per input how
// far it was read. The reader appends a chunk (at most 1000 events or
// 1 MiB, whole lines) to the spool, then moves the state past it (written to
// a temporary file, fsynced, renamed). A run killed at any moment resumes
// with the same Config: records in the spool are delivered, reading goes on
// from the state; a chunk spooled but not yet recorded is read again, with
// the same insert_ids, which the upstream dedups. A run over inputs already
// read to their end sends nothing. Reading waits while the spool holds more
// than 64 MiB of records, so the disk a backfill needs is bounded.
//
// # Pacing
//
// Delivery is internal/delivery's, with its shards, per-device order, 429
// pauses, daily-quota and silenced handling, retries and dead letters, over
// a Throttle with PaceAll: every device and user is paced from its first
// event at 0.8 x DeviceEPS with a cap of DeviceEPS events per request, so in
// any window of W seconds a key gets at most DeviceEPS + 0.8 x DeviceEPS x W
// events (under the strict reading of a 10 s window that leaves 1.25 s for
// the time between building a request and its arrival). A resumed run waits
// 1.25 s before its first request, so that a key's bucket of the killed run
// is full again. The project's rate is held by the Sender the lane runner is
// given: each request waits for its events' tokens of a bucket refilled at
// MaxEPS per second holding one request's worth (requests of at most
// MaxEPS/10 events, at most 1000), so in any window of W seconds at most
// MaxEPS x W events plus one request's are sent. With Config.Live (a
// backfill inside a running relay) the bucket is refilled at MaxEPS less
// the project's live events/s, and not at all while live traffic takes the
// whole rate: live lanes go first.
//
// # End
//
// Run returns when everything read was delivered or is a dead letter
// (nil), when its context ends (ErrInterrupted: nothing is lost, run it
// again), or when the lane stopped (an invalid api_key or URL: nothing is
// dropped). In every case the dead letters of Dir (all runs) are written to
// the report file.
//
// # Goroutines
//
// Run owns three: the reader, the delivery pipeline's Run, and its own
// loop that watches the end and calls Config.Progress. The reader's
// counters are guarded by reader.mu, taken alone; the sender's are atomics.
package backfill
