package delivery

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
)

// item is one record on its way upstream.
type item struct {
	rec storage.Record
	ck  *chunkRef
	enq time.Time // when the shard got it (flush timer)
	// own is the memory of the record's own copy (detach), counted against
	// the read-ahead budget; 0 while rec aliases its chunk's buffer.
	own int64
}

// itemBytes is what one record costs besides its bytes: its item in the
// hand-over slices and the shard's queues.
const itemBytes = int64(unsafe.Sizeof(item{}))

// chunkRef tracks one chunk, or one part of a chunk (NextPart), read from
// the store: the last of its records aliasing buf releases its bytes from
// the read-ahead budget and gives buf back; in ack, the last of the chunk's
// records to be done acks the chunk.
type chunkRef struct {
	ack      *ackRef
	accepted time.Time
	bytes    int64        // counted against the read-ahead budget while refs > 0
	refs     atomic.Int32 // records not done and not detached
	buf      storage.Buffer
}

// ackRef counts the records of one chunk (all its parts) not yet done.
type ackRef struct {
	seq  uint64
	left atomic.Int32
}

// chunkBytes is the memory a chunk (or part) holds until its last record
// is done or detached: its buffer (all records alias one allocation of at
// least Size bytes) and an item per record.
func chunkBytes(c *storage.Chunk) int64 {
	return int64(max(c.Size, c.Buffer.Cap)) + int64(len(c.Records))*itemBytes
}

// readEnd is why the reader ended.
type readEnd int

const (
	endStop    readEnd = iota // ctx ended, or the spool closed
	endRetired                // the spool retired the lane
	endIdle                   // nothing to read and every record read is done
)

// read is the lane's reader: it reads chunks within the read-ahead budget
// and hands each record to the shard its OrderKey hashes to.
func (lr *laneRunner) read(ctx context.Context) readEnd {
	limit := int64(lr.p.cfg.MaxReadAheadBytes)
	step := lr.step()
	per := make([][]item, len(lr.shards))
	var recs []storage.Record // reused by NextPart: every record is copied into an item
	failing := false          // the last read failed (logged once, until one succeeds)
	for {
		// Wait for records first, then take the budget: a lane waiting
		// for records holds none of it.
		if err := lr.src.Wait(ctx, func() bool {
			// Idle: keep no slices of the largest read's size.
			clear(per)
			recs = nil
			return lr.settled()
		}); err != nil {
			switch {
			case errors.Is(err, storage.ErrRetired):
				return endRetired
			case errors.Is(err, storage.ErrIdle):
				return endIdle
			}
			return endStop
		}
		free, ok := lr.waitBudget(ctx, limit, func() {
			clear(per) // with many lanes, most wait here
			recs = nil
		})
		if !ok {
			return endStop
		}
		want := min(free, step)
		lr.p.budget.add(want - free) // reserved: free; wanted: want
		chunks, more, err := lr.src.NextPart(doneCtx, int(want), recs)
		recs = more
		if err != nil {
			lr.p.budget.add(-want)
			switch {
			case errors.Is(err, storage.ErrRetired):
				return endRetired
			case ctx.Err() != nil || errors.Is(err, storage.ErrLost):
				return endStop
			case errors.Is(err, context.Canceled):
				continue // doneCtx: acknowledged meanwhile, nothing to read
			}
			// A read error (e.g. a damaged chunk's dead letters not
			// written): log it once and try again every second rather
			// than give the lane up silently.
			if !failing {
				lr.p.log.Error("read lane; retrying every 1s", zap.String("lane", lr.label), zap.Error(err))
				failing = true
			}
			if !sleep(ctx, time.Second) {
				return endStop
			}
			continue
		}
		if failing {
			lr.p.log.Info("read lane: reading again", zap.String("lane", lr.label))
			failing = false
		}
		now := time.Now()
		var total int64
		for _, c := range chunks {
			if len(c.Records) == 0 {
				lr.src.Ack(c.Seq)
				continue
			}
			ck := &chunkRef{ack: lr.ackOf(&c), accepted: c.Accepted, bytes: chunkBytes(&c), buf: c.Buffer}
			ck.refs.Store(int32(len(c.Records)))
			total += ck.bytes
			for _, r := range c.Records {
				i := shardOf(lr.p.seed, r.OrderKey, len(lr.shards))
				per[i] = append(per[i], item{rec: r, ck: ck, enq: now})
			}
		}
		clear(recs) // the items hold the records now: keep no chunk's buffer alive
		recs = recs[:0]
		lr.acquire(total, want)
		for i, its := range per {
			if len(its) == 0 {
				continue
			}
			lr.shard(i).give(its)
			clear(its)
			per[i] = its[:0]
		}
	}
}

