package spool

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
)

// ErrFull is returned by Append when the chunk would take the spool's live
// bytes past Config.MaxBytes. Nothing was written; retry after delivery drains.
var ErrFull = errors.New("spool: quota reached")

// ErrDiskLow is returned by Append when the filesystem holding the spool has
// less than Config.MinFreeBytes free. Nothing was written.
var ErrDiskLow = errors.New("spool: free disk space below reserve")

// errLocked is returned by Open when another process (or another open Spool)
// holds the spool's file; Open gives up after about half a second.
var errLocked = errors.New("spool: locked by another process")

// ErrClosed is returned by operations on a closed spool; it wraps
// storage.ErrLost (a reader's queue is gone with the spool).
var ErrClosed = fmt.Errorf("spool: closed: %w", storage.ErrLost)

// ErrDamaged is returned by Open when spool.db cannot be opened or read
// (damaged pages, a truncated file, a value it cannot go on without that
// fails its checksum), and when spool.db does not match the write-ahead log
// (errMismatch). Open changes nothing then; Verify salvages what is
// readable.
var ErrDamaged = errors.New("spool: spool.db is damaged")

// errMismatch is the ErrDamaged of a spool.db missing, empty or another
// spool's while the log holds records, or recording a log position the
// log does not reach.
var errMismatch = fmt.Errorf("%w (it does not match the write-ahead log)", ErrDamaged)

// DefaultMinFreeBytes is the relay's disk reserve (--spool-min-free-bytes
// and the backfills' spools).
const DefaultMinFreeBytes = 256 << 20

// Config configures a Spool. Its zero values mean what the relay's flags
// of the same settings do (cmd/relay passes them as they are).
type Config struct {
	// Dir is the directory of the spool files; created if missing. Required.
	Dir string
	// NoSync: an Append returns once its commit reached the OS (it survives
	// a crash of the process, not of the machine), not once fdatasync'ed.
	NoSync bool
	// MaxBytes bounds the live record bytes; zero means no quota.
	MaxBytes int64
	// MinFreeBytes is the free space kept on the filesystem so that deletes
	// and compaction still work; zero or negative means no reserve.
	MinFreeBytes int64
	// CompactMinFileBytes is the file size under which the spool never
	// compacts; zero means 4 MiB, negative never.
	CompactMinFileBytes int64

	// Lane limits (lanes.go; SetLaneLimits changes them while open), zero
	// or negative for none: the lanes of every kind (ErrTooManyLanes), the
	// lanes of one api_key (ErrTooManyKeyLanes), and how long a lane stays
	// empty without an Append before it is retired.
	MaxLanes, MaxLanesPerKey int
	RetireIdle               time.Duration

	// Tests' knobs; zero means the default (withDefaults).
	adviseAge       time.Duration // see advise.go
	segmentBytes    int64
	flushAge        time.Duration
	checkpointEvery time.Duration
	walMaxBytes     int64
	idleAfter       time.Duration
	drainEvery      time.Duration
	maxCommitBytes  int // one WAL write (group commit), one replay transaction
	// hotMaxBytes bounds the memory of hot chunks: past it a checkpoint
	// moves every unacknowledged one into bbolt, past twice it appends
	// wait for that (or fail with ErrFull when checkpoints fail).
	hotMaxBytes    int64
	compactPercent int // see compact.go
	gather         time.Duration

	// Fault injection. maxFileBytes is bbolt's MaxSize (the stand-in for
	// ENOSPC); walFault is called before every WAL write (false) and in
	// place of its fdatasync (true), its error failing the write;
	// beforeTrim runs before each trim inside a checkpoint's transaction.
	maxFileBytes int
	walFault     func(synced bool) error
	beforeTrim   func()
}

// withDefaults is c with its zero knobs set to their defaults.
func (c Config) withDefaults() Config {
	c.CompactMinFileBytes = cmp.Or(c.CompactMinFileBytes, 4<<20)
	c.segmentBytes = cmp.Or(c.segmentBytes, defaultSegmentBytes)
	c.walMaxBytes = cmp.Or(c.walMaxBytes, defaultWALMaxBytes)
	c.hotMaxBytes = cmp.Or(c.hotMaxBytes, 8<<20)
	c.adviseAge = cmp.Or(c.adviseAge, adviseAge)
	c.flushAge = cmp.Or(c.flushAge, defaultFlushAge)
	c.checkpointEvery = cmp.Or(c.checkpointEvery, defaultCheckpointEvery)
	c.idleAfter = cmp.Or(c.idleAfter, defaultIdleAfter)
	c.drainEvery = cmp.Or(c.drainEvery, drainRetry)
	c.gather = cmp.Or(c.gather, commitGather)
	c.maxCommitBytes = cmp.Or(c.maxCommitBytes, 32<<20)
	c.compactPercent = cmp.Or(c.compactPercent, 25)
	return c
}

