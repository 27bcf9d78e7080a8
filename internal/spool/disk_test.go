package spool

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// dirBytes is the disk space the files of dir take (allocated blocks, as du
// counts them) and their apparent size.
func dirBytes(t testing.TB, dir string) (disk, apparent int64) {
	t.Helper()
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			apparent += fi.Size()
			disk += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return disk, apparent
}

// TestDiskGivenBack spools 1,000,000 records (100 per chunk, ~420 bytes
// each), acknowledges them all, and checks that compaction gave the disk
// space back: the data directory ends under 5 MiB (a drained spool's file
// ends under Config.CompactMinFileBytes, 4 MiB, plus bbolt's meta; an idle
// spool keeps no WAL file). Under -race it spools
// 200,000 (the race detector makes it take 40 s otherwise).
func TestDiskGivenBack(t *testing.T) {
	if testing.Short() {
		t.Skip("writes ~450 MB")
	}
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, NoSync: true}, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		if err := checkFile(filepath.Join(dir, "spool.db")); err != nil {
			t.Error(err)
		}
	})
	ctx := context.Background()
	const lanes, perChunk = 4, 100
	chunksPerLane := 2500
	if raceEnabled {
		chunksPerLane = 500
	}
	start := time.Now()
	var wg sync.WaitGroup
	ls := make([]*Lane, lanes)
	for i := range lanes {
		ls[i] = mustLane(t, s, testKey(i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b storage.Batch
			var data []byte
			pad := make([]byte, 360)
			for j := range pad {
				pad[j] = 'x'
			}
			for c := range chunksPerLane {
				b.Reset()
				for r := range perChunk {
					// {"lane":i,"n":n,"pad":"xxx..."} without fmt: the
					// test should measure the spool, not Sprintf.
					data = append(data[:0], `{"lane":`...)
					data = strconv.AppendInt(data, int64(i), 10)
					data = append(data, `,"n":`...)
					data = strconv.AppendInt(data, int64(c*perChunk+r), 10)
					data = append(data, `,"pad":"`...)
					data = append(data, pad...)
					data = append(data, `"}`...)
					b.Add(storage.Record{OrderKey: data[8:9], UserID: data[len(data)-20:], Data: data})
				}
				if err := s.Append(ctx, ls[i], &b); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	appended := time.Since(start)
	peak := s.Stats()
	t.Logf("appended %d records in %v: live %d MB, file %d MB", lanes*chunksPerLane*perChunk, appended, peak.LiveBytes>>20, peak.FileBytes>>20)

	// Reopen at the peak: Open rebuilds bbolt's freelist by a scan.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	// Idle after 300 ms (30 s by default): the WAL's files go too.
	s, err = Open(Config{Dir: dir, NoSync: true, idleAfter: 300 * time.Millisecond}, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reopened at the peak in %v", time.Since(start))
	reopened := s.Stats() // everything in bbolt now
	if reopened.LiveBytes != peak.LiveBytes || reopened.Lanes != lanes {
		t.Fatalf("after reopen %+v, before %+v", reopened, peak)
	}
	ls = s.Lanes()

	start = time.Now()
	for i, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for n < chunksPerLane {
				cs := nextT(t, l, 4<<20)
				for _, c := range cs {
					if c.Seq != uint64(n+1) || len(c.Records) != perChunk {
						t.Errorf("lane %d: chunk %d: seq %d, %d records", i, n, c.Seq, len(c.Records))
						return
					}
					l.Ack(c.Seq)
					n++
				}
			}
		}()
	}
	wg.Wait()
	polltest.Until(t, "no live bytes", func() bool { return s.Stats().LiveBytes == 0 })
	// The compaction follows the last checkpoint; the WAL's segment and
	// spares are given back once the spool is idle. Wait for both.
	polltest.Until(t, "the files given back", func() bool { return s.Stats().FileBytes <= 5<<20 })
	st := s.Stats()
	disk, apparent := dirBytes(t, dir)
	t.Logf("drained in %v: live %d, file %d KB, dir %d KB on disk (%d KB apparent)", time.Since(start), st.LiveBytes, st.FileBytes>>10, disk>>10, apparent>>10)
	if st.LiveBytes != 0 {
		t.Fatalf("live bytes %d after acking all", st.LiveBytes)
	}
	if disk > 5<<20 || apparent > 5<<20 {
		t.Fatalf("data dir holds %d bytes (%d apparent) after the drain", disk, apparent)
	}
	if reopened.FileBytes < int64(chunksPerLane)*lanes*perChunk*400 {
		t.Fatalf("file at the peak %d bytes: the test did not spool what it meant to", reopened.FileBytes)
	}
}

// TestCompactionKeepsData compacts while chunks are live and the reader is
// part-way through the lane, then checks that the reader continues in order
// and that the data survives a reopen.
func TestCompactionKeepsData(t *testing.T) {
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	// The log line "spool compacted" says how long the compaction took.
	// Every chunk goes to bbolt at the next checkpoint (5 ms), as a
	// backlog's would.
	s, err := Open(Config{Dir: dir, NoSync: true, CompactMinFileBytes: 1 << 20, flushAge: time.Nanosecond, checkpointEvery: 5 * time.Millisecond}, zaptest.NewLogger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l := mustLane(t, s, testKey(1))
	var b storage.Batch
	const chunks = 400
	for c := range chunks { // ~10 MB
		b.Reset()
		pad := 500 // ~22 KB chunks: plain values
		if c%4 == 0 {
			pad = 1000 // ~42 KB: buckets of their own (chunkstore.go)
		}
		for r := range 40 {
			b.Add(rec(1, c*40+r, pad))
		}
		if err := s.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
	}
	peak := s.Stats()
	// Read 350, ack the first 340: 60 chunks stay live (15%).
	var read []storage.Chunk
	for len(read) < 350 {
		read = append(read, nextT(t, l, 64<<10)...)
	}
	for _, c := range read[:340] {
		l.Ack(c.Seq)
	}
	polltest.Until(t, "a compaction", func() bool { return gatherValue(t, reg, "relay_spool_compactions_total", "") > 0 })
	st := s.Stats()
	file, _ := dirBytes(t, filepath.Join(dir, "spool.db"))
	t.Logf("peak: files %d KB, live %d KB; after compaction: files %d KB (bbolt %d KB), live %d KB",
		peak.FileBytes>>10, peak.LiveBytes>>10, st.FileBytes>>10, file>>10, st.LiveBytes>>10)
	if file >= peak.LiveBytes/2 {
		t.Fatalf("no compaction: file %d bytes", file)
	}
	// The cursor continues after the swap.
	for len(read) < chunks {
		read = append(read, nextT(t, l, 64<<10)...)
	}
	for i, c := range read {
		if c.Seq != uint64(i+1) {
			t.Fatalf("chunk %d has seq %d", i, c.Seq)
		}
		if _, n := recID(c.Records[39]); n != i*40+39 {
			t.Fatalf("chunk %d: last record %d", i, n)
		}
	}
	// Sequences survive the copy: ids are not reused.
	if err := s.PutDead(ctx, []storage.DeadLetter{{Lane: l.Key(), Reason: "x"}}); err != nil {
		t.Fatal(err)
	}
	if l2 := mustLane(t, s, testKey(2)); l2.ID() != l.ID()+1 {
		t.Fatalf("lane created after compaction has id %d", l2.ID())
	}
	// Appends after the swap go to the new file.
	b.Reset()
	b.Add(rec(1, chunks*40, 1))
	if err := s.Append(ctx, l, &b); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "spool.db.compact")); !os.IsNotExist(err) {
		t.Fatalf("compaction file left behind: %v", err)
	}
	s = openTest(t, Config{Dir: dir, NoSync: true})
	more := []storage.DeadLetter{{Lane: l.Key(), Reason: "y"}}
	if err := s.PutDead(ctx, more); err != nil || more[0].ID != 2 {
		t.Fatalf("dead letter after compaction and reopen: id %d, %v", more[0].ID, err)
	}
	rest := drainAvailable(t, s.Lanes()[0])
	if len(rest) != 61 || rest[0].Seq != 341 || rest[60].Seq != chunks+1 {
		t.Fatalf("after reopen: %d chunks from %d", len(rest), rest[0].Seq)
	}
}

// TestStaleCompactionFileRemoved: a spool.db.compact left by a crash during
// a compaction is removed by Open and the spool's data is untouched.
func TestStaleCompactionFileRemoved(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir, NoSync: true})
	l := mustLane(t, s, testKey(1))
	var b storage.Batch
	b.Add(rec(1, 1, 1))
	if err := s.Append(context.Background(), l, &b); err != nil {
		t.Fatal(err)
	}
	s.Close()
	junk := filepath.Join(dir, "spool.db.compact")
	if err := os.WriteFile(junk, []byte("half a file"), 0o600); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, Config{Dir: dir, NoSync: true})
	if _, err := os.Stat(junk); !os.IsNotExist(err) {
		t.Fatalf("stale compaction file: %v", err)
	}
	if cs := drainAvailable(t, s.Lanes()[0]); len(cs) != 1 {
		t.Fatalf("%d chunks after reopen", len(cs))
	}
}

