package batcher

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/spool"
)

// item is one record on its way upstream.
type item struct {
	rec  spool.Record
	ck   *chunkRef
	enq  time.Time // when the shard got it (flush timer)
	size int64     // bytes counted against the read-ahead budget
}

// chunkRef counts a chunk's records not yet done; the last one acks it.
type chunkRef struct {
	seq      uint64
	accepted time.Time
	left     atomic.Int32
}

// read is the lane's reader: it reads chunks within the read-ahead budget
// and hands each record to the shard its OrderKey hashes to.
func (lr *laneRunner) read(ctx context.Context) {
	max := int64(lr.p.cfg.MaxReadAheadBytes)
	per := make([][]item, len(lr.shards))
	for {
		free, ok := lr.waitBudget(ctx, max)
		if !ok {
			return
		}
		chunks, err := lr.lane.Next(ctx, int(min(free, maxNextBytes)))
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, spool.ErrClosed) {
				return
			}
			// A read error (e.g. a corrupt chunk): log it and try again
			// later rather than give the lane up silently.
			lr.p.log.Error("read lane; retrying in 1s", zap.String("lane", lr.label), zap.Error(err))
			select {
			case <-time.After(time.Second):
				continue
			case <-ctx.Done():
				return
			}
		}
		now := time.Now()
		var total int64
		for _, c := range chunks {
			if len(c.Records) == 0 {
				lr.p.sp.Ack(lr.lane, c.Seq)
				continue
			}
			ck := &chunkRef{seq: c.Seq, accepted: c.Accepted}
			ck.left.Store(int32(len(c.Records)))
			for _, r := range c.Records {
				sz := int64(len(r.Data) + len(r.OrderKey) + len(r.UserID) + 64)
				total += sz
				i := shardOf(r.OrderKey, len(lr.shards))
				per[i] = append(per[i], item{rec: r, ck: ck, enq: now, size: sz})
			}
		}
		lr.acquire(total)
		for i, its := range per {
			if len(its) == 0 {
				continue
			}
			lr.shards[i].give(its)
			clear(its)
			per[i] = its[:0]
		}
	}
}

// maxNextBytes bounds one Lane.Next: the read-ahead fills in steps, so the
// hand-over slices stay small and shards start sending early.
const maxNextBytes = 4 << 20

// shardOf hashes key (FNV-1a) to one of n shards.
func shardOf(key []byte, n int) int {
	h := uint64(14695981039346656037)
	for _, c := range key {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return int(h % uint64(n))
}

// waitBudget waits until the read-ahead is under max and returns the free
// bytes (at least 1), or false when ctx ends.
func (lr *laneRunner) waitBudget(ctx context.Context, max int64) (int64, bool) {
	for {
		lr.bmu.Lock()
		in := lr.inflight
		lr.bmu.Unlock()
		if in < max {
			return max - in, true
		}
		select {
		case <-lr.bwake:
		case <-ctx.Done():
			return 0, false
		}
	}
}

func (lr *laneRunner) acquire(n int64) {
	lr.bmu.Lock()
	lr.inflight += n
	v := lr.inflight
	lr.bmu.Unlock()
	lr.readAhead.Store(v)
}

func (lr *laneRunner) release(n int64) {
	if n == 0 {
		return
	}
	lr.bmu.Lock()
	lr.inflight -= n
	v := lr.inflight
	lr.bmu.Unlock()
	lr.readAhead.Store(v)
	select {
	case lr.bwake <- struct{}{}:
	default:
	}
}

// done marks items delivered or dead-lettered: acks every chunk whose last
// record this was and releases their read-ahead bytes.
func (lr *laneRunner) done(its []item) {
	var n int64
	for i := range its {
		n += its[i].size
		if its[i].ck.left.Add(-1) == 0 {
			lr.p.sp.Ack(lr.lane, its[i].ck.seq)
		}
	}
	lr.release(n)
}
