package spool

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"go.uber.org/zap"
)

// ErrFull is returned by Append when the chunk would take the spool's live
// bytes past Config.MaxBytes. Nothing was written; retry after delivery drains.
var ErrFull = errors.New("spool: quota reached")

// ErrDiskLow is returned by Append when the filesystem holding the spool has
// less than Config.MinFreeBytes free. Nothing was written.
var ErrDiskLow = errors.New("spool: free disk space below reserve")

// ErrLocked is returned by Open when another process (or another open Spool)
// holds the spool's file; Open gives up after about half a second.
var ErrLocked = errors.New("spool: locked by another process")

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
	// CompactMinFileBytes is the file size under which the spool never
	// compacts (see compact.go); zero means DefaultCompactMinFileBytes,
	// negative disables compaction.
	CompactMinFileBytes int64
	// CompactUsedPercent: the spool compacts when the pages in use are at most
	// this percentage of the file; zero means DefaultCompactUsedPercent.
	CompactUsedPercent int
	// CompactMaxUsedBytes bounds the data a compaction copies (appends wait
	// while it runs, about 20 ms per MiB here); zero means
	// DefaultCompactMaxUsedBytes, negative means no bound.
	CompactMaxUsedBytes int64

	// adviseAge, when positive, replaces the package's adviseAge (tests).
	adviseAge time.Duration

	// maxFileBytes, when positive, makes commits that would grow the file
	// past it fail (bbolt's MaxSize): the tests' stand-in for ENOSPC.
	maxFileBytes int
}

// Defaults.
const (
	DefaultMinFreeBytes   = 256 << 20
	DefaultMaxCommitBytes = 32 << 20

	DefaultCompactMinFileBytes = 4 << 20
	DefaultCompactUsedPercent  = 25
	DefaultCompactMaxUsedBytes = 16 << 20
)

// Validate reports a configuration error.
func (c Config) Validate() error {
	switch {
	case c.Dir == "":
		return errors.New("spool config: Dir is required")
	case c.Sync != SyncAlways && c.Sync != SyncNone:
		return fmt.Errorf("spool config: unknown Sync mode %d", c.Sync)
	case c.MaxBytes < 0:
		return errors.New("spool config: MaxBytes must not be negative")
	case c.MaxCommitBytes < 0:
		return errors.New("spool config: MaxCommitBytes must not be negative")
	case c.CompactUsedPercent < 0 || c.CompactUsedPercent > 100:
		return errors.New("spool config: CompactUsedPercent must be within 0..100")
	}
	return nil
}

func (c Config) minFree() int64 {
	if c.MinFreeBytes == 0 {
		return DefaultMinFreeBytes
	}
	return c.MinFreeBytes
}

func (c Config) maxCommit() int {
	if c.MaxCommitBytes == 0 {
		return DefaultMaxCommitBytes
	}
	return c.MaxCommitBytes
}

func (c Config) compactMinFile() int64 {
	if c.CompactMinFileBytes == 0 {
		return DefaultCompactMinFileBytes
	}
	return c.CompactMinFileBytes
}

func (c Config) compactMaxUsed() int64 {
	switch {
	case c.CompactMaxUsedBytes == 0:
		return DefaultCompactMaxUsedBytes
	case c.CompactMaxUsedBytes < 0:
		return math.MaxInt64
	}
	return c.CompactMaxUsedBytes
}

func (c Config) compactUsedPercent() int64 {
	if c.CompactUsedPercent == 0 {
		return DefaultCompactUsedPercent
	}
	return int64(c.CompactUsedPercent)
}

// Kind is what a lane carries.
type Kind uint8

const (
	KindEvents        Kind = iota // /2/httpapi events
	KindGroupIdentify             // /groupidentify identifications
	KindUserMap                   // /usermap mappings
)

// String is the kind's name as used in lane labels.
func (k Kind) String() string {
	switch k {
	case KindEvents:
		return "events"
	case KindGroupIdentify:
		return "groupidentify"
	case KindUserMap:
		return "usermap"
	}
	return fmt.Sprintf("kind%d", uint8(k))
}

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

// Batch is a reusable builder of the records of one Append. Its buffer is
// the chunk's encoding (see encode.go), so Append writes it without copying;
// once grown, Add allocates nothing. The zero value is an empty batch.
type Batch struct {
	buf []byte // chunk header space + encoded records
	n   int
}