// Lane is a handle on one lane; a retired lane's stays usable for Append.
type Lane struct {
	s      *Spool
	key    storage.LaneKey
	id     uint64
	label  string
	qname  []byte // name of the queue bucket
	walRec []byte // the lane's recLane payload

	mu         sync.Mutex
	cold       laneState // what bbolt holds (committed); written by the store
	coldOldest int64     // accepted ms of the first chunk in bbolt, 0 when none
	hot        hotList   // chunks in the WAL only
	next       uint64    // every chunk below it is published (cold or hot)
	notify     chan struct{}
	chunks     []storage.Chunk // the reader's, reused by NextPart; nil after an idle wait
	// watched: the reader may wait on notify, which a publish closes and
	// replaces only then (a channel per chunk was ~100 B for every
	// 1-event request).
	watched bool
	onWork  func() // starts the lane's reader again (whenWork)

	aNext uint64 // the WAL writer's: the next seq it assigns

	// The store's own: the working copy inside its transaction.
	w                   laneState
	wOldest             int64
	wTouched, wOldStale bool

	// The reader's own.
	readSeq uint64
	raw     []rawChunk  // scratch of read
	adv     spans       // scratch of read
	refs    []hotRef    // scratch of takeHot
	idle    *time.Timer // of Wait
	part    partCursor  // of NextPart (parts.go)

	// Retirement and checkpoints (lanes.go).
	dirty     bool          // in Spool.dirty; guarded by Spool.mu
	retiredC  chan struct{} // closed when retired
	retired   atomic.Bool
	appending atomic.Int32 // Appends in progress
	pins      atomic.Int32 // Pin calls not undone
	lastUse   atomic.Int64 // unix ms of creation or the last Append
}

// hotRef is a reference the reader took on a hot chunk's buffer.
type hotRef struct {
	seq      uint64
	accepted int64
	records  int
	cb       *storage.Buf
}

// rawChunk is a chunk as it lies in the mapping, inside a read transaction.
type rawChunk struct {
	seq uint64
	v   []byte
}

func newLane(s *Spool, id uint64, key storage.LaneKey, st laneState) *Lane {
	l := &Lane{
		s:      s,
		key:    key,
		id:     id,
		label:  key.Label(),
		qname:  queueName(id),
		walRec: encodeLane(nil, key, laneState{}),
		cold:   st,
		next:   st.nextSeq,
		aNext:  st.nextSeq,
		w:      st,
		notify: make(chan struct{}),

		retiredC: make(chan struct{}),
	}
	l.lastUse.Store(time.Now().UnixMilli())
	return l
}

func queueName(id uint64) []byte {
	return append([]byte("q"), seqKey(id)...)
}

// Key returns the lane's key.
func (l *Lane) Key() storage.LaneKey { return l.key }

// ID is the lane's small stable number inside this spool.
func (l *Lane) ID() uint64 { return l.id }

// LaneStats is a snapshot of a lane's queue.
type LaneStats struct {
	Chunks, Records, Bytes int64
	Oldest                 time.Time // zero when empty
}

// Stats returns the lane's live content (a chunk acknowledged while a
// checkpoint copied it into bbolt counts until the next one deletes it).
func (l *Lane) Stats() LaneStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := LaneStats{
		Chunks:  int64(l.cold.chunks) + l.hot.chunks,
		Records: int64(l.cold.records) + l.hot.records,
		Bytes:   int64(l.cold.bytes) + l.hot.bytes,
	}
	oldest := l.coldOldest
	if l.cold.chunks == 0 {
		oldest = l.hot.oldestUnacked()
	}
	st.Oldest = fromMs(oldest)
	return st
}

// recSlab hands out the Records slices of one NextPart call from buf (a
// nil *recSlab hands out fresh ones); a slice that does not fit
// gets a new buf. Reused records hold an earlier call's: the caller sets
// every field.
type recSlab struct{ buf []storage.Record }

func (s *recSlab) take(n int) []storage.Record {
	if s == nil {
		return make([]storage.Record, n)
	}
	used := len(s.buf)
	if used+n > cap(s.buf) {
		s.buf = make([]storage.Record, 0, max(2*cap(s.buf), n, 256))
		used = 0
	}
	s.buf = s.buf[:used+n]
	return s.buf[used : used+n : used+n]
}

