package spool

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/svcrelay/relay/internal/storage"
)

type opKind uint8

const (
	opAppend opKind = iota // the WAL writer's
	opLane                 // the store's, as the rest
	opPutDead
	opDelDead
)

// op is one operation queued for the WAL writer or the store; its caller
// waits on done.
type op struct {
	kind     opKind
	lane     *Lane // opAppend: target; opLane: result
	batch    *storage.Batch
	accepted int64  // unix ms
	crc      uint32 // opAppend: the chunk's checksum (its WAL record's payload)
	seq      uint64 // opAppend: assigned by the WAL writer
	key      storage.LaneKey
	dls      []storage.DeadLetter
	ids      []uint64
	err      error
	done     chan struct{} // capacity 1
}

type ackOp struct {
	lane *Lane
	seq  uint64
}

// walWriter belongs to the WAL writer goroutine (and to Open before it
// starts).
type walWriter struct {
	f      *os.File // the current segment; nil before the first write and after a failed one
	fd     int
	no     uint64 // its number
	off    int64  // where the next record goes
	size   int64  // its size
	nextNo uint64 // the next segment's number
	total  int64  // bytes written since Open
	gStart int64  // offset of the last write's first chunk record

	ops    []*op
	acks   []ackOp
	retry  []ackOp // acks of a failed write, written with the next one
	hdrs   []byte
	ackBuf []byte
	iovs   [][]byte

	diskFree    int64 // free bytes at diskChecked
	diskChecked time.Time
	diskWritten int64 // bytes appended since diskChecked

	lastGroup int // appends in the last write

	prevNo, prevEnd uint64 // the previous segment and its end (recStart)
	startBuf        [startLen]byte
	segLanes        map[uint64]struct{} // lanes with a recLane record in the current segment
}

// diskCheckEvery is how long a statfs result is trusted.
const diskCheckEvery = 500 * time.Millisecond

func (s *Spool) getOp(k opKind) *op {
	o := s.opPool.Get().(*op)
	o.kind = k
	return o
}

func (s *Spool) putOp(o *op) {
	done := o.done
	*o = op{done: done}
	s.opPool.Put(o)
}

// reuse empties s for reuse, zeroing its elements so that nothing they
// point to stays reachable through it.
func reuse[T any](s []T) []T {
	clear(s)
	return s[:0]
}

// wake signals a goroutine waiting on c (capacity 1) without blocking.
func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// do queues o for its goroutine, waits for its result (and opLane's lane)
// and puts o back in the pool.
func (s *Spool) do(ctx context.Context, o *op) (*Lane, error) {
	defer s.putOp(o)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	c := s.walWake
	if o.kind == opAppend {
		s.appends = append(s.appends, o)
	} else {
		s.sops = append(s.sops, o)
		c = s.storeWake
	}
	s.mu.Unlock()
	wake(c)
	<-o.done
	if o.err != nil {
		return nil, o.err
	}
	return o.lane, nil
}

// runWAL is the WAL writer goroutine.
func (s *Spool) runWAL() {
	defer close(s.walDone)
	defer s.closeSegment()
	for {
		ops, acks, closed := s.takeWAL()
		if len(ops) > 0 || len(acks) > 0 {
			s.writeGroup(ops, acks)
		} else if closed {
			return
		}
	}
}

// commitGather bounds takeWAL's wait for a group to fill. An fsync costs
// about the same for one append as for eight: at 32 connections of 1-event
// requests 50 µs took 8-10% more requests a second (20 µs and 150 µs less).
const commitGather = 50 * time.Microsecond