// settled reports whether every record read is done (none queued, held,
// in flight or being dead-lettered: each counts in readAhead until done)
// and no chunk is half read: the lane's goroutines may end.
func (lr *laneRunner) settled() bool { return lr.readAhead.Load() == 0 && lr.partial == nil }

// ackOf returns the ackRef of the chunk c is (a part of): a new one for a
// whole chunk or a first part, the one of the earlier parts otherwise.
// Reader goroutine only.
func (lr *laneRunner) ackOf(c *storage.Chunk) *ackRef {
	total := max(c.Total, len(c.Records))
	if c.First == 0 || lr.partial == nil || lr.partial.seq != c.Seq {
		// A later part without the first (not expected: the reader
		// keeps its place across Run calls) counts only its own and
		// the following records.
		a := &ackRef{seq: c.Seq}
		a.left.Store(int32(total - c.First))
		lr.partial = a
	}
	a := lr.partial
	if c.First+len(c.Records) >= total {
		lr.partial = nil // the chunk's last part
	}
	return a
}

// step is the most one NextPart reads.
func (lr *laneRunner) step() int64 {
	return min(max(int64(lr.p.cfg.MaxReadAheadBytes)/8, 1), maxNextBytes)
}

// progress opens the read-ahead window (to a step, then doubling up to
// the lane's budget) whenever the upstream answered and records are done (a
// 200, dead letters) or parked (held for a paused key, so that later keys
// can be read and sent).
func (lr *laneRunner) progress() {
	if w, limit := lr.window.Load(), int64(lr.p.cfg.MaxReadAheadBytes); w < limit {
		lr.window.Store(min(max(2*w, lr.step()), limit))
		poke(lr.bwake)
	}
}

// maxNextBytes bounds one NextPart (as does an eighth of the budget): the
// read-ahead fills in steps, so shards start sending early.
const maxNextBytes = 4 << 20

// shardOf hashes key to one of n shards. The same key goes to the same
// shard for the pipeline's life (one seed), which is all that order needs:
// a restart reads and shards every undelivered record again. (maphash
// uses the CPU's AES instructions; the byte-at-a-time FNV-1a it replaced
// was 4% of the relay's CPU at 100-event load.)
func shardOf(seed maphash.Seed, key []byte, n int) int {
	return int(maphash.Bytes(seed, key) % uint64(n))
}

// waitBudget waits until the lane may read by the package doc's rule
// (Memory and back-pressure) and returns the bytes it reserved in the
// pipeline's budget (acquire turns them into what was read), or false when
// ctx ends. idle is called once before the first wait.
func (lr *laneRunner) waitBudget(ctx context.Context, limit int64, idle func()) (int64, bool) {
	total := lr.p.budget
	for {
		in := lr.readAhead.Load()
		lim := min(limit, max(lr.window.Load(), minWindow))
		if lr.stop.Stopped() {
			lim = min(lim, minWindow) // it sends nothing: read no more than a failing lane
		}
		var freed <-chan struct{}
		if in < lim {
			var n int64
			if n, freed = total.reserve(lim-in, in == 0); n > 0 {
				lr.readerWaits.Store(false)
				return n, true
			}
		}
		// Held by the window, the lane's budget or the pipeline's: the
		// shards get no more until they send, so they must not wait for
		// full batches (a budget smaller than the shards' batches would
		// otherwise deliver one flush interval at a time).
		if !lr.readerWaits.Swap(true) {
			for _, s := range lr.shards {
				if s != nil {
					poke(s.wake)
				}
			}
		}
		if idle != nil {
			idle()
			idle = nil
		}
		select {
		case <-lr.bwake:
		case <-freed:
		case <-ctx.Done():
			return 0, false
		}
	}
}

