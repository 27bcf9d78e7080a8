package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/svcrelay/relay/internal/storage"
)

// Request is what one ingest request appends: records of one lane. ID,
// when set, names the request in the stream's deduplication: its records
// are published apart from other requests' (Nats-Msg-Id is
// ID-partition-part), so that an Append retried with the same ID within
// Config.DedupWindow is stored once (the admin API's dead-letter replay
// sets it). Empty (the ingest, the form intakes) means the request shares
// its batch with others in flight (group commit).
type Request struct {
	ID       string
	Lane     storage.LaneKey
	Accepted time.Time // zero means now
	Records  []storage.Record
}

// PartitionOf is the partition of an order key: FNV-1a mod p, the same on
// every relay.
func PartitionOf(orderKey []byte, p int) int {
	h := fnv.New32a()
	h.Write(orderKey)
	return int(h.Sum32() % uint32(p))
}

// frag is the encoded records of one request in one partition, at most a
// message's worth: a message's body is its header, then the frags of one
// lane and partition, each request's in order, then its checksum.
type frag struct {
	partition int
	n         int    // records
	b         []byte // encodeRecords
}

// pending is one request's part in one stream, waiting for its batch.
type pending struct {
	id       string // Request.ID; "" shares a batch
	lane     storage.LaneKey
	accepted time.Time
	frags    []frag
	size     int
	done     chan error // buffered: the committer never blocks on it
}