// Reset empties b, keeping its memory.
func (b *Batch) Reset() {
	b.buf = b.buf[:0]
	b.n = 0
}

// Add appends a record; the slices are copied.
func (b *Batch) Add(r Record) {
	if len(b.buf) < chunkHeaderLen {
		b.buf = append(b.buf[:0], make([]byte, chunkHeaderLen)...)
	}
	b.buf = appendBytes(b.buf, r.OrderKey)
	b.buf = appendBytes(b.buf, r.UserID)
	b.buf = appendBytes(b.buf, r.Data)
	b.n++
}

// Len is the number of records added.
func (b *Batch) Len() int { return b.n }

// Bytes is the encoded size of b (0 when empty): what Append counts against
// the quota and what Chunk.Size reports.
func (b *Batch) Bytes() int {
	if b.n == 0 {
		return 0
	}
	return len(b.buf)
}

// Chunk is a committed group of records of a lane, as read back by Next.
type Chunk struct {
	Seq      uint64
	Accepted time.Time // when Append was called (millisecond precision)
	// Records alias memory owned by the chunk; valid until the caller drops it.
	Records []Record
	// Size is the encoded size counted against the quota.
	Size int
	buf  Buffer
}

// Buffer is the memory the records alias, for a caller that can tell when
// they are no longer read (see Buffer.Release).
func (c *Chunk) Buffer() Buffer { return c.buf }

// Lane is a handle on one lane. Lanes are never closed or freed while the
// spool is open.
type Lane struct {
	s     *Spool
	key   LaneKey
	id    uint64
	label string
	qname []byte // name of the queue bucket

	mu     sync.Mutex
	st     laneState     // committed state; written by the writer under mu
	oldest int64         // accepted ms of the first live chunk, 0 when empty
	notify chan struct{} // closed (and replaced) when a commit appends

	// Writer goroutine only: the working copy inside the current tx.
	w                             laneState
	wOldest                       int64
	wTouched, wAppended, wDeleted bool

	// Reader (Next) only.
	readSeq uint64
	raw     []rawChunk // scratch of read
	adv     spans      // scratch of read
}

// rawChunk is a chunk as it lies in the mapping, inside a read transaction.
type rawChunk struct {
	seq uint64
	v   []byte
}

func newLane(s *Spool, id uint64, key LaneKey, st laneState) *Lane {
	h := sha256.Sum256([]byte(key.APIKey + "\x00" + key.Options))
	return &Lane{
		s:      s,
		key:    key,
		id:     id,
		label:  key.Kind.String() + "-" + hex.EncodeToString(h[:4]),
		qname:  queueName(id),
		st:     st,
		w:      st,
		notify: make(chan struct{}),
	}
}

func queueName(id uint64) []byte {
	return append([]byte("q"), seqKey(id)...)
}

// Key returns the lane's key.
func (l *Lane) Key() LaneKey { return l.key }

// ID is the lane's small stable number inside this spool.
func (l *Lane) ID() uint64 { return l.id }

// Label is a short, non-secret name for metrics and logs: the kind and a
// truncated hash of the api_key and options (never the key itself), e.g.
// "events-1a2b3c4d".
func (l *Lane) Label() string { return l.label }

// LaneStats is a snapshot of a lane's queue.
type LaneStats struct {
	Chunks, Records, Bytes int64
	Oldest                 time.Time // zero when empty
}

// Stats returns the lane's live (not yet acknowledged-and-committed) content.
func (l *Lane) Stats() LaneStats {
	l.mu.Lock()
	st, oldest := l.st, l.oldest
	l.mu.Unlock()
	return LaneStats{Chunks: int64(st.chunks), Records: int64(st.records), Bytes: int64(st.bytes), Oldest: fromMs(oldest)}
}

// Next blocks until the lane has chunks after its read cursor, then returns
// them in order (at least one, at most about maxBytes) and advances the
// cursor. It returns ctx.Err() when ctx ends and ErrClosed when the spool
// closes. One caller at a time per lane. maxBytes <= 0 returns one chunk.
// The chunks are copies: they stay valid after Ack and Close, until their
// Buffer is released (Chunk.Buffer).
func (l *Lane) Next(ctx context.Context, maxBytes int) ([]Chunk, error) {
	for {
		select {
		case <-l.s.closing:
			return nil, ErrClosed
		default:
		}
		l.mu.Lock()
		next, ch := l.st.nextSeq, l.notify
		l.mu.Unlock()
		if l.readSeq < next {
			chunks, err := l.read(maxBytes, next)
			if err != nil {
				return nil, err
			}
			if len(chunks) > 0 {
				l.readSeq = chunks[len(chunks)-1].Seq + 1
				return chunks, nil
			}
			l.readSeq = next // everything up to next was acknowledged already
			continue
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.s.closing:
			return nil, ErrClosed
		}
	}
}

