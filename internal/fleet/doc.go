// Package fleet is the relay's spool on a NATS JetStream cluster, shared by
// every relay of a fleet (--spool nats://h1:4222,h2:4222,h3:4222): any relay,
// and any one node of the cluster, can die without losing an acknowledged
// record, and a 429 seen by one relay holds the key on every relay.
//
// # The seam
//
// The delivery engine and the ingest talk to a spool through the small
// interfaces of package storage; the local spool (spool.NewBackend) and
// this package (Fleet.Backend) are the two implementations, and both pass
// the conformance suite storagetest (conformance_test.go runs it on a
// 3-node cluster). seam.go holds the adaptation:
//
//   - storage.Appender: Backend.Append, which is Fleet.Append(ctx, Request)
//     of the storage.Request's batch: a request's records of one lane,
//     made durable as a whole before it returns (all or nothing, see
//     Ingest).
//   - storage.Owner: Backend.Run(ctx, deliver): for every partition this
//     relay owns, deliver runs with a context that ends when ownership
//     ends, reading through a storage.Reader.
//   - storage.Reader (over a *Partition): Next returns the partition's
//     messages in order; Ack once all a message's records were answered
//     200 by the upstream or committed as dead letters. The fleet's own
//     Partition also has Nak (read again) and its Message Delivered (a
//     redelivery count), which the seam leaves out: the local spool has
//     neither.
//   - storage.DeadLetters: PutDead, ListDead, DeleteDead, shared by the
//     fleet (one relay lists and replays what another dead-lettered).
//   - Pause, PausedUntil (not in the seam: the local spool keeps pauses in
//     the process's throttle): a key (device, user) held until a time,
//     seen by every relay.
//
// ErrFull, ErrUnavailable and ErrLost match the seam's sentinels of the
// same names (errors.Is), so a caller of the seam needs no fleet import.
//
// Where the local spool has one queue per lane (kind, api_key, options)
// and a chunk per Append, the fleet has, per lane kind, P partitions
// spread over S streams (partition p in stream p mod S), and a message per
// lane and partition of each published batch, whose lane travels inside
// it: the engine's unit of work is a partition (in which it keeps its
// per-key shards), not a lane. Lane-level admin (stop, resume, status)
// then works on the engine's in-memory state, across the partitions this
// relay owns.
//
// A message is the unit of storage and of acknowledgement: the records of
// one lane in one partition from the requests of one batch (split further
// only when larger than Config.MaxMessageBytes). Records are not
// acknowledged one by one: the engine counts a message's records (as
// delivery counts a chunk's) and acks the message when the last is done.
//
// A message's records are compressed (zstd, or S2, codec.go) when that
// shrinks them: each byte of a message is written to every node's Raft log
// and store, sent over two routes and read back by the owner, so the relay
// compresses once what the cluster would otherwise carry several times.
// MaxMessageBytes bounds the records before compression. A relay of before
// would dead-letter a message of a codec it does not read as damaged, so
// the committers write a kind's messages in the best codec every member of
// the kind says in its heartbeat (the value of m.<kind>.<relay>, see
// Ownership) that it reads: zstd while every member reads it, S2 while one
// reads S2 only, plain while one reads neither; a rolling upgrade writes
// the older codec until the last old relay has left. An old relay joining
// later (a downgrade) may read messages written before the others' next
// heartbeat in a codec it does not know: a downgrade needs a drain.
//
// # Invariants
//
//   - Order per key: a record's partition is FNV-1a(order key) mod P, the
//     same on every relay (P is fixed per stream, kept in the stream's
//     metadata and checked by Open). Within a partition the stream keeps
//     publish order; one request's records of a key are in one message or
//     in consecutive messages of one atomic batch, and a request answered
//     before another was accepted is stored before it (its batch was
//     committed first). Exactly one relay reads a
//     partition at a time and gets its messages in stream order, so the
//     engine's per-key rules (one request in flight per shard, resends in
//     front) hold as with the local spool. After a failover the new owner
//     reads every message not acknowledged, again in stream order, starting
//     at the oldest: a key's records may be sent again (the upstream dedups
//     by insert_id), never overtaken by later ones.
//   - Acknowledgement: Ack only after the upstream's 200 for every record of
//     the message, or after PutDead returned for those that will not be
//     delivered. A message not acknowledged is delivered again to the
//     partition's next owner. What an owner acknowledged leaves the stream
//     only by its owner's removal (remove.go): a purge of the partition's
//     subject below its oldest message not acknowledged, one Raft entry for
//     every message acknowledged since the last purge. The purge runs in
//     the background (close waits for it), so a relay killed just after an
//     Ack may leave that message to be read again, as the local spool does
//     with the acknowledgements after its last checkpoint; a message
//     acknowledged while an older one is held is left to the purge too
//     when the floor passes it within a removal round (the delivery
//     engine's acknowledgements often come out of stream order), and is
//     otherwise deleted from the stream alone, which the server takes as
//     its acknowledgement to the consumer (in a work-queue stream of
//     before, it is acknowledged to the consumer, which deletes it).
//   - One owner per partition: see Ownership.
//   - Nothing acknowledged is lost while a quorum of the cluster (two of
//     three nodes) keeps its store: every stream is R3 on file storage and
//     Append returns only when the stream leader has the write stored on a
//     quorum.
//
// # Streams
//
//	RELAY_EVENTS, RELAY_EVENTS_1 ... RELAY_EVENTS_<S-1>
//	               relay.events.<p>, p mod S = the stream's number
//	                                 limits retention (no limit but
//	                                 MaxBytes), R3, file,
//	                                 discard new at Config.MaxBytes,
//	                                 dedup window Config.DedupWindow,
//	                                 atomic batch publish allowed;
//	                                 metadata relay.partitions = P,
//	                                 relay.streams = S, relay.format = 2
//	RELAY_GROUPIDENTIFY..., RELAY_USERMAP...  the same for the other kinds
//	RELAY_DEAD     relay.dead.<kind> limits retention, R3, file; a dead
//	                                 letter's ID is its stream sequence
//	KV RELAY_FLEET  m.<kind>.<relay>, p.<kind>.<p>  membership and partition
//	                                 leases, R3, every revision expires
//	                                 after Config.LeaseTTL
//	KV RELAY_PAUSES <base64url key>  pauses (not pacing), R3, per-key TTL
//
// The stream holds exactly the backlog: nothing expires, and a message
// leaves only when its partition's owner removes it (see
// Acknowledgement), so the stream's size is what Config.MaxBytes bounds
// and what ingest's 503 reacts to (discard new: a full stream refuses the
// publish), and a consumer that starts at the partition's first message
// starts at the oldest one not removed (what failover relies on, see
// Ownership). Nothing needs the removed messages again: what could not be
// delivered is in RELAY_DEAD.
//
// Why limits retention and not a work queue, which removes a message on
// its acknowledgement: the removal is the owner's purge anyway, and a work
// queue (like interest retention) makes the server refuse a consumer of
// fewer replicas than the stream. Its consumers then had a Raft group of
// their own on every node, and every delivery and acknowledgement was a
// proposal to it: about a tenth of the cluster's CPU under load, for state
// nobody needs (see Ownership). On a limits stream the partition's consumer
// has one replica, in memory, on one node: no Raft group.
//
// Streams of before: a stream made by a relay of before is a work queue
// (relay.format = 1), and the server does not change a stream's retention
// to or from work queue. This relay keeps such a stream as it is: it
// writes to it and reads it with consumers of the stream's replicas,
// removing by purge as on a limits stream (a consumer's acknowledgement
// removes the rest), so a fleet can be upgraded relay by relay with old
// and new relays on the same streams; it creates limits streams only for
// the kinds (and stream numbers) that have none. A relay of before refuses
// to start on a stream of format 2 (it checks the format), so it never
// reads a limits stream, where its acknowledgements would remove nothing.
// Moving a fleet's work queues to limits streams is the operator's drain
// (README): with every relay upgraded, stop the ingest traffic, wait for
// the streams to be empty, delete them and restart the relays. It is not
// automatic. In place it cannot be: the new stream must take the old one's
// name (which the relays of before look up) or its subjects, and a relay
// deleting a stream alone could delete one that another relay, stopped
// past its turn and resumed, has made anew and filled meanwhile. Beside
// it (a limits stream taking over the work queue's subjects, the work
// queue drained first by each partition's reader): a relay of before
// still ingesting would have its requests stored by a stream of another
// name, which its committer takes for a failure (it checks the name in
// the answer), and answer 503 for stored requests (copies on the
// client's retry); a partition's reader could move on only once no
// message of it is held in the old stream (a paused key's holds the
// partition for its pause), and every reader, remover and counter of the
// package would follow a layout that changes while it runs.
//
// Why several streams per kind: a stream is one Raft group, and its leader
// takes every write of it; with one stream per kind, every append of every
// relay went through one node however large the cluster. S streams have S
// leaders. S is 1 by default because all or nothing holds per stream (see
// below): spreading the writes is the operator's choice, made knowing that
// a multi-device request can then be stored in part. A relay whose
// Partitions and Streams are both zero takes the layout of the streams it
// finds (existingLayout), so a fleet keeps working across a change of the
// defaults. JetStream places them as it likes, so at Open a
// relay reads each kind's placement and, when one node leads more than
// ceil(S/nodes) of a kind's streams, asks the extra ones to step down in
// favour of a node that leads fewer (a step-down with a preferred server;
// see balance). The placement is logged (a warning when one node leads
// every stream of a kind) and the events streams' leaders per node are the
// gauge relay_fleet_stream_leaders, read again by every /readyz. Leaders
// move afterwards when nodes die or restart (a node back from a restart
// leads nothing): every relay checks the placement again every
// Config.Rebalance (a minute) and moves leaders the same way, to online
// nodes only, so that the writes spread again without a relay restart.
//
// Durability of a write (--sync): the streams use the server's default
// persist mode, in which a publish is acknowledged once a quorum of nodes
// has written it to their OS (a quorum stores it). Whether each node also
// fsyncs before that is the server's `jetstream { sync_interval: always }`
// setting, which a client cannot set or see: with --sync always the
// operator must configure the cluster so (the README says how); with
// --sync none the server's default (fsync every two minutes) is enough,
// and an acknowledged record survives the crash or power loss of any one
// node, not of a quorum at once.
//
// # Ingest: group commit, all or nothing
//
// Append groups a request's records by partition and encodes them (frags
// of at most MaxMessageBytes; a single record larger than that is refused
// before anything is published), then hands its part in each stream to
// that stream's committer (committer.go) and waits for the answers. A
// committer publishes the parts it holds as one batch: when a batch slot
// is free (at most Config.MaxInflight batches in flight per stream) it
// takes what waits, and what arrives within Config.Linger (1 ms), up to
// 900 messages and 4 MiB; one message per lane and partition, holding each
// request's records of that partition in arrival order. Many requests then
// share one quorum round (and, with sync_interval always, one fsync per
// node), as the local spool's requests share one WAL fsync. A batch of one
// message is a plain JetStream publish; of several, one atomic batch
// (Nats-Batch-Id, nats-server 2.12+): the server stores all of them or
// none. Every request of the batch gets the batch's outcome.
//
// Message ids are the batch's (a fresh id plus the message's index), so a
// retry of the batch after a lost answer (time-out, a node dying) is
// absorbed: the server answers "duplicate" (a single message) or "batch
// contains duplicate message id" (a batch, all of whose ids were committed
// together), and the committer counts that as success. It retries for at
// most Config.PublishTimeout; then, or at once when the stream is full, it
// answers an error for which errors.Is(err, ErrFull) or errors.Is(err,
// ErrUnavailable) holds: the ingest answers 503 with Retry-After, never a
// partial 200. A request with Request.ID (the admin API's dead-letter
// replay) is published in a batch of its own with message ids
// ID-partition-part, so that the same request appended again within
// DedupWindow is stored once. The ingest sets no ID: a client that retries
// a request that was stored after all (after ErrUnavailable) stores it
// again, and the upstream's insert_id dedup absorbs it only for the
// insert_ids the client set.
//
// All or nothing holds per stream: a request whose records lie in one
// stream (every request of one device) is stored whole or not at all. A
// request over several streams (several devices) is one batch per stream:
// it is answered 200 only once every one is stored; a refusal for space is
// decided before anything is published (MaxBytes, from the streams' bytes
// as last read), and a record too large is refused before too; but when
// one stream's batch fails otherwise (no quorum for that stream until the
// time-out, the servers' own disk limit) while another's was stored, the
// stored part stays and is delivered, and the client's retry sends the
// rest again (its stored part too: the upstream drops those copies only
// when the client set their insert_ids; one the relay filled in is new on
// each try). relay_fleet_multi_stream_appends_total counts requests stored
// over several streams. With one stream per kind (the default) every
// request is stored whole or not at all.
//
// # Several leaders and all or nothing per request (a design, not built)
//
// Measured (bench/RESULTS.md, "Fleet: NATS cost per event"): on one
// 2-core machine three streams per kind do not raise one relay's events/s
// much (44k against 35k with one device per request, medians of three
// noisy rounds) and lower it with eight devices per request (30k against
// 40k: such a request waits for the slowest of three batches). Several
// leaders pay off where the nodes have cores of their own; the default
// stays one stream. What they would need to keep a request all or
// nothing:
//
//   - Routing a whole request to one stream breaks per-device order: a
//     device's records must stay in its one partition (one reader, stream
//     order), and a request of devices A and B would put B's records where
//     B's other requests are not.
//   - Relay-filled insert_ids derived from the request (so that a client's
//     retry stores copies the upstream drops) would not give all or
//     nothing (the stored part is delivered even when the client gives
//     up) and break the contract ("an absent insert_id is filled with a
//     new unique id": two identical events of one body would become one).
//   - A commit decision does: a batch of the committers that holds a
//     request spanning streams becomes a joint batch (one atomic batch per
//     stream, published at once, each message carrying the joint batch's
//     id in a header); once every stream stored its part the relay creates
//     the key commit.<id> in a KV bucket (Create: only if absent) and
//     answers 200 only when that create succeeded. A partition reader that
//     meets a message with the header holds the partition (per-key order)
//     until a decision exists: commit, deliver; abort, acknowledge without
//     delivering. A reader that still finds none once the message is
//     older than PublishTimeout plus a margin creates abort.<id> the same
//     way: one Create of the two wins, so a writer whose commit lost
//     answers 503 and nothing of its requests is delivered, and a relay
//     that died between its batches and the decision leaves an abort
//     behind. Requests of one stream may ride in a joint batch (their
//     outcome is the joint one). The cost: one more quorum write per joint
//     batch (not per request), a reader's wait of about one round trip,
//     and the decisions' lifetime: a decision must outlive every message
//     that names it (a backlog can wait days for its upstream), so the
//     keys need no TTL but a janitor that deletes a decision once its
//     messages left the streams (their sequences are known at publish).
//     Not built: it needs the chaos test's faults (a node killed between
//     a joint batch's parts, a relay stopped past its lease while holding
//     an undecided message) to be trusted, which did not fit the time.
//
// # Ownership
//
// Each relay puts m.<kind>.<relay> in KV RELAY_FLEET every LeaseTTL/3 (a
// heartbeat) for each lane kind it delivers (each kind's delivery runs its
// own Run over Backend.Only(kind)); the live members of a kind are the keys
// present. A kind's partitions are assigned from its list (see assign), so
// a relay that delivers some kinds only (or stops one kind's delivery
// first) is given no partition of the others, so every relay computes the same
// assignment from the same list and a membership change moves few
// partitions. A relay delivers a partition only while it
// holds its lease p.<kind>.<p>: created with Create (atomic: the key must
// not exist), renewed with Update at the last revision (compare and swap),
// deleted when the relay gives the partition up (not while one of its
// pauses is unstored: see Pauses), and gone by itself
// LeaseTTL after its last renewal when the relay died.
//
// Fencing: the owner's deliver context ends at the start of its last
// successful renewal plus LeaseTTL minus LeaseMargin (measured on the
// relay's monotonic clock, so a relay that cannot renew stops before the
// server lets its lease expire), or as soon as a renewal is refused. The
// context also carries that deadline for storage.Leased, which the senders
// ask, by the clock, right before each request: a timer's cancellation is
// not enough, because a relay stopped (SIGSTOP, a paused VM) past its lease
// and resumed first runs the goroutines its expired timers woke (a shard's
// flush, which sends at once) and only then the cancellation. On
// taking a lease the new owner deletes the partition's durable consumer and
// creates it anew at the first message of the partition: every message not
// acknowledged comes back at once and in order (no wait for AckWait), and
// acknowledgements from the previous owner, whose consumer no longer
// exists, are refused. A standby takes a dead owner's partitions within
// LeaseTTL plus one heartbeat (about 8 s with the defaults).
//
// The consumer has one replica and keeps its state in memory (on a
// work-queue stream of before, the stream's replicas, each in memory).
// Nothing depends on that state outliving its node: an acknowledged
// message is removed from the stream itself (R3, on file), and every new
// owner resets the consumer to the partition's first message anyway. When
// the state is lost (its node restarted), the consumer starts again at the
// first message still in the stream: its sequence starts at 1 again, the
// reader sees a missed delivery and reopens the partition (see Deliveries
// in partition.go), and messages whose removal had not reached the stream
// are read again (sent again; the upstream dedups by insert_id), as after
// a failover. When its node is gone, the consumer falls silent: after two
// pull heartbeats missed in a row the reader reopens the partition, and
// the server places the new consumer on a node that is up.
//
// Why not JetStream's pinned-client priority policy: a pinned consumer
// gives one reader per partition, but when the pin moves the previous
// reader's unacknowledged messages come back only after AckWait, while the
// new reader already gets later ones (nats-server 2.15 unpins without
// touching pending messages), which would break per-key order; and the
// server, not the fleet, decides which relay is pinned, so partitions are
// not spread on purpose. The lease plus consumer reset gives order and
// spread, at the cost of a consumer re-creation per take-over.
//
// The ownership loop does one KV operation per held or wanted lease per
// heartbeat (3 x P at most, e.g. 9 every 2 s with the defaults), each in
// its own goroutine so that a slow answer does not delay the other
// renewals; the renewals start each tick beside the heartbeat and the
// member listing, never after them (a loaded cluster's slow answers to
// those would otherwise eat the lease's margin). Partitions are assigned by rendezvous hashing with bounded load
// (each member takes at most ceil(P/n) of each kind).
//
// A paused key's message stays unacknowledged: the engine keeps its
// records and acknowledges other messages of the partition meanwhile
// (JetStream acknowledges messages one by one, MaxAckPending bounds how
// many can wait). The partition reader sends InProgress for every message
// it handed out and that is still unacknowledged every AckWait/3, so the
// server never redelivers it to its owner.
//
// # Pauses
//
// Pause(key, until) puts the key into KV RELAY_PAUSES with a per-message
// TTL of until-now (nats-server 2.11+); every relay watches the bucket and
// keeps the live pauses in memory, so PausedUntil is a map lookup. A pause
// never shortens a longer one: Pause reads the stored one and replaces it
// only when it ends earlier, with a compare-and-swap on its revision.
//
// A key paused by a 429 is never sent by the partition's next owner before
// the pause ends, as long as the relay that got the 429 lives on:
//
//   - The taker reads the bucket (a fresh read, not its watcher) after it
//     took the lease and before deliver starts, and delivers nothing while
//     the bucket cannot be read. The watcher alone is not enough: its
//     consumer can go with a node and is made again only after missed
//     heartbeats, seconds during which pauses stored by others do not
//     arrive.
//   - A pause Pause could not store (no quorum, a bucket without a leader
//     for longer than PublishTimeout or the caller's context) holds on its
//     relay at once and is written again in the background until the
//     bucket takes it or it ends; Pause's error says so.
//   - Meanwhile the relay gives no partition up: a partition it should
//     hand over (a membership change) stops delivering but keeps its lease,
//     renewed, until the pause is stored or ended; at shutdown the relay
//     waits up to LeaseTTL/2 for it and otherwise leaves its leases to
//     expire rather than deleting them.
//
// What is not covered: a relay that loses its leases (it cannot renew for
// LeaseTTL-LeaseMargin: cut off from the cluster, stopped, killed) while
// one of its pauses is not stored. The next owner cannot know that pause:
// nothing of it reached the cluster. It sends the key once, inside the
// upstream's penalty, and pauses it on that 429 as on any other: one
// request, not a retry loop (test/fleet, TestFleetPauseLostWithItsRelay).
// Holding every taken-over partition for the longest pause
// (--throttle-pause, 30 s; until the next UTC day for a daily quota) would
// cover it, at that cost on every failover and cluster outage, with a
// setting the fleet does not have today; it was not chosen. With the bucket and the leases on the same cluster, an outage
// that expires the leases usually ends for both at once, and the pause's
// rewrite (every 250 ms) then races the taker's read (after its lease
// create and before the consumer's reset): the rewrite usually wins, not
// always.
//
// Pacing (the token bucket a key is sent through after its pause, package
// throttle) is not in the bucket: no code writes "pace:" keys. It is each
// relay's own, in its process's throttle. After a failover the new owner
// has no pacing state for the partition's keys: a key's pause (in the
// bucket) still holds, but once it ends the key is sent unpaced until the
// upstream refuses it again (a 429, which pauses and paces it anew on the
// relay that got it). So a failover may cost a paced key one more 429.
//
// # Goroutines
//
// Open starts the pause watcher and rewriter, the lane stops' watcher, one committer
// per stream and, with more than one stream, the rebalancing loop (all
// stopped by Close, which waits for the committers' batches in flight,
// each bounded by PublishTimeout, and for a rebalancing run, bounded by
// its context). Run owns the heartbeat
// loop, the per-tick goroutines of its KV operations (waited for within the
// tick) and one goroutine per owned partition (opening it, then calling
// deliver); it returns after every deliver returned and every lease was
// released. A Partition's keep-alive goroutine lives as long as its
// deliver call. Locks: Partition.mu (its handed-out messages),
// pauses.mu (the pause map) and metrics.mu (the leader gauge's label set),
// never held together nor across a call into another package; gauges read
// atomics.
//
// # Metrics
//
// See metrics.go: relay_fleet_append_seconds,
// relay_fleet_append_failures_total{reason}, relay_fleet_partitions_owned,
// relay_fleet_messages_held, relay_fleet_partition_backlog{partition},
// relay_fleet_batch_requests, relay_fleet_multi_stream_appends_total,
// relay_fleet_stream_leaders{node}.
package fleet