// NextPart blocks until the lane has chunks after its read cursor, then
// returns them in order (at least one, at most about maxBytes; one when
// maxBytes <= 0) and advances the cursor. It returns ctx.Err() when ctx
// ends and ErrClosed when the spool closes. The bytes stay valid after Ack
// and Close, until their Buffer is released. A chunk (one Append: up to
// 20 MB) larger than maxBytes (> 0) comes in parts: one Chunk of the next
// records that fit (at least one), copied into a buffer of their size,
// First their index in the chunk and Total its record count. The chunk is
// acknowledged whole.
//
// The Records are carved from recs, grown when too small and dropped when
// the call waits long (recIdleDrop), and returned for the next call; the
// []Chunk is reused too (valid until the next call). Fresh ones were, at
// 100-event requests, more than half of the relay's allocated bytes.
func (l *Lane) NextPart(ctx context.Context, maxBytes int, recs []storage.Record) ([]storage.Chunk, []storage.Record, error) {
	slab := &recSlab{buf: recs[:0]}
	for {
		select {
		case <-l.s.closing:
			return nil, slab.buf, ErrClosed
		default:
		}
		l.mu.Lock()
		next, firstHot := l.next, l.hot.firstSeq(l.next)
		if l.readSeq >= firstHot && l.readSeq < next {
			refs := l.takeHot(maxBytes)
			l.mu.Unlock()
			if len(refs) == 0 {
				continue // every one was acknowledged already
			}
			if r := refs[0]; l.inParts(len(r.cb.B), maxBytes) {
				ch, err := l.cut(r.seq, r.accepted, r.records, r.cb.B, maxBytes, slab)
				if !errors.Is(err, errPartDamaged) { // else read whole
					for _, r := range refs {
						r.cb.Release()
					}
					clear(refs)
					if err != nil {
						return nil, slab.buf, err
					}
					return []storage.Chunk{ch}, slab.buf, nil
				}
			}
			out := l.decodeHot(refs, slab) // before slab.buf is read: it grows it
			return out, slab.buf, nil
		}
		l.mu.Unlock()
		if l.readSeq < firstHot {
			chunks, dmg, err := l.read(maxBytes, firstHot, slab)
			if err != nil {
				return nil, slab.buf, err
			}
			if len(chunks) > 0 {
				return chunks, slab.buf, nil // a damaged chunk after them is read again next time
			}
			if dmg != nil {
				if err := l.deadDamaged(ctx, dmg); err != nil {
					return nil, slab.buf, err
				}
				l.readSeq = dmg.seq + 1
				continue
			}
			l.readSeq = firstHot // everything below was acknowledged already
			continue
		}
		// An idle reader keeps nothing.
		if err := l.Wait(ctx, func() bool { slab.buf = nil; return false }); err != nil {
			return nil, slab.buf, err
		}
	}
}

// recIdleDrop is how long a reader waits before NextPart drops the records
// slice it keeps: an idle lane's reader keeps nothing (each would keep its
// largest read's, up to ~150 KB), a busy one reuses it. A variable for
// tests.
var recIdleDrop = time.Second

// takeHot takes a reference on the unacknowledged hot chunks from the read
// cursor on, up to about maxBytes, and advances the cursor. l.mu held.
func (l *Lane) takeHot(maxBytes int) []hotRef {
	refs := l.refs[:0]
	total := 0
	cs := l.hot.cs
	i := l.hot.index(l.readSeq)
	for ; i < len(cs); i++ {
		c := cs[i]
		if c.acked {
			continue
		}
		if len(refs) > 0 && (maxBytes <= 0 || total+c.size > maxBytes) {
			break
		}
		c.cb.Ref()
		refs = append(refs, hotRef{c.seq, c.accepted, c.records, c.cb})
		total += c.size
	}
	if i < len(cs) {
		l.readSeq = cs[i].seq
	} else {
		l.readSeq = l.next
	}
	l.refs = refs
	return refs
}

// decodeHot turns the referenced hot chunks into Chunks, their Records
// taken from slab and built from the index their Batch wrote (storage.Buf).
func (l *Lane) decodeHot(refs []hotRef, slab *recSlab) []storage.Chunk {
	out := slices.Grow(reuse(l.chunks), len(refs))[:len(refs)] // the caller is done with the last ones
	l.chunks = out
	for i, c := range refs {
		rs := slab.take(c.records)
		c.cb.Records(rs)
		out[i] = storage.Chunk{Seq: c.seq, Accepted: time.UnixMilli(c.accepted), Size: len(c.cb.B), Records: rs, Buffer: c.cb.Buffer(), Total: c.records}
	}
	clear(refs)
	return out
}

