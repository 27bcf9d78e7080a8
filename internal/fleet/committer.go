package fleet

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nuid"

	"github.com/svcrelay/relay/internal/storage"
)

// Group commit. Each stream has a committer: a goroutine that takes the
// parts (pending) Append hands it, gathers those handed over within
// Config.Linger once a batch slot is free (those that came while every
// slot was busy wait in the hand-over and are taken first), and publishes
// them as one atomic batch (one message per lane and partition: every
// request's records of that partition, in arrival order), so that one
// quorum round and, with sync_interval always, one fsync per node stores
// many requests. Up to Config.MaxInflight batches per stream are in
// flight at once, each in a goroutine of its own; each is bounded by
// PublishTimeout and answers every pending it holds, with the batch's
// outcome: all its requests are stored, or none.

// Bounds of one batch: the server takes at most 1000 messages in an
// atomic batch (max_batch_size); the bytes bound keeps a batch's staging
// and its retries small.
const (
	batchMaxMsgs  = 900
	batchMaxBytes = 4 << 20
)

type committer struct {
	f      *Fleet
	stream string
	in     chan *pending // unbuffered: a send is a hand-over
	slots  chan struct{} // a token per batch in flight
	stopc  chan struct{}
	once   sync.Once
	done   chan struct{} // the gathering goroutine returned
	wg     sync.WaitGroup
}

func (f *Fleet) startCommitter(stream string) *committer {
	c := &committer{
		f: f, stream: stream,
		in:    make(chan *pending),
		slots: make(chan struct{}, f.cfg.MaxInflight),
		stopc: make(chan struct{}),
		done:  make(chan struct{}),
	}
	go c.run()
	return c
}

// stop ends the gathering and waits for the batches in flight (each
// bounded by PublishTimeout).
func (c *committer) stop() {
	c.once.Do(func() { close(c.stopc) })
	<-c.done
	c.wg.Wait()
}

func (c *committer) run() {
	defer close(c.done)
	var carry *pending // taken, not fitting the last batch
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	for {
		first := carry
		carry = nil
		if first == nil {
			select {
			case first = <-c.in:
			case <-c.stopc:
				return
			}
		}
		// Wait for a slot; what comes meanwhile waits in its hand-over
		// for the linger below. Taking it here and publishing as soon as
		// a slot frees, without the linger, made smaller batches and no
		// more events/s (bench/RESULTS.md, "Fleet: gathering while the
		// slots are busy").
		select {
		case c.slots <- struct{}{}:
		case <-c.stopc:
			first.done <- ErrUnavailable
			return
		}
		batch, msgs, size := []*pending{first}, len(first.frags), first.size
		if first.id == "" && c.f.cfg.Linger > 0 {
			linger.Reset(c.f.cfg.Linger)
		gather:
			for msgs < batchMaxMsgs && size < batchMaxBytes {
				select {
				case p := <-c.in:
					if p.id != "" || msgs+len(p.frags) > batchMaxMsgs || size+p.size > batchMaxBytes {
						carry = p
						break gather
					}
					batch, msgs, size = append(batch, p), msgs+len(p.frags), size+p.size
				case <-linger.C:
					break gather
				case <-c.stopc:
					break gather
				}
			}
			if !linger.Stop() {
				select {
				case <-linger.C:
				default:
				}
			}
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer func() { <-c.slots }()
			c.commit(batch)
		}()
	}
}

// msgKey is a message of a batch: a lane's records in a partition.
type msgKey struct {
	partition int
	lane      storage.LaneKey
}

// commit publishes batch's requests as one atomic batch and answers each.
func (c *committer) commit(batch []*pending) {
	f := c.f
	f.m.batchRequests.Observe(float64(len(batch)))
	msgs := c.messages(batch)
	ctx, cancel := context.WithTimeout(context.Background(), f.cfg.PublishTimeout)
	defer cancel()
	err := f.publish(ctx, c.stream, msgs)
	if err != nil {
		for i := range msgs {
			if msgs[i].plain != nil {
				f.recent.drop(msgs[i].id)
			}
		}
	}
	for _, p := range batch {
		p.done <- err
	}
}

// messages lays batch out: one message per lane and partition (several
// when larger than MaxMessageBytes), its requests' frags in batch order.
// Message ids: the request's id and the partition for a request with an
// id (alone in its batch), a fresh batch id otherwise; a retry of the
// batch reuses them.
func (c *committer) messages(batch []*pending) []outMsg {
	f := c.f
	type building struct {
		out       int // index in msgs
		partition int
		h         header
		n, size   int
		parts     [][]byte
		nextPart  int // this key's messages so far
	}
	var (
		msgs  []outMsg
		open  = make(map[msgKey]*building)
		order []*building
	)
	idBase := batch[0].id
	if idBase == "" {
		idBase = nuid.Next()
	}
	flush := func(b *building) {
		if b.n == 0 {
			return
		}
		m := &msgs[b.out]
		codec := byte(f.compress[b.h.lane.Kind].Load())
		capacity := b.h.size() + b.size + 4
		if codec == codecZstd {
			// Sized for records compressing to a third; a body that does
			// not fits as it grows.
			capacity = b.h.size() + b.size/3 + 64
		}
		m.body, m.plain = encodeBody(make([]byte, 0, capacity), &b.h, b.n, b.parts, codec)
		if m.plain != nil {
			if f.reading(slot{b.h.lane.Kind, b.partition}) {
				f.recent.put(m.id, m.body, m.plain)
			} else {
				m.plain = nil
			}
		}
		b.n, b.size, b.parts = 0, 0, nil
	}
	for _, p := range batch {
		for _, fr := range p.frags {
			k := msgKey{fr.partition, p.lane}
			b := open[k]
			if b == nil {
				b = &building{h: header{lane: p.lane, accepted: p.accepted}, partition: fr.partition}
				open[k] = b
				order = append(order, b)
			}
			if b.n > 0 && b.h.size()+b.size+len(fr.b)+4 > f.cfg.MaxMessageBytes {
				flush(b)
			}
			if b.n == 0 {
				b.out = len(msgs)
				b.h.accepted = p.accepted
				id := idBase + "-" + strconv.Itoa(fr.partition) + "-" + strconv.Itoa(b.nextPart)
				if batch[0].id == "" {
					id = idBase + "-" + strconv.Itoa(len(msgs))
				}
				msgs = append(msgs, outMsg{subject: f.n.subject(p.lane.Kind, fr.partition), id: id})
				b.nextPart++
			}
			if p.accepted.Before(b.h.accepted) {
				b.h.accepted = p.accepted
			}
			b.n += fr.n
			b.size += len(fr.b)
			b.parts = append(b.parts, fr.b)
		}
	}
	for _, b := range order {
		flush(b)
	}
	return msgs
}
