package spool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

// TestFill fills a small quota from concurrent appenders until every one is
// refused, proves the refused appends wrote nothing, then drains and proves
// appends are accepted again.
func TestFill(t *testing.T) {
	const quota = 64 << 10
	s := openTest(t, Config{NoSync: true, MaxBytes: quota})
	ctx := context.Background()
	l := mustLane(t, s, testKey(1))
	var (
		mu       sync.Mutex
		accepted = map[int]bool{}
		refused  = map[int]bool{}
		wg       sync.WaitGroup
	)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b storage.Batch
			for n := range 1000 { // bounded; the quota stops it far earlier
				id := w*1000 + n
				b.Reset()
				b.Add(rec(1, id, 400))
				b.Add(rec(1, id, 400))
				err := s.Append(ctx, l, &b)
				mu.Lock()
				if err == nil {
					accepted[id] = true
				} else {
					refused[id] = true
				}
				mu.Unlock()
				if errors.Is(err, ErrFull) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(refused) != 16 {
		t.Fatalf("%d appenders refused, want 16", len(refused))
	}
	st := l.Stats()
	if st.Bytes > quota || st.Bytes < quota-2*b2(t) || st.Records != int64(2*len(accepted)) || st.Chunks != int64(len(accepted)) {
		t.Fatalf("stats %+v with %d accepted appends", st, len(accepted))
	}
	// Exactly the accepted records are stored, once each.
	seen := map[int]int{}
	for _, c := range drainAvailable(t, l) {
		for _, r := range c.Records {
			_, id := recID(r)
			seen[id]++
		}
		l.Ack(c.Seq)
	}
	if len(seen) != len(accepted) {
		t.Fatalf("stored %d appends, %d accepted", len(seen), len(accepted))
	}
	for id, n := range seen {
		if !accepted[id] || n != 2 {
			t.Fatalf("record %d stored %d times, accepted=%v refused=%v", id, n, accepted[id], refused[id])
		}
	}
	// Drained: accepted again.
	polltest.Until(t, "no live bytes", func() bool { return s.Stats().LiveBytes == 0 })
	var b storage.Batch
	b.Add(rec(1, 99999, 400))
	if err := s.Append(ctx, l, &b); err != nil {
		t.Fatalf("append after drain: %v", err)
	}
}

// b2 is the encoded size of one test append of TestFill.
func b2(t testing.TB) int64 {
	var b storage.Batch
	b.Add(rec(1, 1000, 400))
	b.Add(rec(1, 1000, 400))
	return int64(b.Bytes())
}

// TestDiskLow: a reserve larger than the filesystem's free space refuses
// appends, writes nothing, and still lets lanes, dead letters and acks work.
func TestDiskLow(t *testing.T) {
	s := openTest(t, Config{NoSync: true, MinFreeBytes: 1 << 62})
	ctx := context.Background()
	l := mustLane(t, s, testKey(1))
	var b storage.Batch
	b.Add(rec(1, 1, 10))
	if err := s.Append(ctx, l, &b); !errors.Is(err, ErrDiskLow) {
		t.Fatalf("Append: %v, want ErrDiskLow", err)
	}
	if st := l.Stats(); st.Chunks != 0 || s.Stats().LiveBytes != 0 {
		t.Fatalf("refused append left %+v", st)
	}
	if err := s.PutDead(ctx, []storage.DeadLetter{{Lane: l.Key(), Reason: "x"}}); err != nil {
		t.Fatalf("PutDead with low disk: %v", err)
	}
	ctx2, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if cs, err := readWhole(ctx2, l, 100); err == nil {
		t.Fatalf("refused append is readable: %+v", cs)
	}
}

// TestDiskReserveOK: the default reserve (256 MiB) lets appends through on a
// filesystem with room, and a disabled check (negative) too.
func TestDiskReserveOK(t *testing.T) {
	for _, min := range []int64{0, -1} {
		s := openTest(t, Config{NoSync: true, MinFreeBytes: min})
		l := mustLane(t, s, testKey(1))
		var b storage.Batch
		b.Add(rec(1, 1, 10))
		if err := s.Append(context.Background(), l, &b); err != nil {
			t.Fatalf("MinFreeBytes %d: %v", min, err)
		}
	}
}

// TestCheckpointFailure makes checkpoints fail the way a full filesystem
// does (the bbolt file cannot grow): appends go on into the WAL until the
// memory bound, then are refused (at once: a failing store makes no
// progress to wait for); every append that returned nil survives, in
// order, reads and a restart; once acks free pages, checkpoints and appends
// work again.
func TestCheckpointFailure(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, NoSync: true, maxFileBytes: 24 << 20, CompactMinFileBytes: -1,
		hotMaxBytes: 4 << 20, flushAge: time.Nanosecond, checkpointEvery: time.Millisecond}
	s, err := Open(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l := mustLane(t, s, testKey(1))
	big := func(id int) *storage.Batch {
		var b storage.Batch
		for r := range 4 {
			b.Add(rec(1, id, 256<<10+r)) // ~1 MB per chunk
		}
		return &b
	}
	var ok []int
	var failErr error
	var failTook time.Duration
	for id := range 200 {
		start := time.Now()
		if err := s.Append(ctx, l, big(id)); err != nil {
			failErr, failTook = err, time.Since(start)
			break
		}
		ok = append(ok, id)
		polltest.Until(t, "the chunks tried", func() bool { return s.checkpointed() || s.ckptFailing() })
	}
	if !errors.Is(failErr, ErrFull) || !s.ckptFailing() {
		t.Fatalf("after %d appends: %v (checkpoint failing: %v), want ErrFull from failing checkpoints", len(ok), failErr, s.ckptFailing())
	}
	// Only the refused append is timed: one that waited for the failing
	// store took hotWaitMax at least, a refusal at once milliseconds.
	if failTook >= hotWaitMax {
		t.Fatalf("refused after %v: the writer waited for a failing store", failTook)
	}
	t.Logf("%d appends taken, then: %v", len(ok), failErr)
	if st := l.Stats(); st.Chunks != int64(len(ok)) {
		t.Fatalf("stats %+v after %d good appends", st, len(ok))
	}
	// A restart while bbolt is full: the WAL still has everything.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.maxFileBytes = 0
	s = openTest(t, cfg)
	l = s.Lanes()[0]
	cs := drainAvailable(t, l)
	if len(cs) != len(ok) {
		t.Fatalf("read %d chunks after a restart, %d were taken", len(cs), len(ok))
	}
	for i, c := range cs {
		if _, id := recID(c.Records[0]); id != ok[i] {
			t.Fatalf("chunk %d holds append %d", i, id)
		}
	}
	s.Close()

	// Full again, and no restart: acks free pages and memory.
	cfg.maxFileBytes = 24 << 20
	s = openTest(t, cfg)
	l = s.Lanes()[0]
	cs = drainAvailable(t, l)
	for _, c := range cs {
		l.Ack(c.Seq)
	}
	polltest.Until(t, "no live bytes", func() bool { return s.Stats().LiveBytes == 0 })
	for id := range 3 {
		if err := s.Append(ctx, l, big(2000+id)); err != nil {
			t.Fatalf("append after drain: %v", err)
		}
	}
	waitCheckpointed(t, s)
	if s.ckptFailing() {
		t.Fatal("checkpoints still fail after the drain")
	}
	if cs := drainAvailable(t, l); len(cs) != 3 {
		t.Fatalf("after recovery read %d chunks", len(cs))
	}
}

// TestWALWriteFailure fails WAL writes (before the write, and after it in
// place of the fdatasync, when the records are in the file): the appends of
// a failed write get the error and are neither read nor found after a
// restart; the others, before and after, are intact and in order, and the
// spool goes on in a new segment.
func TestWALWriteFailure(t *testing.T) {
	for _, synced := range []bool{false, true} {
		t.Run(fmt.Sprintf("after write %v", synced), func(t *testing.T) {
			dir := t.TempDir()
			var fail atomic.Bool
			// No checkpoint after the lane's: a crash image replays every
			// segment, the failed writes' too.
			cfg := Config{Dir: dir, checkpointEvery: time.Hour, walFault: func(s bool) error {
				if s == synced && fail.Load() {
					return errors.New("injected I/O error")
				}
				return nil
			}}
			s := openTest(t, cfg)
			ctx := context.Background()
			l := mustLane(t, s, testKey(1))
			var ok []int
			for id := range 30 {
				var b storage.Batch
				b.Add(rec(1, id, 100))
				fail.Store(id%10 == 5)
				err := s.Append(ctx, l, &b)
				switch {
				case id%10 == 5 && err == nil:
					t.Fatalf("append %d: no error from a failed write", id)
				case id%10 != 5 && err != nil:
					t.Fatalf("append %d: %v", id, err)
				case err == nil:
					ok = append(ok, id)
				}
			}
			check := func(cs []storage.Chunk, when string) {
				t.Helper()
				if len(cs) != len(ok) {
					t.Fatalf("%s: %d chunks, %d appends succeeded", when, len(cs), len(ok))
				}
				for i, c := range cs {
					if _, id := recID(c.Records[0]); id != ok[i] {
						t.Fatalf("%s: chunk %d holds append %d", when, i, id)
					}
				}
			}
			check(drainAvailable(t, l), "read")
			if s.w.nextNo < 4 {
				t.Fatalf("segments used: %d, want a new one after each failed write", s.w.nextNo-1)
			}
			img := crashImage(t, dir)
			s.Close()
			s = openTest(t, Config{Dir: dir})
			check(drainAvailable(t, s.Lanes()[0]), "after a restart")
			s = openTest(t, Config{Dir: img})
			check(drainAvailable(t, s.Lanes()[0]), "after a crash")
		})
	}
}

// TestReplayTornTail cuts the last WAL segment of a crash image inside its
// last record, and then fills the rest of the segment with garbage: the
// replay keeps every record before the cut, drops the torn one without an
// error, and reads nothing of the garbage.
func TestReplayTornTail(t *testing.T) {
	dir := t.TempDir()
	// No checkpoint after the lane's: everything is in the WAL.
	s := openTest(t, Config{Dir: dir, checkpointEvery: time.Hour})
	ctx := context.Background()
	l := mustLane(t, s, testKey(1))
	const n = 20
	for id := range n {
		if id == n-1 {
			l.Ack(3) // hot; its record precedes the last chunk's
		}
		var b storage.Batch
		b.Add(rec(1, id, 300))
		if err := s.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
	}
	img := crashImage(t, dir)
	segs, _, err := walFiles(walPath(img))
	if err != nil || len(segs) != 1 {
		t.Fatalf("segments %v, %v", segs, err)
	}
	path := filepath.Join(walPath(img), segName(segs[0]))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var last walRecord
	for off := int64(0); ; {
		r, st := readRecord(data, segs[0], off)
		if st != recOK {
			break
		}
		if r.typ == recChunk {
			last = r
		}
		off = r.end
	}
	if last.seq != n {
		t.Fatalf("last chunk record has seq %d", last.seq)
	}
	for _, cut := range []int64{last.pos.off + 10, last.pos.off + recHeaderLen + 5, last.end - 1} {
		torn := append([]byte(nil), data[:cut]...)
		torn = append(torn, bytes.Repeat([]byte{0xa5}, len(data)-int(cut))...)
		tdir := t.TempDir()
		copyDir(t, img, tdir)
		if err := os.WriteFile(filepath.Join(walPath(tdir), segName(segs[0])), torn, 0o600); err != nil {
			t.Fatal(err)
		}
		s := openTest(t, Config{Dir: tdir})
		// The replay's commits keep the freelist on disk: a second crash
		// now must not make the next Open check every page.
		if metaFreelist(t, filepath.Join(tdir, "spool.db")) == noFreelist {
			t.Fatalf("cut at %d: no freelist on disk after the replay", cut)
		}
		cs := drainAvailable(t, s.Lanes()[0])
		if len(cs) != n-2 { // chunk 3 acknowledged, chunk n torn
			t.Fatalf("cut at %d: %d chunks", cut, len(cs))
		}
		for i, c := range cs {
			want := i
			if i >= 2 {
				want = i + 1 // seq 3 holds record 2
			}
			if _, id := recID(c.Records[0]); id != want {
				t.Fatalf("cut at %d: chunk %d holds %d", cut, i, id)
			}
		}
	}
}

// copyDir copies the files and directories below src into dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if fi.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o750)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCommitGather: unless NoSync, after a write of several appends, a
// lone queued append waits (up to the gather time) for another to share its
// write and fsync; once a write carried one append, a lone client's appends
// do not wait at all.
//
// Where the test must tell a wait from none, the gather time is 10 minutes,
// so that no machine is slow enough to mistake one for the other; the one
// gather the test sees end has a spool of its own with a short one.
func TestCommitGather(t *testing.T) {
	const long = 10 * time.Minute

	// A lone client never waits: on a fresh spool, and once a write carried
	// one append (each of these), its appends are written at once (one that
	// waited would take 10 minutes, and wait fails it).
	g := newGatherSpool(t, long)
	for id := range 10 {
		g.wait(fmt.Sprint(id), g.start(id))
	}

	// A is written alone; B and C, queued meanwhile, together.
	g.blocking.Store(true)
	a := g.start(10)
	<-g.entered
	b, c := g.start(11), g.start(12)
	g.queued(2)
	g.release <- struct{}{}
	g.wait("A", a)
	<-g.entered // B and C's write
	d := g.start(13)
	g.queued(1)
	before := g.commits()
	g.blocking.Store(false)
	g.release <- struct{}{}
	g.wait("B", b)
	g.wait("C", c)
	if got := g.commits() - before; got != 1 {
		t.Fatalf("B and C took %v writes, want 1", got)
	}

	// The last write carried two appends: D, alone, waits for company (a
	// while here: it can only end early if it is wrong), and E shares its
	// write.
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-d:
		t.Fatalf("D was written alone without waiting (err %v)", err)
	default:
	}
	e := g.start(14)
	g.wait("D", d)
	g.wait("E", e)
	if got := g.commits() - before; got != 2 {
		t.Fatalf("D and E took %v writes, want 1", got-1)
	}
	if n := len(drainAvailable(t, g.l)); n != 15 {
		t.Fatalf("read %d chunks, want 15", n)
	}

	// A lone append that found no company is written alone once its
	// gather time ends (timers never fire early: it waited that long).
	const short = 50 * time.Millisecond
	g = newGatherSpool(t, short)
	g.blocking.Store(true)
	a = g.start(0)
	<-g.entered
	b, c = g.start(1), g.start(2)
	g.queued(2)
	g.release <- struct{}{}
	g.wait("A", a)
	<-g.entered // B and C's write
	g.blocking.Store(false)
	g.release <- struct{}{}
	g.wait("B", b)
	g.wait("C", c)
	before = g.commits()
	t0 := time.Now()
	g.wait("F", g.start(3))
	if el := time.Since(t0); el < short {
		t.Fatalf("F, alone after a write of two, was written after %v, before its gather time %v", el, short)
	}
	if got := g.commits() - before; got != 1 {
		t.Fatalf("F took %v writes, want 1", got)
	}
	if n := len(drainAvailable(t, g.l)); n != 4 {
		t.Fatalf("read %d chunks, want 4", n)
	}
}