// read returns the chunks in bbolt in [l.readSeq, end), their Records
// taken from slab.
func (l *Lane) read(maxBytes int, end uint64, slab *recSlab) (_ []storage.Chunk, dmg *damagedChunk, _ error) {
	s := l.s
	var out []storage.Chunk
	total := 0
	err := s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(l.qname)
		if b == nil {
			return l.missingQueue()
		}
		raw := l.raw[:0]
		c := b.Cursor()
		k, v := c.Seek(seqKey(l.readSeq))
		for ; k != nil; k, v = c.Next() {
			seq := binary.BigEndian.Uint64(k)
			if seq >= end {
				break
			}
			v = chunkValue(b, k, v)
			if len(raw) > 0 && (maxBytes <= 0 || total+len(v) > maxBytes) {
				break
			}
			if len(raw) == 0 && l.inParts(len(v), maxBytes) {
				if acc, n, err := chunkHeader(v); err == nil {
					ch, err := l.cut(seq, acc, n, v, maxBytes, slab)
					if !errors.Is(err, errPartDamaged) { // else read whole, and dead-lettered
						out = []storage.Chunk{ch}
						return err
					}
				}
			}
			raw = append(raw, rawChunk{seq, v})
			total += len(v)
		}
		l.raw = raw[:0]
		defer clear(raw) // no references into the mapping outlive tx
		if len(raw) == 0 {
			return nil
		}
		// Drop the whole mapping from the RSS afterwards (advise.go: the
		// kernel maps large folios around the chunks, and the store's
		// commits touch pages meanwhile); bbolt is read only when chunks
		// waited, so one call per read is cheap. Chunks adviseAge old are
		// likely out of the page cache: ask for theirs and the next
		// call's pages at once.
		defer trimTx(s.db, tx)
		if acc, _, herr := chunkHeader(raw[0].v); herr == nil && time.Since(fromMs(acc)) >= s.cfg.adviseAge {
			m := mapping(s.db, tx)
			l.adv = l.adv[:0]
			for _, r := range raw {
				l.adv.add(m, r.v)
			}
			var ahead spans
			for n := 0; k != nil && n < maxBytes && len(ahead) < 64; k, v = c.Next() {
				if binary.BigEndian.Uint64(k) >= end {
					break
				}
				v = chunkValue(b, k, v)
				ahead.add(m, v)
				n += len(v)
			}
			l.adv.advise(m, syscall.MADV_WILLNEED)
			ahead.advise(m, syscall.MADV_WILLNEED)
		}
		out = make([]storage.Chunk, 0, len(raw))
		for _, r := range raw {
			cb := storage.GetBuf(len(r.v))
			cb.B = append(cb.B, r.v...)
			c := storage.Chunk{Buffer: cb.Buffer()}
			if err := decodeChunk(r.seq, cb.B, &c, slab); err != nil {
				dmg = &damagedChunk{seq: r.seq, v: cb.B, err: err}
				break
			}
			c.Total = len(c.Records)
			out = append(out, c)
		}
		if len(out) > 0 {
			l.readSeq = out[len(out)-1].Seq + 1
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("spool read: lane %s: %w", l.label, err)
	}
	return out, dmg, nil
}

// damagedChunk is a chunk of bbolt that failed its checksum (or does not
// decode), as read.
type damagedChunk struct {
	seq uint64
	v   []byte // a copy
	err error
}

// deadDamaged moves a damaged chunk to dead letters with reason
// reasonDamaged, never to be sent: one per record when its framing still
// decodes (any may be the damaged one), else one holding its bytes; then
// acknowledges, logs and counts it. The write has a context of its own:
// the reader's may be done already (delivery reads with a done one),
// and a refused write would wedge the lane behind the chunk.
func (l *Lane) deadDamaged(ctx context.Context, d *damagedChunk) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deadDamagedTimeout)
	defer cancel()
	s := l.s
	answer := fmt.Appendf(nil, "spool: chunk %d of lane %s failed its checksum in spool.db (%v)", d.seq, l.label, d.err)
	now := time.Now()
	acc, _, _ := chunkHeader(d.v)
	recs := []storage.Record{{Data: d.v}}
	var c storage.Chunk
	if decodeRecords(d.seq, d.v, &c, nil) == nil && len(c.Records) > 0 {
		recs = c.Records
	}
	dls := make([]storage.DeadLetter, len(recs))
	for i, r := range recs {
		dls[i] = storage.DeadLetter{Lane: l.key, Reason: reasonDamaged, Answer: answer, Accepted: fromMs(acc), Died: now, Record: r}
	}
	if err := s.PutDead(ctx, dls); err != nil {
		return fmt.Errorf("spool read: lane %s: dead-letter damaged chunk %d: %w", l.label, d.seq, err)
	}
	l.Ack(d.seq)
	s.m.damagedDB.Add(float64(len(dls)))
	s.log.Error("spool: a chunk of spool.db failed its checksum; its records were moved to dead letters (reason damaged), not sent",
		zap.String("lane", l.label), zap.Uint64("seq", d.seq), zap.Int("records", len(dls)),
		zap.Int("bytes", len(d.v)), zap.Error(d.err))
	return nil
}