// minWindow is what a lane reads ahead at the start and while every shard
// fails: a few records, not a chunk (which can be a 20 MB request).
const minWindow = 32 << 10

// shareOf is the part of the total read-ahead any lane may use; the rest is
// for lanes that hold nothing (see waitBudget).
func shareOf(total int64) int64 { return total - total/4 }

// doneCtx makes NextPart return at once when the lane has nothing to read
// (the reader waited in Lane.Wait before it took its budget).
var doneCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// acquire counts n bytes read against the lane's budget and turns reserved
// bytes of the pipeline's (waitBudget) into them.
func (lr *laneRunner) acquire(n, reserved int64) {
	lr.readAhead.Add(n)
	lr.p.budget.add(n - reserved)
}

func (lr *laneRunner) release(n int64) {
	if n != 0 {
		lr.acquire(-n, 0)
		poke(lr.bwake)
	}
}

// poke wakes the goroutine waiting on c, if one waits (c has room for one).
func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// budget is the read-ahead of all lanes of a Pipeline together.
type budget struct {
	limit int64

	mu    sync.Mutex
	used  int64
	freed chan struct{} // closed and replaced when used falls while at or above the share
}

func newBudget(limit int64) *budget {
	return &budget{limit: limit, freed: make(chan struct{})}
}

func (b *budget) add(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	was := b.used
	b.used += n
	// Readers wait while the total is at or above its share (see
	// waitBudget): wake them at every release from there.
	if n < 0 && was >= shareOf(b.limit) {
		close(b.freed)
		b.freed = make(chan struct{})
	}
}

// reserve takes up to want bytes while the total is under its share, or,
// for a lane that holds nothing, under its limit; it returns what it took
// and a channel closed at the next release.
func (b *budget) reserve(want int64, empty bool) (int64, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var n int64
	switch share := shareOf(b.limit); {
	case b.used < share:
		n = min(want, share-b.used)
	case empty && b.used < b.limit:
		n = min(want, b.limit-b.used)
	}
	b.used += n
	return n, b.freed
}

// Used is the read-ahead of all lanes.
func (b *budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// done marks items delivered or dead-lettered: it acks every chunk whose
// last record this was and releases the read-ahead bytes they held.
func (lr *laneRunner) done(its []item) {
	var n int64
	// A batch holds a chunk's records for this shard one after another, so
	// the chunk counters are decremented once per run of records: each
	// decrement is an atomic on a line the other shards write too.
	for i := 0; i < len(its); {
		ck := its[i].ck
		var left, refs int32
		for ; i < len(its) && its[i].ck == ck; i++ {
			left++
			if its[i].own > 0 {
				n += its[i].own
			} else {
				refs++
			}
		}
		if refs > 0 && ck.refs.Add(-refs) == 0 {
			n += ck.bytes
			ck.buf.Release()
		}
		if ck.ack.left.Add(-left) == 0 {
			lr.src.Ack(ck.ack.seq)
		}
	}
	lr.release(n)
}

// detach gives the record its own copy (counted against the budget), so
// that it no longer pins its chunk's buffer: a record held for a paused key
// may wait for hours (daily quota). Idempotent.
func (lr *laneRunner) detach(it *item) {
	if it.own > 0 {
		return
	}
	r := &it.rec
	buf := make([]byte, 0, len(r.OrderKey)+len(r.UserID)+len(r.Data))
	r.OrderKey, buf = own(buf, r.OrderKey)
	r.UserID, buf = own(buf, r.UserID)
	r.Data, buf = own(buf, r.Data)
	it.own = int64(cap(buf)) + itemBytes
	lr.acquire(it.own, 0)
	if it.ck.refs.Add(-1) == 0 {
		lr.release(it.ck.bytes)
		it.ck.buf.Release()
	}
}

// own appends b to buf and returns the copy (nil for empty b) and buf.
func own(buf, b []byte) ([]byte, []byte) {
	if len(b) == 0 {
		return nil, buf
	}
	at := len(buf)
	buf = append(buf, b...)
	return buf[at:len(buf):len(buf)], buf
}