// read returns the committed chunks in [l.readSeq, next).
func (l *Lane) read(maxBytes int, next uint64) ([]Chunk, error) {
	s := l.s
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		return nil, ErrClosed
	}
	var out []Chunk
	total := 0
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(l.qname)
		if b == nil {
			return fmt.Errorf("lane %s: queue bucket missing: %w", l.label, errCorrupt)
		}
		raw := l.raw[:0]
		c := b.Cursor()
		k, v := c.Seek(seqKey(l.readSeq))
		for ; k != nil; k, v = c.Next() {
			seq := binary.BigEndian.Uint64(k)
			if seq >= next {
				break
			}
			if len(raw) > 0 && (maxBytes <= 0 || total+len(v) > maxBytes) {
				break
			}
			raw = append(raw, rawChunk{seq, v})
			total += len(v)
		}
		l.raw = raw[:0]
		defer clear(raw) // no references into the mapping outlive tx
		if len(raw) == 0 {
			return nil
		}
		// A backlog being caught up (its oldest chunk here was accepted
		// adviseAge ago or more): ask for the pages of these chunks and of
		// the ones after them (the next call's, read from disk while these
		// are delivered) at once, copy, then drop the copied pages from the
		// RSS (see advise.go). Fresh chunks are in the page cache, and the
		// writer's trim keeps their pages out of the RSS: advice for them
		// cost a quarter of the relay's CPU under load.
		if acc, _, herr := chunkHeader(raw[0].v); herr == nil && time.Since(fromMs(acc)) >= s.cfg.adviseOlder() {
			m := mapping(s.db, tx)
			l.adv = l.adv[:0]
			for _, r := range raw {
				l.adv.add(m, r.v)
			}
			var ahead spans
			for n := 0; k != nil && n < maxBytes && len(ahead) < 64; k, v = c.Next() {
				if binary.BigEndian.Uint64(k) >= next {
					break
				}
				ahead.add(m, v)
				n += len(v)
			}
			l.adv.advise(m, syscall.MADV_WILLNEED)
			ahead.advise(m, syscall.MADV_WILLNEED)
			defer l.adv.advise(m, syscall.MADV_DONTNEED)
		}
		out = make([]Chunk, len(raw))
		for i, r := range raw {
			buf, box := getBuf(len(r.v))
			copy(buf, r.v)
			out[i].buf = Buffer{box}
			if err := decodeChunk(r.seq, buf, &out[i]); err != nil {
				return fmt.Errorf("lane %s chunk %d: %w", l.label, r.seq, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("spool read: %w", err)
	}
	return out, nil
}

// Spool is the durable queue. See the package documentation.
type Spool struct {
	cfg  Config
	log  *zap.Logger
	path string
	m    *metrics

	// dbMu guards db: readers (Next, ListDead) hold it shared for one short
	// View; the writer holds it exclusively only to swap files after a
	// compaction, and Close to close the file (db = nil afterwards).
	dbMu sync.RWMutex
	db   *bolt.DB

	mu      sync.Mutex // guards the fields below
	closed  bool
	pending []*op
	acks    []ackOp
	lanes   []*Lane
	byKey   map[LaneKey]*Lane
	lanesCh chan struct{}

	wake       chan struct{} // capacity 1: the writer has work
	closing    chan struct{} // closed by Close
	writerDone chan struct{}
	opPool     sync.Pool

	// Published by the writer after each commit.
	liveBytes atomic.Int64
	fileBytes atomic.Int64
	deadN     atomic.Int64

	w writerState // the writer goroutine's own
}

const lockTimeout = 500 * time.Millisecond

var (
	bucketMeta  = []byte("meta")
	bucketLanes = []byte("lanes")
	bucketDead  = []byte("dead")
	keyFormat   = []byte("format")
	keyDead     = []byte("dead") // in meta: dead letter count and bytes
)

const formatVersion = 1

// Open opens or creates the spool in cfg.Dir and starts its writer.
// log and reg may be nil. A spool directory is used by one process at a time:
// Open fails with ErrLocked after about half a second when another holds the
// file.
func Open(cfg Config, log *zap.Logger, reg prometheus.Registerer) (*Spool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("open spool: %w", err)
	}
	s := &Spool{
		cfg:        cfg,
		log:        log,
		path:       filepath.Join(cfg.Dir, "spool.db"),
		byKey:      make(map[LaneKey]*Lane),
		lanesCh:    make(chan struct{}),
		wake:       make(chan struct{}, 1),
		closing:    make(chan struct{}),
		writerDone: make(chan struct{}),
	}
	s.opPool.New = func() any { return &op{done: make(chan struct{}, 1)} }
	if err := os.Remove(s.path + ".compact"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("open spool: remove stale compaction file: %w", err)
	}
	db, err := s.openDB()
	if err != nil {
		return nil, err
	}
	s.db = db
	if err := s.load(); err != nil {
		db.Close()
		return nil, fmt.Errorf("open spool %s: %w", s.path, err)
	}
	s.updateFileBytes()
	m, err := newMetrics(s, reg)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open spool: metrics: %w", err)
	}
	s.m = m
	go s.run()
	return s, nil
}

