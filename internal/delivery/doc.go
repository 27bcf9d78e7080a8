// Package delivery is what every lane kind shares to deliver spooled
// records upstream: the lane status an operator sees (LaneStatus), the lane
// control it uses (LaneControl, ErrUnknownLane), the retry policy (Retry),
// the answer rule (Classify: what an answer means for a request's records,
// as a Verdict: delivered, some dead, split, throttled, wait, stop), the
// max-age rule (Expired), the dead-letter flush (FlushDead), the Kind every
// lane runner packs and classifies with (a lane's Frame: its envelope, a
// record's encoding and a request's limits, packed one record at a time),
// the supervisor of every kind (Engine: a Runner per lane of a kind the
// store's Run hands over, through the seam, forgotten when the store
// retires the lane; lane status, stop/resume and relay_lane_stopped; a
// fleet partition goes to DeliverPartition), the configuration of the
// form-encoded kinds (FormConfig: group identify and user mappings, whose
// Kind is a Form), and in fleet mode the partition demultiplexer every
// kind's runners read (DeliverPartition: a Feed per lane of a partition,
// one acker per partition; Runners, the runners by id). The lane runner
// itself, the one send loop of every kind, is internal/batcher's: a Runner
// with N shards per lane for events (Kind: the /2/httpapi JSON envelope),
// one for a form kind (batcher.NewForm), each packing a request with the
// lane's Frame as it takes records from its own queues (pauses, pacing and
// the read-ahead budget live there).
//
// Invariants every deliverer keeps:
//   - Order per key: records of one lane and one order key reach the
//     upstream in the order they were accepted (form lanes keep the lane's
//     order; the events pipeline hashes an order key to one shard).
//   - One request in flight per shard (a form lane is one shard), so a
//     retry never overtakes a later record.
//   - A chunk is acknowledged to the spool only after every record of it
//     was answered 200 by the upstream or is committed as a dead letter
//     (PutDead returns after the commit, before the ack).
//   - Nothing is retried in a loop against an upstream that refuses the
//     api_key or the URL: the lane stops (relay_lane_stopped{lane} is 1)
//     until ResumeLane or a restart; its records stay in the spool.
//   - Retryable answers wait per Retry: exponential, jittered, capped,
//     Retry-After honoured but clamped; a record older than its kind's max
//     age becomes an "expired" dead letter instead.
package delivery
