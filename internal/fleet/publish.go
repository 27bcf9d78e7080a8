package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/svcrelay/relay/internal/spool"
)

// Request is what one ingest request appends: records of one lane. Its
// ID names the request in the stream's deduplication (Nats-Msg-Id is
// ID-partition-part), so that a publish retried with the same ID within
// Config.DedupWindow is stored once. The ingest should derive it from the
// api_key and the body when every event carries an insert_id (a client's
// retry of the same body is then absorbed), and leave it empty otherwise:
// empty means a fresh id (storage.IDs: unique across relays and restarts).
type Request struct {
	ID       string
	Lane     spool.LaneKey
	Accepted time.Time // zero means now
	Records  []spool.Record
}

// PartitionOf is the partition of an order key: FNV-1a mod p, the same on
// every relay.
func PartitionOf(orderKey []byte, p int) int {
	h := fnv.New32a()
	h.Write(orderKey)
	return int(h.Sum32() % uint32(p))
}

// outMsg is one message of an Append.
type outMsg struct {
	stream  string
	subject string
	id      string
	body    []byte
}

// Append stores req's records, grouped by partition, as one message per
// partition (split at Config.MaxMessageBytes), all or none: it returns nil
// only once every message is stored on a quorum. On failure nothing of the
// request is stored, except after ErrUnavailable, when it is unknown (see
// the package documentation, Ingest). ctx bounds the whole call, as does
// Config.PublishTimeout.
func (f *Fleet) Append(ctx context.Context, req Request) error {
	if len(req.Records) == 0 {
		return nil
	}
	if req.ID == "" {
		req.ID = f.ids.Next()
	} else if len(req.ID) > 64 || sanitize(req.ID) != req.ID {
		return fmt.Errorf("fleet: request id %q: at most 64 letters, digits, - and _", req.ID)
	}
	if req.Accepted.IsZero() {
		req.Accepted = time.Now()
	}
	msgs := f.messages(&req)
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	defer cancel()
	var err error
	for attempt := 0; ; attempt++ {
		if len(msgs) == 1 {
			err = f.publishOne(ctx, msgs[0])
		} else {
			// A retry asks for an answer to every message of the batch,
			// so that a message the stream refuses (the batch is then
			// abandoned, and the commit only says "incomplete") is
			// reported for what it is instead of retried until the
			// time-out.
			err = f.publishBatch(ctx, msgs, attempt > 0)
		}
		if err == nil || errors.Is(err, ErrFull) || !(errors.Is(err, ErrUnavailable) || retryable(err)) {
			break
		}
		// Wait a little (a leader election takes about a second), then
		// send the same ids again: what was stored is absorbed.
		wait := min(time.Duration(50<<min(attempt, 4))*time.Millisecond, 500*time.Millisecond)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
			continue
		}
		break
	}
	if err != nil {
		err = fmt.Errorf("append %d records to %s: %w", len(req.Records), f.n.stream(req.Lane.Kind), unavailable(err))
		f.m.appendFailed(err)
		return err
	}
	f.m.appendSeconds.Observe(time.Since(start).Seconds())
	return nil
}

// messages groups req's records by partition, keeping their order within
// each partition, and encodes them.
func (f *Fleet) messages(req *Request) []outMsg {
	p := f.cfg.Partitions
	parts := make([][]spool.Record, p)
	for _, r := range req.Records {
		i := PartitionOf(r.OrderKey, p)
		parts[i] = append(parts[i], r)
	}
	h := header{lane: req.Lane, accepted: req.Accepted}
	limit := f.cfg.MaxMessageBytes - h.size() - 4
	var msgs []outMsg
	for i, recs := range parts {
		for n := 0; len(recs) > 0; n++ {
			// Take records while they fit (at least one: a single record
			// larger than the limit goes alone and the server decides).
			size, k := recordSize(&recs[0]), 1
			for k < len(recs) && size+recordSize(&recs[k]) <= limit {
				size += recordSize(&recs[k])
				k++
			}
			msgs = append(msgs, outMsg{
				stream:  f.n.stream(req.Lane.Kind),
				subject: f.n.subject(req.Lane.Kind, i),
				id:      req.ID + "-" + strconv.Itoa(i) + "-" + strconv.Itoa(n),
				body:    encode(make([]byte, 0, h.size()+size+4), &h, recs[:k]),
			})
			recs = recs[k:]
		}
	}
	return msgs
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

// publishOne publishes a single message with its dedup id.
func (f *Fleet) publishOne(ctx context.Context, m outMsg) error {
	stream := m.stream
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
func (f *Fleet) publishBatch(ctx context.Context, msgs []outMsg, ackEach bool) error {
	stream := msgs[0].stream
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