// deadDamagedTimeout bounds deadDamaged's write; after a failed one the
// chunk is read again later.
const deadDamagedTimeout = 30 * time.Second

const reasonDamaged = "damaged"

// Spool is the durable queue. See the package documentation.
type Spool struct {
	cfg     Config
	laneCfg atomic.Pointer[Config] // cfg with the lane limits in force (SetLaneLimits)
	log     *zap.Logger
	path    string // the bbolt file
	walDir  string
	m       *metrics

	dbMu sync.RWMutex // see the package doc; db is nil once closed
	db   *bolt.DB

	mu       sync.Mutex // guards the fields below
	closed   bool
	appends  []*op   // queued for the WAL writer
	acks     []ackOp // acknowledgements not yet written to the WAL
	sops     []*op   // queued for the store: lanes, dead letters
	coldAcks []ackOp // acknowledged chunks in bbolt, deleted by the next checkpoint
	walEnd   walPos  // just past the last published WAL record
	walTotal int64   // WAL bytes written up to walEnd since Open
	lanes    []*Lane
	byKey    laneIndex
	lanesCh  chan struct{}
	dirty    []*Lane // lanes a checkpoint must look at (lanes.go)

	walWake   chan struct{} // capacity 1: the WAL writer has work
	storeWake chan struct{} // capacity 1: the store has work
	closing   chan struct{} // closed by Close
	walDone   chan struct{} // closed when the WAL writer returned
	storeDone chan struct{} // closed when the store returned
	spares    chan string   // spare WAL files ready for the writer (paths)
	opPool    sync.Pool

	// Memory and quota accounting.
	hotUnacked   atomic.Int64  // bytes of unacknowledged hot chunks
	hotHeld      atomic.Int64  // bytes of hot chunks the spool holds
	coldLive     atomic.Int64  // bytes of chunks in bbolt
	force        atomic.Bool   // the WAL writer asks for a checkpoint of everything
	armed        atomic.Bool   // the store has a checkpoint scheduled
	retire       atomic.Bool   // the store asks the WAL writer to give up its idle segment
	relief       chan struct{} // closed (and replaced, under mu) after each checkpoint
	appliedTotal atomic.Int64  // walTotal at the applied position

	fileBytes atomic.Int64
	upstream  atomic.Pointer[string] // SetUpstream's (Stats)
	deadN     atomic.Int64

	id         [16]byte               // the spool's id (meta key "id"), in every WAL segment
	draining   atomic.Bool            // drain.go
	ckptErr    atomic.Pointer[string] // the last checkpoint's error, nil when it succeeded
	walNoSpace atomic.Bool            // no space for the last new WAL segment (Refusing)
	synced     walPos                 // the store's: the acknowledged WAL end in spool.db

	w  walWriter  // the WAL writer goroutine's own
	st storeState // the store goroutine's own
}

const lockTimeout = 500 * time.Millisecond

var (
	bucketMeta  = []byte("meta")
	bucketLanes = []byte("lanes")
	bucketDead  = []byte("dead")
	// In meta (see the package doc); keySynced's value is keyWAL's 16
	// bytes and their CRC-32C.
	keyFormat = []byte("format")
	keyDead   = []byte("dead")
	keyWAL    = []byte("wal")
	keyID     = []byte("id")
	keySynced = []byte("walsync")
)

// formatVersion keeps an older relay from opening a file it would misread
// (5: a chunk may carry a tracking plan's verdict, which 4 would take for
// damage). Files of versions 1 to 4 are upgraded in place and read the
// same: chunks of versions 1 to 3 carry no checksum of their own (encode.go)
// and leave as they are delivered. The meta bucket takes new keys freely.
const formatVersion = 5

