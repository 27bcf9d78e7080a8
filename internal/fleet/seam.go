package fleet

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/svcrelay/relay/internal/storage"
)

// The fleet behind the storage seam (package storage): Fleet is
// the dead-letter store as it is; Backend adapts Append, Run and
// Partition (whose Message carries the fleet's extras, Partition and
// Delivered) to storage.Owner and storage.Reader. Pauses are the fleet's
// own (the local spool has none to share): the engine declares what it
// needs of them where it uses them.

var (
	_ storage.DeadLetters = (*Fleet)(nil)
	_ storage.Backend     = (*Backend)(nil)
	_ storage.Reader      = (*partitionReader)(nil)
)

// Backend is a Fleet as a storage.Backend: a queue is a partition.
type Backend struct {
	f     *Fleet
	kinds []storage.Kind // Run's; every kind's when nil
}

// Backend returns f behind the storage seam.
func (f *Fleet) Backend() *Backend { return &Backend{f: f} }

// Only returns b whose Run hands out the partitions of ks only (each
// lane kind's delivery runs its own). The other methods are b's.
func (b *Backend) Only(ks ...storage.Kind) *Backend {
	return &Backend{f: b.f, kinds: slices.Clone(ks)}
}

// Append is Fleet.Append of req's records (copied into the messages: the
// batch stays the caller's).
func (b *Backend) Append(ctx context.Context, req storage.Request) error {
	if req.Batch == nil {
		return nil
	}
	return b.f.Append(ctx, Request{ID: req.ID, Lane: req.Lane(), Accepted: req.Accepted, Records: req.Batch.Records()})
}

// Run is Fleet.Run, deliver reading each owned partition through the seam.
func (b *Backend) Run(ctx context.Context, deliver storage.DeliverFunc) error {
	ks := b.kinds
	if ks == nil {
		ks = kinds
	}
	return b.f.run(ctx, ks, func(ctx context.Context, p *Partition) error {
		return deliver(ctx, &partitionReader{p: p, out: make(map[uint64]*Message)})
	})
}

// PutDead is Fleet.PutDead.
func (b *Backend) PutDead(ctx context.Context, dls []storage.DeadLetter) error {
	return b.f.PutDead(ctx, dls)
}

// ListDead is Fleet.ListDead (limit <= 0 means 1000).
func (b *Backend) ListDead(ctx context.Context, filter storage.DeadFilter, after uint64, limit int) ([]storage.DeadLetter, error) {
	return b.f.ListDead(ctx, filter, after, limit)
}

// DeleteDead is Fleet.DeleteDead.
func (b *Backend) DeleteDead(ctx context.Context, ids []uint64) error {
	return b.f.DeleteDead(ctx, ids)
}

// DeadCount is Fleet.DeadCount.
func (b *Backend) DeadCount(ctx context.Context) (int64, error) { return b.f.DeadCount(ctx) }

// Close is Fleet.Close (the connection stays open).
func (b *Backend) Close() error { return b.f.Close() }

// partitionReader is a Partition as a storage.Reader: it keeps the
// fleet's message of every storage.Message handed out until its Ack.
type partitionReader struct {
	p *Partition

	mu     sync.Mutex
	out    map[uint64]*Message // by Seq, read and not acknowledged (spilled ones without body)
	stream jetstream.Stream    // for Reread, looked up on first use
}

// Name is the partition's name, e.g. "events-3" (labels and logs).
func (r *partitionReader) Name() string { return slot{r.p.kind, r.p.id}.label() }

func (r *partitionReader) Next(ctx context.Context) (*storage.Message, error) {
	m, err := r.p.Next(ctx)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.out[m.Seq] = m
	r.mu.Unlock()
	return &storage.Message{Seq: m.Seq, Lane: m.Lane, Accepted: m.Accepted, Records: m.Records}, nil
}

func (r *partitionReader) Ack(ctx context.Context, sm *storage.Message) error {
	r.mu.Lock()
	m, ok := r.out[sm.Seq]
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("fleet: ack partition %d seq %d: not read from this reader", r.p.id, sm.Seq)
	}
	if err := r.p.ackLater(ctx, m); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.out, sm.Seq)
	r.mu.Unlock()
	return nil
}