// takeWAL waits for queued appends or acks and takes every ack and the
// appends that fit in one write (one at least). Unless NoSync, when the
// last write carried more appends than are queued now, it first waits up
// to commitGather for as many: the others are likely in flight, and each
// would otherwise wait for an fsync of its own. A lone client never waits.
func (s *Spool) takeWAL() (ops []*op, acks []ackOp, closed bool) {
	max := min(s.cfg.maxCommitBytes, int(s.cfg.segmentBytes/4))
	var gatherUntil time.Time
	for {
		s.mu.Lock()
		if q := len(s.appends); q > 0 && q < s.w.lastGroup && !s.closed && !s.cfg.NoSync {
			now := time.Now()
			if gatherUntil.IsZero() {
				gatherUntil = now.Add(s.cfg.gather)
			}
			if now.Before(gatherUntil) {
				s.mu.Unlock()
				s.waitGather(gatherUntil.Sub(now))
				continue
			}
		}
		if len(s.appends) > 0 || len(s.acks) > 0 || len(s.w.retry) > 0 || s.closed {
			n, size := 0, 0
			for n < len(s.appends) {
				sz := s.appends[n].batch.Bytes()
				if n > 0 && size+sz > max {
					break
				}
				size += sz
				n++
			}
			ops = append(s.w.ops[:0], s.appends[:n]...)
			s.appends = slices.Delete(s.appends, 0, n)
			// Swap the ack slices: the writer's spare becomes the queue.
			acks, s.acks = s.acks, s.w.acks[:0]
			closed = s.closed
			s.mu.Unlock()
			s.w.ops = ops
			if len(s.w.retry) > 0 {
				acks = append(acks, s.w.retry...)
				s.w.retry = reuse(s.w.retry)
			}
			return ops, acks, closed
		}
		s.mu.Unlock()
		if s.retire.Swap(false) {
			s.retireSegment()
		}
		<-s.walWake
	}
}

// waitGather waits until an append is queued or d passes. It yields rather
// than sleeps: a timer this short fires a millisecond late when the Ps are
// idle, and yielding lets the appending handlers run.
func (s *Spool) waitGather(d time.Duration) {
	for until := time.Now().Add(d); time.Now().Before(until); {
		select {
		case <-s.walWake:
			return
		default:
		}
		runtime.Gosched()
	}
}

// retireSegment gives up an idle spool's segment: the WAL's end moves to
// the next one's start, so that the next checkpoint frees this one.
func (s *Spool) retireSegment() {
	if s.w.f == nil {
		return
	}
	s.closeSegment()
	s.mu.Lock()
	s.walEnd = walPos{s.w.nextNo, 0}
	s.mu.Unlock()
	wake(s.storeWake)
}

// writeGroup writes the acks and the admitted appends in one write, then
// publishes the chunks to their lanes and answers every waiter.
func (s *Spool) writeGroup(ops []*op, acks []ackOp) {
	start := time.Now()
	s.waitMemory(ops)
	s.w.lastGroup = len(ops)
	n, bytes, records := s.admit(ops, start)
	var err error
	if n > 0 || len(acks) > 0 {
		err = s.write(ops, acks)
	}
	switch {
	case err != nil:
		err = fmt.Errorf("spool append: %w", err)
		s.log.Error("spool: WAL write failed", zap.Error(err))
		s.w.retry = append(s.w.retry, acks...)
		s.skip(ops)
	case n == 0:
		s.publish(nil) // acks only: the WAL's end moved
	default:
		s.publish(ops)
		s.hotUnacked.Add(bytes)
		s.hotHeld.Add(bytes)
		s.m.commitSeconds.Observe(time.Since(start).Seconds())
		s.m.commitRecords.Observe(float64(records))
		s.m.commits.Inc()
		if s.hotHeld.Load() > s.cfg.hotMaxBytes || s.w.total-s.appliedTotal.Load() > s.cfg.walMaxBytes {
			s.force.Store(true)
			wake(s.storeWake)
		} else if !s.armed.Load() {
			wake(s.storeWake) // it has a checkpoint to schedule
		}
	}
	for _, o := range ops {
		if o.err == nil {
			o.err = err
		}
		o.done <- struct{}{}
	}
	s.w.acks = reuse(acks) // an ack names its lane: a retired one must not stay reachable
	s.w.ops = reuse(s.w.ops)
}