// Open opens or creates the spool in cfg.Dir, replays its WAL into bbolt,
// and starts its goroutines. log and reg may be nil. Open fails after about
// half a second when another process holds the spool.
func Open(cfg Config, log *zap.Logger, reg prometheus.Registerer) (*Spool, error) {
	switch {
	case cfg.Dir == "":
		return nil, errors.New("spool config: Dir is required")
	case cfg.MaxBytes < 0:
		return nil, errors.New("spool config: MaxBytes must not be negative")
	}
	cfg = cfg.withDefaults()
	log = cmp.Or(log, zap.NewNop())
	s := &Spool{
		cfg:       cfg,
		log:       log,
		path:      filepath.Join(cfg.Dir, "spool.db"),
		walDir:    walPath(cfg.Dir),
		lanesCh:   make(chan struct{}),
		walWake:   make(chan struct{}, 1),
		storeWake: make(chan struct{}, 1),
		closing:   make(chan struct{}),
		walDone:   make(chan struct{}),
		storeDone: make(chan struct{}),
		spares:    make(chan string, maxSpares),
		relief:    make(chan struct{}),
		st:        storeState{reported: map[walPos]bool{}},
	}
	s.laneCfg.Store(&cfg)
	if err := os.MkdirAll(s.walDir, 0o750); err != nil {
		return nil, fmt.Errorf("open spool: %w", err)
	}
	s.opPool.New = func() any { return &op{done: make(chan struct{}, 1)} }
	if err := removeIfExists(s.path + ".compact"); err != nil {
		return nil, fmt.Errorf("open spool: remove stale compaction file: %w", err)
	}
	if err := s.checkFiles(); err != nil {
		return nil, fmt.Errorf("open spool %s: %w", s.path, err)
	}
	db, err := s.openDB()
	if err != nil {
		return nil, err
	}
	s.db = db
	// bbolt panics on pages it cannot parse, and guard turns that and a
	// fault into ErrDamaged (checkFiles made sure the file holds every
	// page it claims).
	err = guard(func() error {
		err := s.load()
		if err != nil {
			return err
		}
		if err = s.replay(false); noSpace(err) {
			return s.startDraining(err)
		}
		return err
	})
	if err != nil {
		_ = guard(db.Close)
		return nil, fmt.Errorf("open spool %s: %w", s.path, err)
	}
	// load and replay touched pages all over the file, none needed again
	// soon: a relay started on a backlog should not carry them in its RSS.
	trimMapping(db)
	s.updateFileBytes()
	if s.m, err = newMetrics(s, reg); err != nil {
		db.Close()
		return nil, fmt.Errorf("open spool: metrics: %w", err)
	}
	s.m.damagedWAL.Add(float64(s.st.damaged))
	s.st.damagedCounted = s.st.damaged
	go s.runWAL()
	go s.runStore()
	return s, nil
}

func (s *Spool) openDB() (*bolt.DB, error) {
	var db *bolt.DB
	err := guard(func() (err error) {
		db, err = bolt.Open(s.path, 0o600, &bolt.Options{
			Timeout:         lockTimeout,
			NoFreelistSync:  true,
			FreelistType:    bolt.FreelistMapType,
			InitialMmapSize: 1 << 30,
			NoSync:          s.cfg.NoSync,
			MaxSize:         s.cfg.maxFileBytes,
		})
		return err
	})
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		err = errLocked
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum), errors.Is(err, berrors.ErrVersionMismatch):
		err = fmt.Errorf("%w: %w", ErrDamaged, err)
	}
	if err != nil {
		return nil, fmt.Errorf("open spool %s: %w", s.path, err)
	}
	return db, nil
}

// load creates the buckets of a new file and reads the lanes of an old one,
// the WAL positions applied to the file and acknowledged when it was last
// written, and the highest lane id the file assigned.
func (s *Spool) load() error {
	// Write only when something is missing: a commit at every Open would
	// leave the freelist on disk stale (keepFreelist).
	ready := false
	if err := s.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		ready = meta != nil && tx.Bucket(bucketLanes) != nil && tx.Bucket(bucketDead) != nil &&
			bytes.Equal(meta.Get(keyFormat), seqKey(formatVersion)) && len(meta.Get(keyID)) == len(s.id)
		return nil
	}); err != nil {
		return err
	}
	if !ready {
		if err := s.db.Update(createBuckets); err != nil {
			return err
		}
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		copy(s.id[:], meta.Get(keyID))
		if v := meta.Get(keyUpstream); v != nil {
			id := string(v)
			s.upstream.Store(&id)
		}
		if v := meta.Get(keyDead); len(v) == 16 {
			s.st.deadN = int64(binary.BigEndian.Uint64(v))
			s.st.deadBytes = int64(binary.BigEndian.Uint64(v[8:]))
		}
		s.deadN.Store(s.st.deadN)
		var err error
		if s.st.applied, s.synced, err = walPositions(meta.Get); err != nil {
			return fmt.Errorf("%w: %w", ErrDamaged, err)
		}
		lanesB := tx.Bucket(bucketLanes)
		s.st.lanesSeq = lanesB.Sequence()
		return lanesB.ForEach(func(k, v []byte) error {
			key, st, err := decodeLane(v)
			if err != nil {
				return fmt.Errorf("%w: lane %x: %w", ErrDamaged, k, err)
			}
			l := newLane(s, binary.BigEndian.Uint64(k), key, st)
			q := tx.Bucket(l.qname)
			if q == nil {
				return fmt.Errorf("%w: lane %s: queue bucket missing: %w", ErrDamaged, l.label, errCorrupt)
			}
			l.coldOldest = firstAccepted(q)
			l.wOldest = l.coldOldest
			s.lanes = append(s.lanes, l)
			s.byKey.add(l)
			s.st.live += int64(st.bytes)
			return nil
		})
	})
	s.coldLive.Store(s.st.live)
	return err
}