func (s *Spool) openDB() (*bolt.DB, error) {
	db, err := bolt.Open(s.path, 0o600, &bolt.Options{
		Timeout:         lockTimeout,
		NoFreelistSync:  true,
		FreelistType:    bolt.FreelistMapType,
		InitialMmapSize: 1 << 30,
		NoSync:          s.cfg.Sync == SyncNone,
		MaxSize:         s.cfg.maxFileBytes,
	})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("open spool %s: %w", s.path, ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("open spool %s: %w", s.path, err)
	}
	return db, nil
}

// load creates the buckets of a new file and reads the lanes of an old one.
func (s *Spool) load() error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get(keyFormat); v == nil {
			if err := meta.Put(keyFormat, seqKey(formatVersion)); err != nil {
				return err
			}
		} else if len(v) != 8 || binary.BigEndian.Uint64(v) != formatVersion {
			return fmt.Errorf("unknown spool format %x", v)
		}
		if _, err := tx.CreateBucketIfNotExists(bucketLanes); err != nil {
			return err
		}
		_, err = tx.CreateBucketIfNotExists(bucketDead)
		return err
	})
	if err != nil {
		return err
	}
	return s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyDead); len(v) == 16 {
			s.w.deadN = int64(binary.BigEndian.Uint64(v))
			s.w.deadBytes = int64(binary.BigEndian.Uint64(v[8:]))
		}
		s.deadN.Store(s.w.deadN)
		return tx.Bucket(bucketLanes).ForEach(func(k, v []byte) error {
			key, st, err := decodeLane(v)
			if err != nil {
				return err
			}
			l := newLane(s, binary.BigEndian.Uint64(k), key, st)
			q := tx.Bucket(l.qname)
			if q == nil {
				return fmt.Errorf("lane %s: queue bucket missing: %w", l.label, errCorrupt)
			}
			l.readSeq = st.nextSeq
			if fk, fv := q.Cursor().First(); fk != nil {
				l.readSeq = binary.BigEndian.Uint64(fk)
				if l.oldest, _, err = chunkHeader(fv); err != nil {
					return err
				}
			}
			l.wOldest = l.oldest
			s.lanes = append(s.lanes, l)
			s.byKey[key] = l
			s.w.live += int64(st.bytes)
			s.liveBytes.Store(s.w.live)
			return nil
		})
	})
}

// Close commits queued operations, stops the writer and closes the file.
// Blocked Next calls return ErrClosed. Acks queued after Close are dropped
// (their chunks are delivered again after the next Open). Closing twice
// returns ErrClosed.
func (s *Spool) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.closed = true
	s.mu.Unlock()
	close(s.closing)
	s.signal()
	<-s.writerDone
	s.m.unregister()
	s.dbMu.Lock()
	defer s.dbMu.Unlock()
	if s.db == nil { // a failed compaction swap left no file open
		return nil
	}
	err := s.db.Close()
	s.db = nil
	if err != nil {
		return fmt.Errorf("close spool: %w", err)
	}
	return nil
}