const hotWaitMax = 5 * time.Second

// waitMemory holds the group back, at most hotWaitMax, while it would take
// the hot chunks' memory past the hard bound (twice hotMaxBytes) and
// checkpoints succeed: appends then wait for bbolt instead of being
// refused. admit refuses what still does not fit.
func (s *Spool) waitMemory(ops []*op) {
	var group int64
	for _, o := range ops {
		group += int64(o.batch.Bytes())
	}
	hard := 2 * s.cfg.hotMaxBytes
	deadline := time.Now().Add(hotWaitMax)
	for held := s.hotHeld.Load(); held > 0 && held+group > hard && s.ckptErr.Load() == nil && time.Now().Before(deadline); held = s.hotHeld.Load() {
		s.force.Store(true)
		wake(s.storeWake)
		s.mu.Lock()
		relief := s.relief
		s.mu.Unlock()
		t := time.NewTimer(time.Millisecond) // acks free memory too
		select {
		case <-relief:
		case <-t.C:
		}
		t.Stop()
	}
}

// admit refuses the appends that the quota, the memory bound or the disk
// reserve do not allow and assigns the others their seqs. It returns how
// many it admitted, their bytes and records.
func (s *Spool) admit(ops []*op, now time.Time) (n int, bytes int64, records int) {
	live, held := s.liveBytes(), s.hotHeld.Load()
	hard := 2 * s.cfg.hotMaxBytes
	minFree := s.cfg.MinFreeBytes
	for _, o := range ops {
		sz := int64(len(o.batch.Encoded()))
		switch {
		case s.cfg.MaxBytes > 0 && live+bytes+sz > s.cfg.MaxBytes,
			// Checkpoints do not keep up: refuse rather than hold
			// unbounded memory (a group alone is a few MiB at most).
			held > 0 && held+bytes+sz > hard:
			o.err = ErrFull
			s.m.rejectedFull.Inc()
			continue
		case minFree > 0 && s.diskFree(now)-sz < minFree:
			o.err = ErrDiskLow
			s.m.rejectedDisk.Inc()
			continue
		}
		l := o.lane
		o.seq = l.aNext
		l.aNext++
		n++
		bytes += sz
		records += o.batch.Len()
		s.w.diskWritten += sz
	}
	return n, bytes, records
}