// TestCompactionUnderLoad runs appenders, readers and acks while the writer
// compacts again and again (low thresholds), and checks that every record
// arrives once and in order per appender.
func TestCompactionUnderLoad(t *testing.T) {
	reg := prometheus.NewRegistry()
	dir := t.TempDir()
	// Little memory for hot chunks and frequent checkpoints: most chunks go
	// through bbolt before they are read, whatever the reader's pace.
	s, err := Open(Config{Dir: dir, NoSync: true, CompactMinFileBytes: 64 << 10, compactPercent: 90, // compacts often
		hotMaxBytes: 16 << 10, flushAge: time.Nanosecond, checkpointEvery: 2 * time.Millisecond}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		if err := checkFile(filepath.Join(dir, "spool.db")); err != nil {
			t.Error(err)
		}
	})
	ctx := context.Background()
	const lanes, writers, perWriter = 2, 4, 300
	var wg sync.WaitGroup
	ls := make([]*Lane, lanes)
	for i := range ls {
		ls[i] = mustLane(t, s, testKey(i))
	}
	for i := range lanes {
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var b storage.Batch
				for n := range perWriter {
					b.Reset()
					for range 4 {
						b.Add(rec(i, w*10_000+n, 1500))
					}
					if err := s.Append(ctx, ls[i], &b); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	for i := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := map[int]int{}
			for got := 0; got < writers*perWriter; {
				cs := nextT(t, ls[i], 64<<10)
				for _, c := range cs {
					lane, id := recID(c.Records[0])
					w, n := id/10_000, id%10_000
					if p, ok := last[w]; lane != i || (ok && n != p+1) || (!ok && n != 0) {
						t.Errorf("lane %d: record %d of lane %d after %d", i, id, lane, p)
						return
					}
					last[w] = n
					ls[i].Ack(c.Seq)
				}
				got += len(cs)
			}
		}()
	}
	wg.Wait()
	n := gatherValue(t, reg, "relay_spool_compactions_total", "")
	t.Logf("%v compactions", n)
	if n == 0 {
		t.Fatal("no compaction happened")
	}
}
