package spool

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// ErrFull is returned by Append when the chunk would take the spool's live
// bytes past Config.MaxBytes. Nothing was written; retry after delivery drains.
var ErrFull = errors.New("spool: quota reached")

// ErrDiskLow is returned by Append when the filesystem holding the spool has
// less than Config.MinFreeBytes free. Nothing was written.
var ErrDiskLow = errors.New("spool: free disk space below reserve")

// ErrClosed is returned by operations on a closed spool.
var ErrClosed = errors.New("spool: closed")

// SyncMode says when a commit counts as durable.
type SyncMode int

const (
	// SyncAlways fdatasyncs every commit before Append returns.
	SyncAlways SyncMode = iota
	// SyncNone returns once the commit reached the OS.
	SyncNone
)

// Config configures a Spool.
type Config struct {
	// Dir is the directory of the spool files; created if missing. Required.
	Dir string
	// Sync is the durability of a commit; the zero value is SyncAlways.
	Sync SyncMode
	// MaxBytes bounds the live record bytes; zero means no quota.
	MaxBytes int64
	// MinFreeBytes is the free space kept on the filesystem so that deletes
	// and compaction still work; zero means DefaultMinFreeBytes, negative
	// disables the check.
	MinFreeBytes int64
	// MaxCommitBytes bounds the bytes gathered into one commit; zero means
	// DefaultMaxCommitBytes.
	MaxCommitBytes int
}

// Defaults.
const (
	DefaultMinFreeBytes   = 256 << 20
	DefaultMaxCommitBytes = 32 << 20
)

// Validate reports a configuration error.
func (c Config) Validate() error { panic("unimplemented") }

// Kind is what a lane carries.
type Kind uint8

const (
	KindEvents        Kind = iota // /2/httpapi events
	KindGroupIdentify             // /groupidentify identifications
	KindUserMap                   // /usermap mappings
)

// LaneKey identifies a lane: records with equal keys share one ordered queue.
type LaneKey struct {
	Kind   Kind
	APIKey string
	// Options is the raw JSON of the envelope's options, "" when absent.
	Options string
}

// Record is one item of a chunk.
type Record struct {
	// OrderKey orders and throttles the record (event.Event.OrderKey).
	OrderKey []byte
	// UserID is the user id, when the record has one (for 429s naming users).
	UserID []byte
	// Data is the payload exactly as it is sent upstream.
	Data []byte
}

// Batch is a reusable builder of the records of one Append.
type Batch struct{}

// Reset empties b, keeping its memory.
func (b *Batch) Reset() { panic("unimplemented") }

// Add appends a record; the slices are copied.
func (b *Batch) Add(r Record) { panic("unimplemented") }

// Len is the number of records added.
func (b *Batch) Len() int { panic("unimplemented") }

// Bytes is the encoded size of b.
func (b *Batch) Bytes() int { panic("unimplemented") }

// Chunk is a committed group of records of a lane, as read back by Next.
type Chunk struct {
	Seq      uint64
	Accepted time.Time // when Append was called
	// Records alias memory owned by the chunk; valid until the caller drops it.
	Records []Record
	// Size is the encoded size counted against the quota.
	Size int
}

// Lane is a handle on one lane. Lanes are never closed or freed while the
// spool is open.
type Lane struct{}

// Key returns the lane's key.
func (l *Lane) Key() LaneKey { panic("unimplemented") }

// ID is the lane's small stable number inside this spool.
func (l *Lane) ID() uint64 { panic("unimplemented") }

// Label is a short, non-secret name for metrics and logs: the kind and a
// truncated hash of the api_key and options (never the key itself).
func (l *Lane) Label() string { panic("unimplemented") }

// LaneStats is a snapshot of a lane's queue.
type LaneStats struct {
	Chunks, Records, Bytes int64
	Oldest                 time.Time // zero when empty
}

// Stats returns the lane's live (not yet acknowledged-and-committed) content.
func (l *Lane) Stats() LaneStats { panic("unimplemented") }

// Next blocks until the lane has chunks after its read cursor, then returns
// them in order (at least one, at most about maxBytes) and advances the
// cursor. It returns ctx.Err() when ctx ends and ErrClosed when the spool
// closes. One caller at a time per lane.
func (l *Lane) Next(ctx context.Context, maxBytes int) ([]Chunk, error) { panic("unimplemented") }

// Spool is the durable queue. See the package documentation.
type Spool struct{}

// Open opens or creates the spool in cfg.Dir and starts its writer.
// log and reg may be nil.
func Open(cfg Config, log *zap.Logger, reg prometheus.Registerer) (*Spool, error) {
	panic("unimplemented")
}

// Close commits queued operations, stops the writer and closes the file.
// Blocked Next calls return ErrClosed.
func (s *Spool) Close() error { panic("unimplemented") }

// Lane returns the lane for key, creating it (durably) if needed.
func (s *Spool) Lane(ctx context.Context, key LaneKey) (*Lane, error) { panic("unimplemented") }

// Lanes returns every lane, oldest first.
func (s *Spool) Lanes() []*Lane { panic("unimplemented") }

// LanesChanged returns a channel that is closed when the next lane is
// created (call Lanes again, then LanesChanged again).
func (s *Spool) LanesChanged() <-chan struct{} { panic("unimplemented") }

// Append commits b as one chunk at the tail of lane l and returns once it is
// durable (see SyncMode). An empty batch is a no-op.
func (s *Spool) Append(ctx context.Context, l *Lane, b *Batch) error { panic("unimplemented") }

// Ack records that every record of chunk seq of lane l is done (delivered or
// dead-lettered). The deletion rides in the next commit; Ack does not block.
func (s *Spool) Ack(l *Lane, seq uint64) { panic("unimplemented") }

// DeadLetter is a record that will not be delivered, with why.
type DeadLetter struct {
	ID       uint64 // assigned by PutDead
	Lane     LaneKey
	Reason   string // short machine-readable reason, e.g. "invalid_fields"
	Answer   []byte // the upstream's answer that caused it, truncated
	Accepted time.Time
	Died     time.Time
	Record   Record
}

// PutDead commits dead letters and returns once they are durable.
func (s *Spool) PutDead(ctx context.Context, dls []DeadLetter) error { panic("unimplemented") }

// DeadFilter selects dead letters; zero fields match everything.
type DeadFilter struct {
	Lane   *LaneKey
	Reason string
}

// ListDead returns up to limit dead letters with ID > after that match f, by ID.
func (s *Spool) ListDead(f DeadFilter, after uint64, limit int) ([]DeadLetter, error) {
	panic("unimplemented")
}

// DeleteDead removes the dead letters with the given ids (durably).
func (s *Spool) DeleteDead(ctx context.Context, ids []uint64) error { panic("unimplemented") }

// Stats is a snapshot of the whole spool.
type Stats struct {
	LiveBytes int64 // record bytes counted against the quota
	FileBytes int64 // size of the file(s) on disk
	Lanes     int
	Dead      int64
}

// Stats returns a snapshot of the spool.
func (s *Spool) Stats() Stats { panic("unimplemented") }