// write writes the records of acks and of the admitted appends at the end
// of the current segment (a new one when they do not fit) and, when there
// are appends, fdatasyncs it unless NoSync. On error the segment is given
// up.
func (s *Spool) write(ops []*op, acks []ackOp) error {
	// The records, the end mark, a new segment's start and lane records.
	room := int64(recHeaderLen + startLen + recHeaderLen)
	if len(acks) > 0 {
		room += recHeaderLen + int64(len(acks))*ackEntryLen
	}
	appends := false
	for _, o := range ops {
		if o.err == nil {
			room += 2*recHeaderLen + int64(len(o.batch.Encoded())+len(o.lane.walRec))
			appends = true
		}
	}
	if s.w.f == nil || s.w.off+room > s.w.size {
		err := s.rotate(room)
		s.walNoSpace.Store(noSpace(err)) // for Refusing
		if err != nil {
			return err
		}
	}
	// recStart first; a lane's recLane before its first chunk of the
	// segment.
	start := s.w.off == 0
	if start {
		clear(s.w.segLanes)
	}
	hdrs := slices.Grow(s.w.hdrs[:0], (2+2*len(ops))*recHeaderLen)
	s.w.hdrs = hdrs
	iovs := s.w.iovs[:0]
	need := int64(0) // the bytes of the records
	add := func(typ byte, lane, seq uint64, p []byte, crc uint32) {
		h := hdrs[len(hdrs) : len(hdrs)+recHeaderLen]
		hdrs = hdrs[:len(hdrs)+recHeaderLen]
		putRecHeader(h, s.w.no, typ, lane, seq, len(p), crc)
		iovs = append(iovs, h, p)
		need += recHeaderLen + int64(len(p))
	}
	if start {
		sb := s.w.startBuf[:]
		copy(sb, s.id[:])
		binary.LittleEndian.PutUint64(sb[16:], s.w.prevNo)
		binary.LittleEndian.PutUint64(sb[24:], s.w.prevEnd)
		add(recStart, 0, 0, sb, payloadCRC(sb))
	}
	if len(acks) > 0 {
		ab := s.w.ackBuf[:0]
		for _, a := range acks {
			ab = binary.LittleEndian.AppendUint64(ab, a.lane.id)
			ab = binary.LittleEndian.AppendUint64(ab, a.seq)
		}
		s.w.ackBuf = ab
		add(recAcks, 0, 0, ab, payloadCRC(ab))
	}
	for _, o := range ops {
		if _, ok := s.w.segLanes[o.lane.id]; o.err == nil && !ok {
			if s.w.segLanes == nil {
				s.w.segLanes = make(map[uint64]struct{})
			}
			s.w.segLanes[o.lane.id] = struct{}{}
			add(recLane, o.lane.id, 0, o.lane.walRec, payloadCRC(o.lane.walRec))
		}
	}
	s.w.gStart = s.w.off + need // where the chunk records start, for publish
	for _, o := range ops {
		if o.err == nil {
			add(recChunk, o.lane.id, o.seq, o.batch.Encoded(), o.crc)
		}
	}
	if s.w.off+need+recHeaderLen <= s.w.size {
		// The end mark, so that a reader does not take a reused file's
		// old bytes for a write cut short.
		iovs = append(iovs, endMark[:])
	}
	err := s.pwrite(iovs, s.w.off)
	s.w.iovs = reuse(iovs)
	if err == nil && appends && !s.cfg.NoSync {
		err = fdatasync(s.w.fd)
		if s.cfg.walFault != nil && err == nil {
			err = s.cfg.walFault(true)
		}
	}
	if err != nil {
		s.abandon(need)
		return err
	}
	s.w.off += need
	s.w.total += need
	s.w.prevNo, s.w.prevEnd = s.w.no, uint64(s.w.off)
	return nil
}

// endMark follows every write (see write).
var endMark [recHeaderLen]byte

// pwrite writes iovs at off in the current segment, all of them.
func (s *Spool) pwrite(iovs [][]byte, off int64) error {
	if s.cfg.walFault != nil {
		if err := s.cfg.walFault(false); err != nil {
			return err
		}
	}
	const iovMax = 1024 // IOV_MAX on Linux
	for len(iovs) > 0 {
		batch := iovs[:min(len(iovs), iovMax)]
		n, err := unix.Pwritev(s.w.fd, batch, off)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		off += int64(n)
		for n > 0 {
			if n >= len(iovs[0]) {
				n -= len(iovs[0])
				iovs = iovs[1:]
			} else {
				iovs[0] = iovs[0][n:]
				n = 0
			}
		}
		for len(iovs) > 0 && len(iovs[0]) == 0 {
			iovs = iovs[1:]
		}
	}
	return nil
}