// gatherSpool is a spool for TestCommitGather: appends of one record each
// to one lane, and a WAL whose writes block while blocking is set (entered
// is sent when one does, release ends it).
type gatherSpool struct {
	t                testing.TB
	s                *Spool
	l                *Lane
	blocking         atomic.Bool
	entered, release chan struct{}
}

func newGatherSpool(t testing.TB, gather time.Duration) *gatherSpool {
	g := &gatherSpool{t: t, entered: make(chan struct{}), release: make(chan struct{})}
	g.s = openTest(t, Config{gather: gather, walFault: func(synced bool) error {
		if !synced && g.blocking.Load() {
			g.entered <- struct{}{}
			<-g.release
		}
		return nil
	}})
	g.l = mustLane(t, g.s, testKey(1))
	return g
}

// commits is the count of WAL writes.
func (g *gatherSpool) commits() float64 {
	var m dto.Metric
	if err := g.s.m.commits.Write(&m); err != nil {
		g.t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// start appends record id in a goroutine; its result comes on the channel.
func (g *gatherSpool) start(id int) chan error {
	done := make(chan error, 1)
	go func() {
		var b storage.Batch
		b.Add(rec(1, id, 100))
		done <- g.s.Append(context.Background(), g.l, &b)
	}()
	return done
}

// queued waits until n appends are queued for the WAL writer.
func (g *gatherSpool) queued(n int) {
	g.t.Helper()
	polltest.Until(g.t, fmt.Sprintf("%d appends queued", n), func() bool {
		g.s.mu.Lock()
		defer g.s.mu.Unlock()
		return len(g.s.appends) == n
	})
}

// wait waits for an append's result, for up to polltest.Max: far less than a
// 10-minute gather time.
func (g *gatherSpool) wait(name string, c chan error) {
	g.t.Helper()
	select {
	case err := <-c:
		if err != nil {
			g.t.Fatalf("append %s: %v", name, err)
		}
	case <-time.After(polltest.Max):
		g.t.Fatalf("append %s not written after %v: it waited for company", name, polltest.Max)
	}
}