// Lane returns the lane for key, creating it (durably) if needed.
func (s *Spool) Lane(ctx context.Context, key LaneKey) (*Lane, error) {
	s.mu.Lock()
	l := s.byKey[key]
	s.mu.Unlock()
	if l != nil {
		return l, nil
	}
	o := s.getOp(opLane)
	o.key = key
	err := s.do(ctx, o)
	l = o.lane
	s.putOp(o)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Lanes returns every lane, oldest first.
func (s *Spool) Lanes() []*Lane {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Lane(nil), s.lanes...)
}

// LanesChanged returns a channel that is closed when the next lane is
// created (call Lanes again, then LanesChanged again).
func (s *Spool) LanesChanged() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lanesCh
}

// Append commits b as one chunk at the tail of lane l and returns once it is
// durable (see SyncMode). An empty batch is a no-op. b must not be changed
// until Append returns. ctx is checked before the chunk is queued; once
// queued, Append waits for the commit (about a millisecond) so that its
// answer is always the truth.
func (s *Spool) Append(ctx context.Context, l *Lane, b *Batch) error {
	if b.n == 0 {
		return nil
	}
	if l.s != s {
		return errors.New("spool: append to a lane of another spool")
	}
	o := s.getOp(opAppend)
	o.lane, o.batch, o.accepted = l, b, time.Now().UnixMilli()
	err := s.do(ctx, o)
	s.putOp(o)
	return err
}

// Ack records that every record of chunk seq of lane l is done (delivered or
// dead-lettered). The deletion rides in the next commit; Ack does not block.
// Acknowledging a chunk twice, or one that does not exist, is harmless. If
// that commit fails, the ack waits for the next one; an ack not committed
// when the process stops means the chunk is delivered again.
func (s *Spool) Ack(l *Lane, seq uint64) {
	if l.s != s {
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.acks = append(s.acks, ackOp{l, seq})
	s.mu.Unlock()
	s.signal()
}

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

// PutDead commits dead letters and returns once they are durable. It sets
// the ID of each element of dls. Dead letters are not counted against
// MaxBytes and not refused for low disk: they precede an Ack that frees more.
func (s *Spool) PutDead(ctx context.Context, dls []DeadLetter) error {
	if len(dls) == 0 {
		return nil
	}
	o := s.getOp(opPutDead)
	o.dls = dls
	err := s.do(ctx, o)
	s.putOp(o)
	return err
}

// DeadFilter selects dead letters; zero fields match everything.
type DeadFilter struct {
	Lane   *LaneKey
	Reason string
}

// ListDead returns up to limit dead letters with ID > after that match f, by
// ID. limit <= 0 means no limit. The results own their memory.
func (s *Spool) ListDead(f DeadFilter, after uint64, limit int) ([]DeadLetter, error) {
	if after == math.MaxUint64 {
		return nil, nil
	}
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		return nil, ErrClosed
	}
	var out []DeadLetter
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketDead).Cursor()
		for k, v := c.Seek(seqKey(after + 1)); k != nil; k, v = c.Next() {
			if limit > 0 && len(out) >= limit {
				break
			}
			buf := make([]byte, len(v))
			copy(buf, v)
			d, err := decodeDead(binary.BigEndian.Uint64(k), buf)
			if err != nil {
				return fmt.Errorf("dead letter %x: %w", k, err)
			}
			if f.Lane != nil && d.Lane != *f.Lane || f.Reason != "" && d.Reason != f.Reason {
				continue
			}
			out = append(out, d)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// DeleteDead removes the dead letters with the given ids (durably). Unknown
// ids are ignored.
func (s *Spool) DeleteDead(ctx context.Context, ids []uint64) error {
	if len(ids) == 0 {
		return nil
	}
	o := s.getOp(opDelDead)
	o.ids = ids
	err := s.do(ctx, o)
	s.putOp(o)
	return err
}

// Stats is a snapshot of the whole spool.
type Stats struct {
	LiveBytes int64 // record bytes counted against the quota
	FileBytes int64 // disk space of the file (allocated blocks)
	Lanes     int
	Dead      int64
}

// Stats returns a snapshot of the spool.
func (s *Spool) Stats() Stats {
	s.mu.Lock()
	n := len(s.lanes)
	s.mu.Unlock()
	return Stats{
		LiveBytes: s.liveBytes.Load(),
		FileBytes: s.fileBytes.Load(),
		Lanes:     n,
		Dead:      s.deadN.Load(),
	}
}