// walPositions decodes the WAL positions meta (get: its lookup) holds:
// applied to the file, and acknowledged when the file was last written.
func walPositions(get func(k []byte) []byte) (applied, synced walPos, err error) {
	var errs [2]error
	if v := get(keyWAL); v != nil {
		applied, errs[0] = decodePos(v)
	}
	if v := get(keySynced); len(v) == 20 && crc32.Checksum(v[:16], crcTable) == binary.BigEndian.Uint32(v[16:]) {
		synced, errs[1] = decodePos(v[:16])
	} else if v != nil {
		errs[1] = fmt.Errorf("acknowledged WAL position: %w", errChecksum)
	}
	return applied, synced, errors.Join(errs[0], errs[1])
}

// putSynced records p as the acknowledged WAL end; under NoSync it
// removes it (acknowledged records may be lost with the machine).
func (s *Spool) putSynced(meta *bolt.Bucket, p walPos) error {
	if s.cfg.NoSync {
		return meta.Delete(keySynced)
	}
	v := p.encode()
	return meta.Put(keySynced, binary.BigEndian.AppendUint32(v, crc32.Checksum(v, crcTable)))
}

// createBuckets creates the buckets of a new file, and upgrades the format
// of an older one (see formatVersion).
func createBuckets(tx *bolt.Tx) error {
	meta, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return err
	}
	v := meta.Get(keyFormat)
	var version uint64 // 0: missing or malformed
	if len(v) == 8 {
		version = binary.BigEndian.Uint64(v)
	}
	switch {
	case v == nil, version >= 1 && version < formatVersion:
		if err := meta.Put(keyFormat, seqKey(formatVersion)); err != nil {
			return err
		}
	case version != formatVersion:
		return fmt.Errorf("unknown spool format %x: written by a newer relay; run that version (or drain the spool with it) instead", v)
	}
	if len(meta.Get(keyID)) != 16 {
		var id [16]byte
		rand.Read(id[:]) // never fails (it crashes the program instead)
		if err := meta.Put(keyID, id[:]); err != nil {
			return err
		}
	}
	if _, err := tx.CreateBucketIfNotExists(bucketLanes); err != nil {
		return err
	}
	_, err = tx.CreateBucketIfNotExists(bucketDead)
	return err
}

// firstAccepted is the acceptance time of queue q's first chunk, 0 when
// none or its header does not decode (reading it reports the damage).
func firstAccepted(q *bolt.Bucket) int64 {
	k, v := q.Cursor().First()
	if k == nil {
		return 0
	}
	ms, _, _ := chunkHeader(chunkValue(q, k, v))
	return ms
}

// Close writes what is queued to the WAL, moves every unacknowledged chunk
// into bbolt, stops the goroutines and closes the files. Blocked Next calls
// and a second Close return ErrClosed; acks after Close are dropped.
func (s *Spool) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.closed = true
	s.mu.Unlock()
	close(s.closing)
	wake(s.walWake)
	<-s.walDone
	wake(s.storeWake)
	<-s.storeDone
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
func (s *Spool) Lane(ctx context.Context, key storage.LaneKey) (*Lane, error) {
	if l := s.byKey.get(key); l != nil {
		return l, nil
	}
	s.mu.Lock()
	err := s.refuseLaneLocked(key.APIKey, nil)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	o := s.getOp(opLane)
	o.key = key
	return s.do(ctx, o)
}

// Lanes returns every lane, oldest first.
func (s *Spool) Lanes() []*Lane {
	ls, _ := s.lanesFrom(0)
	return ls
}

// Append writes b as one chunk at the tail of lane l and returns once it is
// durable (see Config.NoSync). On success it takes b's records over and
// leaves b empty; on error b is unchanged. ctx is checked before the chunk
// is queued; once queued, Append waits for the write so that its answer is
// the truth. When l was retired, the chunk goes to the live lane of its
// key, created again if needed (which may fail with ErrTooManyLanes).
func (s *Spool) Append(ctx context.Context, l *Lane, b *storage.Batch) error {
	if b.Len() == 0 {
		return nil
	}
	if l.s != s {
		return errors.New("spool: append to a lane of another spool")
	}
	if s.draining.Load() {
		s.m.rejectedDisk.Inc()
		return ErrDiskLow
	}
	l, err := s.beginAppend(ctx, l)
	if err != nil {
		return err
	}
	defer l.appending.Add(-1)
	o := s.getOp(opAppend)
	o.lane, o.batch, o.accepted = l, b, time.Now().UnixMilli()
	l.lastUse.Store(o.accepted)
	// Right-sized and checksummed here, in the caller's goroutine (wal.go).
	b.Fit()
	o.crc = putChunkHeader(b.Encoded(), o.accepted, b.Len(), b.Verdict() != 0)
	_, err = s.do(ctx, o)
	return err
}