func fdatasync(fd int) error {
	for {
		err := syscall.Fdatasync(fd)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// abandon gives up the current segment after a failed write of n bytes,
// zeroing them so that a replay ends before the failed records (best
// effort: should it fail, they may come back, which only repeats events).
func (s *Spool) abandon(n int64) {
	if s.w.f == nil {
		return
	}
	zero := make([]byte, min(n, 1<<20))
	ok := true
	for at := int64(0); at < n && ok; at += int64(len(zero)) {
		_, err := s.w.f.WriteAt(zero[:min(int64(len(zero)), n-at)], s.w.off+at)
		ok = err == nil
	}
	if ok {
		_ = fdatasync(s.w.fd)
	}
	s.closeSegment()
}

func (s *Spool) closeSegment() {
	if s.w.f != nil {
		s.w.f.Close()
		s.w.f = nil
	}
}

// rotate starts the next segment, of the standard size or of need bytes
// when larger: a spare file renamed when there is one, else a new file with
// its blocks allocated. Unless NoSync, its name is made durable first.
func (s *Spool) rotate(need int64) error {
	s.closeSegment()
	no := s.w.nextNo
	size := s.cfg.segmentBytes
	path := filepath.Join(s.walDir, segName(no))
	var f *os.File
	if need <= size {
		select {
		case sp := <-s.spares:
			err := os.Rename(sp, path)
			if err == nil {
				f, err = os.OpenFile(path, os.O_RDWR, 0)
			}
			if err != nil {
				s.log.Warn("spool: reuse WAL file", zap.Error(err))
				_ = os.Remove(sp) // gone already when renamed: then a new file replaces it
			}
		default:
		}
	} else {
		size = need
	}
	if f == nil {
		var err error
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return fmt.Errorf("new WAL segment: %w", err)
		}
		if err := allocFile(f, size); err != nil {
			f.Close()
			_ = os.Remove(path)
			return fmt.Errorf("new WAL segment: %w", err)
		}
	}
	if !s.cfg.NoSync {
		if err := syncDir(s.walDir); err != nil {
			f.Close()
			return fmt.Errorf("new WAL segment: %w", err)
		}
	}
	s.w.f, s.w.fd, s.w.no, s.w.off, s.w.size = f, int(f.Fd()), no, 0, size
	s.w.nextNo++
	return nil
}

// publish hands the written chunks to their lanes as hot chunks holding
// their batches' buffers, wakes the readers, and moves the WAL's published
// end.
func (s *Spool) publish(ops []*op) {
	at := s.w.gStart
	for _, o := range ops {
		if o.err != nil {
			continue
		}
		l, b := o.lane, o.batch
		c := &hotChunk{
			seq:      o.seq,
			accepted: o.accepted,
			records:  b.Len(),
			size:     len(b.Encoded()),
			pos:      walPos{s.w.no, at},
			walAt:    s.w.total - (s.w.off - at),
		}
		at += recHeaderLen + int64(c.size)
		c.cb = b.Take()
		l.mu.Lock()
		l.hot.push(c)
		l.next = c.seq + 1
		l.wakeLocked()
		l.mu.Unlock()
	}
	s.mu.Lock()
	s.walEnd = walPos{s.w.no, s.w.off}
	s.walTotal = s.w.total
	s.markDirtyLocked(ops)
	s.mu.Unlock()
}

// wakeLocked wakes or starts (whenWork) the lane's reader. l.mu held.
func (l *Lane) wakeLocked() {
	if l.watched {
		close(l.notify)
		l.notify = make(chan struct{})
		l.watched = false
	}
	if f := l.onWork; f != nil {
		l.onWork = nil
		go f()
	}
}

// skip publishes, after a failed write, that its chunks' seqs are not
// used: never given again (a record may be on disk), stepped over.
func (s *Spool) skip(ops []*op) {
	for _, o := range ops {
		if o.err != nil || o.seq == 0 {
			continue
		}
		l := o.lane
		l.mu.Lock()
		l.next = max(l.next, o.seq+1)
		l.mu.Unlock()
	}
	s.mu.Lock()
	s.markDirtyLocked(ops)
	s.mu.Unlock()
}

// diskFree estimates the filesystem's free bytes.
func (s *Spool) diskFree(now time.Time) int64 {
	if now.Sub(s.w.diskChecked) >= diskCheckEvery || now.Before(s.w.diskChecked) {
		var st syscall.Statfs_t
		if err := syscall.Statfs(s.cfg.Dir, &st); err != nil {
			s.log.Warn("spool: statfs failed", zap.Error(err))
			return s.w.diskFree - s.w.diskWritten
		}
		s.w.diskFree = int64(st.Bavail) * int64(st.Bsize)
		s.w.diskChecked = now
		s.w.diskWritten = 0
	}
	return s.w.diskFree - s.w.diskWritten
}