// Append stores req's records, grouped by partition, all or none: it
// returns nil only once every record is stored on a quorum. Each record
// goes to its partition's stream; the request's part in a stream is
// published by that stream's committer (committer.go) in one atomic batch
// with the parts of other requests in flight. On failure nothing of the
// request is stored when it lies in one stream; see the package
// documentation (Ingest) for a request over several and for
// ErrUnavailable. ctx bounds the wait, as does Config.PublishTimeout.
func (f *Fleet) Append(ctx context.Context, req Request) error {
	if len(req.Records) == 0 {
		return nil
	}
	if req.ID != "" && (len(req.ID) > 64 || sanitize(req.ID) != req.ID) {
		return fmt.Errorf("fleet: request id %q: at most 64 letters, digits, - and _", req.ID)
	}
	if req.Accepted.IsZero() {
		req.Accepted = time.Now()
	}
	parts, size, err := f.parts(&req)
	if err != nil {
		f.m.appendFailed(err)
		return err
	}
	u := f.usage[req.Lane.Kind]
	if f.cfg.MaxBytes > 0 {
		if used := u.get(f); used+int64(size) > f.cfg.MaxBytes {
			err := fmt.Errorf("append %d records (%d bytes) to %s, holding %d bytes of %d: %w",
				len(req.Records), size, req.Lane.Kind, used, f.cfg.MaxBytes, ErrFull)
			f.m.appendFailed(err)
			return err
		}
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	defer cancel()
	var sent []*pending
	for g, p := range parts {
		if p == nil {
			continue
		}
		c := f.commit[req.Lane.Kind][g]
		select {
		case c.in <- p:
			sent = append(sent, p)
			continue
		case <-c.stopc:
			err = fmt.Errorf("fleet: closed: %w", ErrUnavailable)
		case <-ctx.Done():
			err = fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
		}
		break
	}
	for _, p := range sent {
		var perr error
		select {
		case perr = <-p.done:
		case <-ctx.Done():
			// The batch is bounded by PublishTimeout too and may still be
			// stored: unknown, as after a lost answer.
			perr = fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
		}
		// ErrFull wins: a stream refused the request for space.
		if perr != nil && (err == nil || errors.Is(perr, ErrFull)) {
			err = perr
		}
	}
	if err != nil {
		err = fmt.Errorf("append %d records to %s: %w", len(req.Records), req.Lane.Kind, unavailable(err))
		f.m.appendFailed(err)
		return err
	}
	if len(sent) > 1 {
		f.m.multiStream.Add(1)
	}
	u.add(int64(size))
	f.m.appendSeconds.Observe(time.Since(start).Seconds())
	return nil
}

// errTooLarge: a record larger than a message may be.
var errTooLarge = errors.New("fleet: record larger than a message may be")

// parts groups req's records by stream and partition, keeping their order
// within each partition, and encodes them (copies: the records stay the
// caller's), in frags of at most a message's worth.
func (f *Fleet) parts(req *Request) ([]*pending, int, error) {
	p := f.cfg.Partitions
	byPart := make([][]storage.Record, p)
	// An SDK's request is mostly one device's: the leading run of one
	// partition's records is taken as it is, not copied (capped, so that
	// appending what follows copies it rather than writing over the
	// request), and each record's partition is computed once.
	first, k := PartitionOf(req.Records[0].OrderKey, p), 1
	for k < len(req.Records) && PartitionOf(req.Records[k].OrderKey, p) == first {
		k++
	}
	byPart[first] = req.Records[:k:k]
	for _, r := range req.Records[k:] {
		i := PartitionOf(r.OrderKey, p)
		byPart[i] = append(byPart[i], r)
	}
	h := header{lane: req.Lane, accepted: req.Accepted}
	limit := f.cfg.MaxMessageBytes - h.size() - 4
	out := make([]*pending, f.cfg.Streams)
	total := 0
	for i, recs := range byPart {
		if len(recs) == 0 {
			continue
		}
		g := i % f.cfg.Streams
		pd := out[g]
		if pd == nil {
			pd = &pending{id: req.ID, lane: req.Lane, accepted: req.Accepted, done: make(chan error, 1)}
			out[g] = pd
		}
		for len(recs) > 0 {
			// Take records while they fit.
			size, k := 0, 0
			for k < len(recs) && size+recordSize(&recs[k]) <= limit {
				size += recordSize(&recs[k])
				k++
			}
			if k == 0 {
				return nil, 0, fmt.Errorf("%w: %d bytes, at most %d (MaxMessageBytes)", errTooLarge, recordSize(&recs[0]), limit)
			}
			b := encodeRecords(make([]byte, 0, size), recs[:k])
			pd.frags = append(pd.frags, frag{partition: i, n: k, b: b})
			pd.size += len(b)
			total += len(b)
			recs = recs[k:]
		}
	}
	return out, total, nil
}

// usage is a lane kind's stored bytes as this relay knows them, for
// Config.MaxBytes: read from the kind's streams at most every
// usageRefresh, plus what this relay appended since.
type usage struct {
	bytes      atomic.Int64
	at         atomic.Int64 // when read, UnixNano; 0: never
	refreshing atomic.Bool
}

const usageRefresh = 250 * time.Millisecond

// get returns the kind's bytes, reading them from the cluster first when
// the last reading is older than usageRefresh (one caller at a time; the
// others take the last reading).
func (u *usage) get(f *Fleet) int64 {
	if time.Since(time.Unix(0, u.at.Load())) > usageRefresh && u.refreshing.CompareAndSwap(false, true) {
		defer u.refreshing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), min(f.cfg.PublishTimeout, 2*time.Second))
		defer cancel()
		var sum int64
		ok := true
		for k, cs := range f.commit {
			if f.usage[k] != u {
				continue
			}
			for _, c := range cs {
				s, err := f.js.Stream(ctx, c.stream)
				if err != nil {
					ok = false // keep the last reading; the server's bound still holds
					break
				}
				sum += int64(s.CachedInfo().State.Bytes)
			}
		}
		if ok {
			u.bytes.Store(sum)
			u.at.Store(time.Now().UnixNano())
		}
	}
	return u.bytes.Load()
}

func (u *usage) add(n int64) { u.bytes.Add(n) }

// outMsg is one message of a batch.
type outMsg struct {
	subject string
	id      string
	body    []byte
	plain   [][]byte // what body compressed, kept in recent: the partition is read here
}

// pubAnswer is a JetStream publish acknowledgement or error.
type pubAnswer struct {
	Stream    string `json:"stream"`
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate"`
	Count     int    `json:"count"`
	Error     *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// publishError is a JetStream error answer to a publish.
type publishError struct {
	Code, ErrCode int
	Description   string
}

func (e *publishError) Error() string {
	return fmt.Sprintf("jetstream: %s (status %d, code %d)", e.Description, e.Code, e.ErrCode)
}

// answer classifies a publish answer: nil when stored (or already stored).
func answer(m *nats.Msg, stream string) error {
	var a pubAnswer
	if err := json.Unmarshal(m.Data, &a); err != nil {
		return fmt.Errorf("jetstream: unreadable publish answer: %w", err)
	}
	if a.Error == nil {
		if a.Stream != stream {
			return fmt.Errorf("jetstream: stored in stream %q, want %q", a.Stream, stream)
		}
		return nil
	}
	e := &publishError{Code: a.Error.Code, ErrCode: a.Error.ErrCode, Description: a.Error.Description}
	switch e.ErrCode {
	case errCodeBatchDuplicate:
		// Every id of the batch was stored by an earlier attempt (the
		// batch is atomic, so all of them were).
		return nil
	case errCodeInsufficientResources:
		return fmt.Errorf("%w: %w", ErrFull, e)
	case errCodeStoreFailed:
		if e.Description == "maximum bytes exceeded" || e.Description == "maximum messages exceeded" {
			return fmt.Errorf("%w: %w", ErrFull, e)
		}
	}
	return e
}

func isRetryableAnswer(err error) bool {
	var e *publishError
	if errors.Is(err, ErrFull) || !errors.As(err, &e) {
		return false
	}
	switch e.ErrCode {
	case errCodeBatchIncomplete, errCodeDuplicateInProcess, errCodeTooManyBatches:
		return true
	}
	return e.Code == 503 || e.Code == 408
}

func (f *Fleet) attemptCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, min(f.cfg.PublishTimeout, 2*time.Second))
}