// Ack records that every record of the lane's chunk seq is done (delivered
// or dead-lettered); it does not block (see the package doc). Acknowledging
// a chunk twice, or one that does not exist, is harmless.
func (l *Lane) Ack(seq uint64) {
	s := l.s
	l.mu.Lock()
	c := l.hot.find(seq)
	if c != nil && c.acked {
		l.mu.Unlock()
		return
	}
	var cb *storage.Buf
	if c != nil {
		cb = l.hot.ack(c)
	}
	cold := c == nil && seq < l.hot.firstSeq(l.next)
	l.mu.Unlock()
	if c != nil {
		s.hotUnacked.Add(-int64(c.size))
		if cb != nil {
			cb.Release()
			s.hotHeld.Add(-int64(c.size))
		}
	} else if !cold {
		return // never written, or acknowledged already
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	if !s.draining.Load() { // draining writes nothing to the WAL (drain.go)
		s.acks = append(s.acks, ackOp{l, seq})
	}
	if cold {
		s.coldAcks = append(s.coldAcks, ackOp{l, seq})
	}
	s.mu.Unlock()
	wake(s.walWake)
	if cold && !s.armed.Load() {
		wake(s.storeWake) // it has a checkpoint to schedule
	}
}

// PutDead commits dead letters, setting their IDs, and returns once they
// are durable. They are never refused for space: they precede an Ack that
// frees more.
func (s *Spool) PutDead(ctx context.Context, dls []storage.DeadLetter) error {
	if len(dls) == 0 {
		return nil
	}
	o := s.getOp(opPutDead)
	o.dls = dls
	_, err := s.do(ctx, o)
	return err
}

// ListDead returns up to limit dead letters with ID > after that match f, by
// ID. limit <= 0 means no limit. The results own their memory.
func (s *Spool) ListDead(ctx context.Context, f storage.DeadFilter, after uint64, limit int) ([]storage.DeadLetter, error) {
	if err := ctx.Err(); err != nil || after == math.MaxUint64 {
		return nil, err
	}
	var out []storage.DeadLetter
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketDead).Cursor()
		for k, v := c.Seek(seqKey(after + 1)); k != nil; k, v = c.Next() {
			if limit > 0 && len(out) >= limit {
				break
			}
			d, err := decodeDead(binary.BigEndian.Uint64(k), bytes.Clone(v))
			if err != nil {
				return fmt.Errorf("dead letter %x: %w", k, err)
			}
			if f.Lane != nil && d.Lane != *f.Lane || f.Reason != "" && d.Reason != f.Reason || f.Label != "" && d.Lane.Label() != f.Label {
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

// view runs f in a read transaction of the file (ErrClosed once it is
// closed), bbolt's panics and faults turned into ErrDamaged (guard).
func (s *Spool) view(f func(*bolt.Tx) error) error {
	s.dbMu.RLock()
	defer s.dbMu.RUnlock()
	if s.db == nil {
		return ErrClosed
	}
	return guard(func() error { return s.db.View(f) })
}

// DeleteDead removes the dead letters with the given ids (durably).
func (s *Spool) DeleteDead(ctx context.Context, ids []uint64) error {
	if len(ids) == 0 {
		return nil
	}
	o := s.getOp(opDelDead)
	o.ids = ids
	_, err := s.do(ctx, o)
	return err
}

// Stats is a snapshot of the whole spool.
type Stats struct {
	LiveBytes int64 // record bytes counted against the quota
	FileBytes int64 // disk space of the bbolt file and the WAL (allocated blocks)
	Lanes     int
	Dead      int64
	Upstream  string // SetUpstream's, "" when none
	// Refusing says why Append refuses chunks now, nil when it takes them,
	// for a readiness probe: draining (ErrDiskLow), checkpoints failing at
	// the memory bound (ErrFull), no space for a new WAL segment. It clears
	// by itself. The quota and the disk reserve are the caller's to compare.
	Refusing error
}

// Stats returns a snapshot of the spool, cheap from any goroutine.
func (s *Spool) Stats() Stats {
	s.mu.Lock()
	n := len(s.lanes)
	s.mu.Unlock()
	st := Stats{
		LiveBytes: s.liveBytes(),
		FileBytes: s.fileBytes.Load(),
		Lanes:     n,
		Dead:      s.deadN.Load(),
		Refusing:  s.refusing(),
	}
	if p := s.upstream.Load(); p != nil {
		st.Upstream = *p
	}
	return st
}

// liveBytes is what counts against MaxBytes: the unacknowledged hot chunks
// and the chunks in bbolt.
func (s *Spool) liveBytes() int64 { return s.hotUnacked.Load() + s.coldLive.Load() }
