// Package delivery delivers spooled records upstream, for every lane kind:
// the events' /2/httpapi lanes and the form kinds' (group identify, user
// mappings). It reads each lane through the storage seam, batches its
// records, sends them through a Sender (the upstream client, which only
// reads answers) and decides what every answer means (decide, the one
// answer rule), by the contract's Delivery section. One lane runner
// (reader, shards, one send loop) serves every kind: New and NewFleet make
// the events' Pipeline (ShardsPerLane shards per lane), NewForm a form
// kind's (one shard per lane).
//
// # Shape
//
// Run runs the store (storage.Owner.Run): locally a runner
// per lane, those that exist and those created later; in fleet mode the
// partitions this relay owns (partition.go). A lane's reader goroutine hands
// each record to the shard (of Config.ShardsPerLane) its OrderKey hashes
// to, and a shard runs a goroutine while it has records (it ends after
// shardLinger with nothing queued or held). An idle lane holds no
// goroutine (storage.ErrIdle: see laneRunner.Run); a retired one's runner
// is forgotten (storage.ErrRetired). A shard batches its records (at most
// MaxBatchEvents, a body strictly under MaxBatchBytes measured on the exact
// bytes sent, flushed when full or when its oldest event has waited
// FlushInterval) and has at most ONE request in flight. Those three limits,
// Gzip, MaxEventAge and ThrottlePause can change while running
// (Pipeline.SetLive, a configuration reload): one atomic snapshot read per
// batch and per wait, and a shard waiting on the old FlushInterval is woken
// to wait on the new one. Events are a Kind like the form kinds: the
// events kind gives each lane its Frame (the {"api_key","events","options"}
// envelope and those limits), with whose methods a shard packs the events
// it takes from its queues.
//
// # Answers
//
// The upstream client (internal/upstream) only reads an answer; what it
// means is decided in one place for every kind, decide (answer.go), and the
// shard acts on the verdict (shard.handle).
//
// # Form kinds
//
// Group identify and user mappings run on the same lane runner (NewForm): a
// pipeline of one shard per lane, whose Kind is the form kind's Form (its
// limits as the batch limits, its linger as the flush interval). A form
// request names no key, so a silenced answer is a 400 there and a 429 waits
// as a 5xx does (at least the kind's ThrottleWait without Retry-After).
//
// # Invariants
//
//   - Order: all events of one OrderKey (device, else user) go through one
//     shard, which sends one request at a time and puts every event it must
//     resend back in front of later ones; events of a paused key are held in
//     a per-key queue that later events of the key join, and that goes back
//     to the front when the pause ends. An event put back while its key is
//     held (a later event of the key was held by the same build, e.g. for
//     its user) goes to the front of that held queue. So one key's events
//     reach the upstream in spool order (a resend repeats events the
//     upstream did not ingest: a non-200 answer ingests nothing).
//   - Pauses: a key named in a 429 (throttled_devices as "d:"+id,
//     throttled_users as "u:"+id; event indexes only when no id is named)
//     is paused in the Throttle for ThrottlePause (Throttle.Refused, with
//     its share of the refused request), then paced; devices in
//     exceeded_daily_quota_devices until the next UTC midnight. An event is
//     held while its OrderKey or its user is paused, or while either is
//     paced and has no token (until its bucket holds a request's worth:
//     see internal/throttle). Pauses are checked when a batch is built and,
//     when the Throttle's generation moved meanwhile (another shard's or
//     lane's 429), again just before it is sent. Throttling never adds
//     requests: the held events simply wait.
//   - Acknowledgement: a chunk is acked (Lane.Ack) only when every one of
//     its records was answered 200 or is committed to the dead-letter store
//     (PutDead returns after the commit, and is called before the records
//     count as done). Records of one chunk may be spread over shards; a
//     per-chunk counter finds the last one. Chunks are acked in any order.
//   - Loss: nothing is ever dropped silently. Dropped events are dead
//     letters with a reason ("silenced", "invalid_fields",
//     "missing_fields", "bad_request", "too_large", "expired") and the
//     upstream's answer, or "plan" and the tracking plan's violations: a
//     lane's Frame.Check (Config.Check, internal/plan) is asked about each
//     record that fits the batch being built, every time it is built.
//   - Retries: 5xx, time-outs and connection failures are retried with
//     exponential, jittered, capped backoff (cenkalti/backoff), Retry-After
//     honoured up to RetryMax, without a count limit; an event older than
//     MaxEventAge (since its chunk was accepted) becomes an "expired" dead
//     letter instead of being sent again.
//   - Invalid API key (and other fatal answers: wrong URL) stop the lane:
//     nothing is retried or dropped, relay_lane_stopped{lane} is 1, one
//     error is logged; ResumeLane or a restart resumes it.
//
// # Memory and back-pressure
//
// The read-ahead is bounded in bytes of memory held, per lane
// (MaxReadAheadBytes) and for all lanes together (MaxReadAheadTotalBytes).
// What counts is what stays reachable: all records of a chunk Lane.NextPart
// returns alias one buffer (the spool's own for a chunk still in its
// write-ahead log, shared with it; a copy for one read from bbolt), so a
// chunk counts its buffer (the larger of Chunk.Size and the buffer's
// capacity) plus an item per record from when it is read until its last
// record is done (delivered or dead-lettered) or detached; the buffer is
// then released (Buffer.Release).
// A record moved to a held queue (its key paused by a 429, a daily quota,
// pacing) is detached: copied into its own small allocation, counted by
// itself, so that one held event does not keep a whole chunk alive for
// hours. A detached record counts twice (its copy and its chunk) until its
// chunk's other records are done or detached too, so at worst a budget is
// met by half the data.
//
// Every byte read counts before it is read: the reader waits for records
// (Lane.Wait), reserves its grant in the total (budget.reserve), then reads
// at most that (Lane.NextPart, which returns a chunk larger than the grant
// in parts: a chunk can be a whole 20 MB request), so the bounds are passed
// by at most one read's rounding (a buffer size class, the items, a record
// larger than the grant). A lane reads while its read-ahead is under
// min(MaxReadAheadBytes, its window) and the total under three quarters of
// MaxReadAheadTotalBytes; a lane holding nothing may read up to the whole
// total. So lanes whose budget is entirely held (devices over their daily
// quota, a stopped lane, an upstream that is down) slow the others, and the
// last quarter keeps them from stopping the others. The spool keeps the
// rest.
//
// Within its budget a lane reads only as far as its window: minWindow (32
// KiB) at the start, one Next step at the first progress (a 200, dead
// letters, events parked for a paused key), doubling with each further one
// up to the budget. When every shard of the lane is retrying (the upstream
// is down), or the lane is stopped, the window closes to minWindow, so an
// outage holds what was read before it, not the budget, and a lane that
// never delivered holds 32 KiB. Shards that wait give their request body
// buffer back to a pool shared by all lanes (shard.shrink).
//
// # Metrics
//
// relay_delivery_events_delivered_total, relay_delivery_events_retried_total,
// relay_delivery_events_dead_lettered_total{reason},
// relay_delivery_paused_devices (keys held now),
// relay_delivery_held_events{lane} (events they hold), relay_lane_stopped{lane}
// (alert on 1) and relay_delivery_read_ahead_bytes (all lanes); a form
// kind's are relay_<name>_... (form.go). No lock of the pipeline is held
// while a metric is updated, and the scrape-time ones read a snapshot of
// the runners: a scrape never waits for delivery nor delivery for a scrape.
//
// # Stop
//
// When Run's context ends, shards start no new request; a request in flight
// gets DrainTimeout to finish (its answer is still handled) and is then
// abandoned. Records not acknowledged stay in the spool and are read again
// at the next start; the upstream dedups resends by insert_id.
//
// # Fleet mode
//
// NewFleet delivers the partitions a storage.Owner hands this relay (the
// fleet's NATS JetStream streams) instead of spool lanes, through the same
// Run as local lanes and the form kinds' partitions. A partition
// carries the records of many lanes, each Message those of one lane:
// deliverPartition (partition.go) reads a partition's messages in order
// and hands each to the Feed of its lane in that partition, read by a
// laneRunner as above (made on first sight, forgotten when idle or when
// the partition goes). A key lives in one partition, so per-key order
// holds as with the local spool. A message is acknowledged (by an acker
// goroutine of the partition: no runner waits for the round trip) once all
// its records are done (Feed.Ack). When the partition goes (the lease
// moved), its runners stop at once, abandoning requests in flight; what
// was not acknowledged comes back, in order, to the next owner. When the
// relay stops, the partition takes no new work, its runners finish within
// DrainTimeout, their acknowledgements are sent (each while the lease
// holds), and the lease is held until the store's Run ends it: a standby
// then takes over at once, with few records to send again (deduplicated
// upstream by insert_id). Pauses and operators' lane stops are shared
// with the fleet's other relays (SharedPauses, SharedLanes). A feed's
// runner is kept in Pipeline.runners, under an id of its own. The
// fleet's locks (fleetState.smu, the partition's and the feed's) are each
// taken alone too.
//
// # Goroutines and locks
//
// Each shard's queues are owned by its goroutine (between two of its
// goroutines, by the reader's Run, which starts them); the reader hands
// records over under shard.mu, which also guards shard.running. A chunk's counters (ackRef.left, chunkRef.refs) are atomic:
// its records may be done by several shards. Pipeline.runners (under
// Pipeline.rmu) keeps a laneRunner per lane Run met; Run forgets one whose
// lane the spool retired. Locks never nest: Pipeline.rmu, the lock of
// laneRunner.stop (StopSwitch), budget.mu and shard.mu are each taken
// alone.
package delivery