// publish stores msgs in stream, all or none, retrying what may succeed
// (a time-out, a lost leader) with the same message ids until ctx ends:
// what an earlier attempt stored is absorbed by the stream's dedup.
func (f *Fleet) publish(ctx context.Context, stream string, msgs []outMsg) error {
	var err error
	for attempt := 0; ; attempt++ {
		if len(msgs) == 1 {
			err = f.publishOne(ctx, stream, msgs[0])
		} else {
			// A retry asks for an answer to every message of the batch,
			// so that a message the stream refuses (the batch is then
			// abandoned, and the commit only says "incomplete") is
			// reported for what it is instead of retried until the
			// time-out.
			err = f.publishBatch(ctx, stream, msgs, attempt > 0)
		}
		if err == nil || errors.Is(err, ErrFull) || !(errors.Is(err, ErrUnavailable) || retryable(err)) {
			return err
		}
		// Wait a little (a leader election takes about a second), then
		// send the same ids again: what was stored is absorbed.
		wait := min(time.Duration(50<<min(attempt, 4))*time.Millisecond, 500*time.Millisecond)
		select {
		case <-ctx.Done():
			return unavailable(err)
		case <-time.After(wait):
		}
	}
}

// publishOne publishes a single message with its dedup id.
func (f *Fleet) publishOne(ctx context.Context, stream string, m outMsg) error {
	msg := &nats.Msg{Subject: m.subject, Data: m.body, Header: nats.Header{}}
	msg.Header.Set(nats.MsgIdHdr, m.id)
	msg.Header.Set(nats.ExpectedStreamHdr, stream)
	actx, cancel := f.attemptCtx(ctx)
	defer cancel()
	resp, err := f.nc.RequestMsgWithContext(actx, msg)
	if err != nil {
		return err
	}
	err = answer(resp, stream)
	if isRetryableAnswer(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// publishBatch publishes msgs as one atomic batch: every message but the
// last without a reply (with one when ackEach), the last with the commit
// header and a reply. The server stores all or none.
func (f *Fleet) publishBatch(ctx context.Context, stream string, msgs []outMsg, ackEach bool) error {
	batch := nuid.Next()
	for i, m := range msgs {
		msg := &nats.Msg{Subject: m.subject, Data: m.body, Header: nats.Header{}}
		msg.Header.Set(nats.MsgIdHdr, m.id)
		msg.Header.Set(nats.ExpectedStreamHdr, stream)
		msg.Header.Set("Nats-Batch-Id", batch)
		msg.Header.Set("Nats-Batch-Sequence", strconv.Itoa(i+1))
		if i < len(msgs)-1 && !ackEach {
			if err := f.nc.PublishMsg(msg); err != nil {
				return err
			}
			continue
		}
		if i < len(msgs)-1 {
			// Staged messages are answered with an empty body, or an error.
			actx, cancel := f.attemptCtx(ctx)
			resp, err := f.nc.RequestMsgWithContext(actx, msg)
			cancel()
			if err != nil {
				return err
			}
			if len(resp.Data) > 0 {
				err = answer(resp, stream)
				if isRetryableAnswer(err) {
					return fmt.Errorf("%w: %w", ErrUnavailable, err)
				}
				if err != nil {
					return err
				}
			}
			continue
		}
		msg.Header.Set("Nats-Batch-Commit", "1")
		actx, cancel := f.attemptCtx(ctx)
		resp, err := f.nc.RequestMsgWithContext(actx, msg)
		cancel()
		if err != nil {
			return err
		}
		err = answer(resp, stream)
		if isRetryableAnswer(err) {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	return nil
}
