package storage

import (
	"context"
	"errors"
	"time"
)

// ErrFull is returned (wrapped) by Append when the store refuses the
// request for space (its quota or the disk's reserve): nothing of it was
// stored. The ingest answers 503 with Retry-After.
var ErrFull = errors.New("storage: full")

// ErrUnavailable is returned (wrapped) when the store did not answer in
// time. After Append the request may or may not be stored (whole, if it
// is); the ingest answers 503 with Retry-After.
var ErrUnavailable = errors.New("storage: unavailable")

// ErrLost is returned (wrapped) by a Reader once its queue is no longer
// this process's to read: the local spool closed, or the fleet moved the
// partition to another relay. The deliver function returns then.
var ErrLost = errors.New("storage: queue lost")

// Request is what one request appends: records of one lane.
type Request struct {
	// ID names the request for a backend that deduplicates retried
	// appends (the fleet: a request appended again with the same ID within
	// its dedup window is stored once; it is then published apart from
	// other requests); empty means none (the fleet group-commits it with
	// other requests). The local spool ignores it. At most 64 bytes of
	// letters, digits, - and _.
	ID string
	// Kind, APIKey and Options name the lane (LaneKey, see Lane),
	// as bytes: the ingest names it with slices of the request, and the
	// local spool finds a lane it appended to before without allocating.
	Kind            Kind
	APIKey, Options []byte
	Accepted        time.Time // zero means now; the local spool always uses now
	// Batch holds the records (nil or empty: nothing to store). Append
	// may take its memory over (the local spool does, and leaves it
	// empty); it is not to be used until Append returns, and is Reset
	// before it is built again.
	Batch *Batch
}

// Lane is the key of req's lane.
func (req *Request) Lane() LaneKey {
	return LaneKey{Kind: req.Kind, APIKey: string(req.APIKey), Options: string(req.Options)}
}

// Message is the unit of reading and of acknowledgement: records of one
// lane from one request (the fleet may split a request's records by
// partition and size; a key's records of one request stay in one message
// or in consecutive ones of one queue).
type Message struct {
	// Seq increases within the queue; it is the backend's (local: the
	// chunk's sequence in its lane; fleet: the stream sequence).
	Seq      uint64
	Lane     LaneKey
	Accepted time.Time
	// Records are valid until the message is acknowledged.
	Records []Record
}

// Appender is what the ingest, the form intakes and the dead-letter
// replay need.
type Appender interface {
	// Append stores req's records durably, all or none (see the package
	// documentation), and returns once they are durable.
	Append(ctx context.Context, req Request) error
}

// Reader is one queue, read in order by one delivery loop.
type Reader interface {
	// Next returns the queue's next message, blocking until there is one.
	// It returns ctx.Err() when ctx ends and an error wrapping ErrLost
	// when the queue is no longer this process's to read.
	Next(ctx context.Context) (*Message, error)
	// Ack says every record of m was answered 200 or is a committed dead
	// letter; m's records are not to be read after it.
	Ack(ctx context.Context, m *Message) error
}

// DeliverFunc delivers one queue: it reads with r.Next until that fails
// (or ctx ends) and acknowledges what is done. ctx ends when the queue is
// no longer this process's (Run stopping, the fleet moving a partition);
// the function must then stop sending and return. Its error is logged.
type DeliverFunc func(ctx context.Context, r Reader) error

// Owner is what the delivery engine needs to be handed its queues.
type Owner interface {
	// Run calls deliver once per queue this process reads, each in its own
	// goroutine, until ctx ends; it returns after every deliver returned.
	Run(ctx context.Context, deliver DeliverFunc) error
}

// DeadWriter is what the delivery engine needs to put records aside.
type DeadWriter interface {
	// PutDead stores dead letters and returns once they are durable; it
	// sets their IDs (increasing, never reused).
	PutDead(ctx context.Context, dls []DeadLetter) error
}

// DeadLetters is the dead-letter store as the admin API uses it.
type DeadLetters interface {
	DeadWriter
	// ListDead returns up to limit dead letters with ID > after that
	// match f, by ID.
	ListDead(ctx context.Context, f DeadFilter, after uint64, limit int) ([]DeadLetter, error)
	// DeleteDead removes the dead letters with the given ids; unknown ids
	// are ignored.
	DeleteDead(ctx context.Context, ids []uint64) error
}

// Backend is a whole store, as cmd/relay composes it and storagetest
// checks it.
type Backend interface {
	Appender
	Owner
	DeadLetters
	// Close releases the backend; unacknowledged messages stay for the
	// next Open (or owner).
	Close() error
}

// ErrIdle is returned by Lane.Wait when its onIdle says the reader may
// end: a deliver function returns it, and the backend calls deliver again
// at the lane's next record, so that an idle lane holds no goroutine.
var ErrIdle = errors.New("storage: lane idle")

// ErrRetired is returned by a Lane once it was retired (empty and idle):
// its deliverer is done with it for good, and a deliver function that
// returns it is not called again for the lane.
var ErrRetired = errors.New("storage: lane retired")

// Chunk is a group of records of a lane as a Lane reads them: the records
// of one Append (or of one Message), or a part of them.
type Chunk struct {
	Seq      uint64
	Accepted time.Time // when Append was called (millisecond precision)
	// Records alias the store's memory; valid until the caller releases
	// the Buffer (or forever, if it never does).
	Records []Record
	// Size is the encoded size counted against the store's bounds (of the
	// part, for a part: see Lane.NextPart).
	Size int
	// Buffer is the memory the records alias, for a caller that can tell
	// when they are no longer read (see Buffer.Release).
	Buffer Buffer
	// First is the index in the chunk of Records[0] and Total the chunk's
	// record count, set by NextPart (a part has Total > len(Records)).
	First, Total int
}

// Lane is one lane's records as its delivery reads them, with read-ahead
// by a byte budget: the queue of a LaneQueue (the local spool), or a
// lane's messages of a partition as delivery demultiplexes them (the
// fleet). One reader goroutine calls Wait and NextPart; Ack may be
// called from any goroutine.
type Lane interface {
	// Wait returns nil when there may be something to read, ctx.Err()
	// when ctx ends, an error wrapping ErrLost when the store closed and
	// one wrapping ErrRetired once the lane is retired. onIdle, when not
	// nil, is called before a long wait; when it returns true, Wait may
	// return ErrIdle (the local spool does; a fleet lane ends by its own
	// idle rule, ErrRetired).
	Wait(ctx context.Context, onIdle func() bool) error
	// NextPart reads up to maxBytes (at least one record: a chunk larger
	// than maxBytes may be read in parts) into recs' memory; with a done
	// ctx it returns at once when there is nothing to read.
	NextPart(ctx context.Context, maxBytes int, recs []Record) ([]Chunk, []Record, error)
	// Ack says every record of chunk seq was answered 200 or is a
	// committed dead letter.
	Ack(seq uint64)
}

// LaneQueue is a Reader whose queue is one lane (the local spool's), read
// through Lane (with read-ahead) instead of Next and Ack.
type LaneQueue interface {
	Reader
	Lane() QueueLane
}

// QueueLane is the lane of a LaneQueue.
type QueueLane interface {
	Lane
	// ID is the lane's id, unique in the store and never reused (as the
	// admin API names lanes).
	ID() uint64
	Key() LaneKey
	// Pin keeps the lane from retiring until as many Unpin calls (a
	// stopped lane keeps its stop while empty).
	Pin()
	Unpin()
}
