package spool

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/svcrelay/relay/internal/diskfulltest"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

// Tests that damage the spool's files on purpose, and check exactly what
// survives and what is reported.

// integrityCfg keeps appended chunks in the WAL (hot) and checkpoints
// often, so that spool.db records the acknowledged end soon; small
// segments keep the images small.
func integrityCfg(dir string) Config {
	return Config{Dir: dir, MinFreeBytes: -1, CompactMinFileBytes: -1,
		flushAge: time.Hour, checkpointEvery: time.Millisecond, segmentBytes: 256 << 10}
}

// offlineState reads spool.db's applied and acknowledged WAL positions
// from the file (pages.go), as a replay would find them.
func offlineState(t *testing.T, dir string) (applied, synced walPos) {
	t.Helper()
	pf, err := openPageFile(filepath.Join(dir, "spool.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer pf.f.Close()
	pf.walkBucket(pf.rootHeader(), func(k, v []byte, bucket bool) {
		if bucket && string(k) == "meta" {
			meta := map[string][]byte{}
			pf.walkBucket(v, func(k, v []byte, _ bool) { meta[string(k)] = v }, func(error) {})
			applied, synced, _ = walPositions(func(k []byte) []byte { return meta[string(k)] })
		}
	}, func(err error) { t.Fatal(err) })
	return applied, synced
}

// segRecords scans segment no of dir's WAL: its valid records.
func segRecords(t *testing.T, dir string, no uint64) (data []byte, recs []walRecord) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, walDirName, segName(no)))
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range scanSegment(data, no, 0).items {
		if it.damage == nil {
			recs = append(recs, it.rec)
		}
	}
	return data, recs
}

// walImage appends chunks (perChunk records each, ids in order) to one
// lane, waits until spool.db records as acknowledged the WAL end after the
// first syncedChunks of them (all when negative), and returns a crash
// image taken then, the segment number and the chunk records' positions.
func walImage(t *testing.T, chunks, perChunk, syncedChunks, pad int) (img string, seg uint64, recs []walRecord) {
	t.Helper()
	if syncedChunks < 0 {
		syncedChunks = chunks
	}
	dir := t.TempDir()
	cfg := integrityCfg(dir)
	cfg.checkpointEvery = time.Hour // checkpoints only for lane creation (below)
	s, err := Open(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := mustLane(t, s, testKey(1))
	var b storage.Batch
	for i := range chunks {
		if i == syncedChunks {
			// A lane created now commits a checkpoint, which records the
			// WAL's end as acknowledged.
			mustLane(t, s, testKey(100+i))
		}
		b.Reset()
		for j := range perChunk {
			b.Add(rec(1, i*perChunk+j, pad))
		}
		if err := s.Append(context.Background(), l, &b); err != nil {
			t.Fatal(err)
		}
	}
	if syncedChunks == chunks {
		mustLane(t, s, testKey(99))
	}
	img = crashImage(t, dir)
	segs, _, err := walFiles(filepath.Join(img, walDirName))
	if err != nil || len(segs) != 1 {
		t.Fatalf("segments %v, %v: want one", segs, err)
	}
	_, all := segRecords(t, img, segs[0])
	for _, r := range all {
		if r.typ == recChunk {
			recs = append(recs, r)
		}
	}
	if len(recs) != chunks {
		t.Fatalf("%d chunk records in the WAL, want %d", len(recs), chunks)
	}
	_, synced := offlineState(t, img)
	want := recs[syncedChunks-1].end
	if synced != (walPos{segs[0], want}) {
		t.Fatalf("acknowledged end %+v, want %s offset %d", synced, segName(segs[0]), want)
	}
	return img, segs[0], recs
}

// openObserved opens dir with its errors and warnings observed and its
// metrics in a registry of their own.
func openObserved(t *testing.T, dir string) (*Spool, *observer.ObservedLogs, *prometheus.Registry, error) {
	t.Helper()
	core, logs := observer.New(zapcore.WarnLevel)
	reg := prometheus.NewRegistry()
	cfg := integrityCfg(dir)
	s, err := Open(cfg, zap.New(core), reg)
	if err == nil {
		t.Cleanup(func() { s.Close() })
	}
	return s, logs, reg, err
}

// readAll reads every record of lane 1 (testKey(1)) and acknowledges it;
// it returns the record ids.
func readAll(t *testing.T, s *Spool) []int {
	t.Helper()
	var ids []int
	for _, l := range s.Lanes() {
		if l.Key() != testKey(1) {
			continue
		}
		l.mu.Lock()
		last := l.next - 1
		l.mu.Unlock()
		for seq := uint64(0); seq < last; {
			// A damaged last chunk is never returned: stop when nothing
			// comes for a while.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			cs, err := readWhole(ctx, l, 1<<20)
			cancel()
			if errors.Is(err, context.DeadlineExceeded) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				for _, r := range c.Records {
					_, n := recID(r)
					ids = append(ids, n)
				}
				l.Ack(c.Seq)
				seq = c.Seq
			}
		}
	}
	return ids
}

func idsExcept(n int, lost ...int) []int {
	var ids []int
	for i := range n {
		if !slices.Contains(lost, i) {
			ids = append(ids, i)
		}
	}
	return ids
}

func damagedCount(t *testing.T, reg *prometheus.Registry, file string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "relay_spool_damaged_records_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "file" && lp.GetValue() == file {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestReplaySkipsDamage damages WAL records of a backlog that is only in
// the WAL (a kill -9 before any checkpoint), and checks that exactly the
// damaged records are skipped, everything after them replayed, and the
// damage reported: an error line naming the segment and offsets, the
// counter, the bytes in quarantine/. Verify reports the same damage first.
func TestReplaySkipsDamage(t *testing.T) {
	const chunks = 10
	for _, tc := range []struct {
		name   string
		synced int // chunks acknowledged in spool.db (-1: all)
		damage func(data []byte, recs []walRecord)
		lost   func(recs []walRecord) []int // chunk indexes (one record each) lost
		report bool                         // damage reported (else: a torn tail, warned)
	}{
		{"payload byte", -1, func(d []byte, r []walRecord) { d[r[4].pos.off+recHeaderLen+40] ^= 0x20 }, fixed(4), true},
		{"header byte", -1, func(d []byte, r []walRecord) { d[r[4].pos.off+9] ^= 0x01 }, fixed(4), true},
		{"chunk checksum", -1, func(d []byte, r []walRecord) { d[r[4].pos.off+recHeaderLen+2] ^= 0x01 }, fixed(4), true},
		{"4 KiB zeroed", -1, func(d []byte, r []walRecord) { clear(d[r[3].pos.off : r[3].pos.off+4096]) }, zeroed(3, 4096), true},
		{"last record, acknowledged", -1, func(d []byte, r []walRecord) { d[r[9].pos.off+recHeaderLen+50] ^= 0x01 }, fixed(9), true},
		{"last record zeroed, acknowledged", -1, func(d []byte, r []walRecord) { clear(d[r[9].pos.off:r[9].end]) }, fixed(9), true},
		{"torn last write", 9, func(d []byte, r []walRecord) { clear(d[r[9].pos.off+recHeaderLen+60 : r[9].end]) }, fixed(9), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, seg, recs := walImage(t, chunks, 1, tc.synced, 1500)
			path := filepath.Join(img, walDirName, segName(seg))
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			tc.damage(data, recs)
			lost := tc.lost(recs)
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			rep, err := Verify(img, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := rep.Damaged > 0; got != tc.report {
				t.Errorf("Verify: damaged %d (%q), want damage %v", rep.Damaged, rep.Problems, tc.report)
			}
			if want := int64(chunks - len(lost)); rep.Records != want {
				t.Errorf("Verify: %d records, want %d", rep.Records, want)
			}

			s, logs, reg, err := openObserved(t, img)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if got, want := readAll(t, s), idsExcept(chunks, lost...); !slices.Equal(got, want) {
				t.Errorf("records %v, want %v", got, want)
			}
			errs := logs.FilterLevelExact(zapcore.ErrorLevel).FilterMessageSnippet("damaged write-ahead log records").All()
			warns := logs.FilterMessageSnippet("write cut short").All()
			q, _ := os.ReadDir(filepath.Join(img, quarantineDir))
			if tc.report {
				if len(errs) != 1 || len(warns) != 0 {
					t.Fatalf("%d damage lines, %d torn-write lines; want 1, 0: %v", len(errs), len(warns), logs.All())
				}
				f := errs[0].ContextMap()
				if f["segment"] != segName(seg) || f["from"].(int64) != recs[lost[0]].pos.off {
					t.Errorf("damage line %v: want segment %s from %d", f, segName(seg), recs[lost[0]].pos.off)
				}
				if got := damagedCount(t, reg, "wal"); got < 1 {
					t.Errorf("relay_spool_damaged_records_total{file=wal} = %v", got)
				}
				if len(q) != 1 {
					t.Fatalf("quarantine holds %d files, want 1", len(q))
				}
				qb, _ := os.ReadFile(filepath.Join(img, quarantineDir, q[0].Name()))
				from := recs[lost[0]].pos.off
				if !bytes.Equal(qb, data[from:from+int64(len(qb))]) || int64(len(qb)) < recs[lost[0]].end-from-1 {
					t.Errorf("quarantined %d bytes that are not the damaged ones", len(qb))
				}
			} else {
				if len(errs) != 0 || len(warns) != 1 || len(q) != 0 || damagedCount(t, reg, "wal") != 0 {
					t.Fatalf("torn write: %d damage lines, %d torn-write lines, %d quarantined; want 0, 1, 0", len(errs), len(warns), len(q))
				}
			}
		})
	}
}

func fixed(lost ...int) func([]walRecord) []int {
	return func([]walRecord) []int { return lost }
}

// zeroed: the chunks that n bytes zeroed from chunk first's start reach.
func zeroed(first int, n int64) func([]walRecord) []int {
	return func(recs []walRecord) []int {
		var lost []int
		for i, r := range recs {
			if i >= first && r.pos.off < recs[first].pos.off+n {
				lost = append(lost, i)
			}
		}
		return lost
	}
}

// TestTruncatedWAL truncates the WAL's segment at every record boundary
// and in the middle of every record: a cut before the end spool.db
// recorded as acknowledged refuses to start (errMismatch: acknowledged
// records are gone), one after it keeps every chunk before the cut, with
// no damage reported. A removed wal/ is refused too.
func TestTruncatedWAL(t *testing.T) {
	const chunks, synced = 8, 5
	img, seg, recs := walImage(t, chunks, 1, synced, 200)
	path := filepath.Join(img, walDirName, segName(seg))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cuts []int64
	for _, r := range recs {
		cuts = append(cuts, r.pos.off, (r.pos.off+r.end)/2)
	}
	cuts = append(cuts, recs[len(recs)-1].end)
	for _, cut := range cuts {
		t.Run(fmt.Sprint(cut), func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, img, dir)
			if err := os.WriteFile(filepath.Join(dir, walDirName, segName(seg)), data[:cut], 0o600); err != nil {
				t.Fatal(err)
			}
			if cut < recs[synced-1].end {
				// Refused; verify says why, salvage keeps what is left.
				rep, err := Verify(dir, nil)
				if err != nil || rep.Damaged == 0 || !strings.Contains(strings.Join(rep.Problems, "\n"), "does not hold") {
					t.Errorf("Verify: %+v, %v", rep, err)
				}
				var got []int
				if _, err := Verify(dir, func(r *SalvageRecord) error {
					_, rec, _ := r.Record()
					_, n := recID(rec)
					got = append(got, n)
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				var want []int
				for i, r := range recs {
					if r.end <= cut {
						want = append(want, i)
					}
				}
				if !slices.Equal(got, want) {
					t.Errorf("salvaged %v, want %v", got, want)
				}
			}
			s, logs, reg, err := openObserved(t, dir)
			if cut < recs[synced-1].end {
				if !errors.Is(err, errMismatch) {
					t.Fatalf("Open after a cut at %d, before the acknowledged end %d: %v, want errMismatch", cut, recs[synced-1].end, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			var want []int
			for i, r := range recs {
				if r.end <= cut {
					want = append(want, i)
				}
			}
			if got := readAll(t, s); !slices.Equal(got, want) {
				t.Errorf("records %v, want %v", got, want)
			}
			if n := logs.FilterLevelExact(zapcore.ErrorLevel).Len(); n != 0 || damagedCount(t, reg, "wal") != 0 {
				t.Errorf("%d error lines, counter %v: a cut past the acknowledged end is no damage", n, damagedCount(t, reg, "wal"))
			}
		})
	}
	t.Run("wal removed", func(t *testing.T) {
		dir := t.TempDir()
		copyDir(t, img, dir)
		if err := os.RemoveAll(filepath.Join(dir, walDirName)); err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := openObserved(t, dir); !errors.Is(err, errMismatch) {
			t.Fatalf("Open without wal/: %v, want errMismatch", err)
		}
	})
}

// TestSpoolDBMismatch: spool.db deleted, emptied, or another spool's, while
// the WAL holds records: Open refuses (and leaves the files alone), and
// Salvage still writes every record with its api_key (from the WAL's lane
// records), which Import-like appends can replay into a fresh spool.
func TestSpoolDBMismatch(t *testing.T) {
	img, _, _ := walImage(t, 6, 2, -1, 200)
	other := t.TempDir()
	{
		s := openTest(t, Config{Dir: other, MinFreeBytes: -1})
		mustLane(t, s, testKey(7))
		s.Close()
	}
	for _, tc := range []struct {
		name   string
		damage func(dir string) error
	}{
		{"deleted", func(dir string) error { return os.Remove(filepath.Join(dir, "spool.db")) }},
		{"empty", func(dir string) error { return os.Truncate(filepath.Join(dir, "spool.db"), 0) }},
		{"another spool's", func(dir string) error {
			b, err := os.ReadFile(filepath.Join(other, "spool.db"))
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(dir, "spool.db"), b, 0o600)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, img, dir)
			if err := tc.damage(dir); err != nil {
				t.Fatal(err)
			}
			before, _ := os.Stat(filepath.Join(dir, "spool.db"))
			if _, _, _, err := openObserved(t, dir); !errors.Is(err, errMismatch) {
				t.Fatalf("Open: %v, want errMismatch", err)
			}
			after, _ := os.Stat(filepath.Join(dir, "spool.db"))
			if (before == nil) != (after == nil) || before != nil && before.Size() != after.Size() {
				t.Fatalf("Open changed spool.db (%v -> %v)", before, after)
			}
			var got []int
			rep, err := Verify(dir, func(r *SalvageRecord) error {
				if r.Source != "wal" || r.APIKey != testKey(1).APIKey || r.Damaged {
					return fmt.Errorf("salvaged %+v", r)
				}
				_, rec, _ := r.Record()
				_, n := recID(rec)
				got = append(got, n)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, idsExcept(12)) || rep.Records != 12 {
				t.Fatalf("salvaged %v (%d records), want 0..11", got, rep.Records)
			}
		})
	}
}

// dbImage makes a spool whose lane 1 holds chunks (perChunk records each)
// in spool.db (closed cleanly), and returns its dir.
func dbImage(t *testing.T, chunks, perChunk, pad int) string {
	t.Helper()
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, MinFreeBytes: -1, CompactMinFileBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	l := mustLane(t, s, testKey(1))
	appendChunks(t, s, l, 1, chunks, perChunk, pad)
	if err := s.PutDead(context.Background(), []storage.DeadLetter{{Lane: testKey(1), Reason: "silenced", Record: rec(1, 1000, 10)}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestDamagedChunkDeadLettered flips one byte inside a chunk in spool.db:
// the chunk's records go to dead letters with reason damaged (never to the
// reader), the counter counts them, and every other chunk is read in order.
func TestDamagedChunkDeadLettered(t *testing.T) {
	const chunks, perChunk = 10, 3
	dir := dbImage(t, chunks, perChunk, 100)
	db := filepath.Join(dir, "spool.db")
	b, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	// Record 13 is the second of chunk 4.
	i := bytes.Index(b, []byte(`{"lane":1,"n":13,`))
	if i < 0 {
		t.Fatal("record 13 not found in spool.db")
	}
	b[i+20] ^= 0x04
	if err := os.WriteFile(db, b, 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(dir, nil)
	if err != nil || rep.Damaged != 1 || rep.Records != (chunks-1)*perChunk {
		t.Fatalf("Verify: %+v, %v; want 1 damaged, %d records", rep, err, (chunks-1)*perChunk)
	}
	s, logs, reg, err := openObserved(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := readAll(t, s), idsExcept(chunks*perChunk, 12, 13, 14); !slices.Equal(got, want) {
		t.Fatalf("records %v, want %v", got, want)
	}
	dead, err := s.ListDead(context.Background(), storage.DeadFilter{Reason: reasonDamaged}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != perChunk {
		t.Fatalf("%d damaged dead letters, want %d", len(dead), perChunk)
	}
	for j, d := range dead {
		if d.Lane != testKey(1) || !strings.Contains(string(d.Answer), "checksum") {
			t.Errorf("dead letter %+v", d)
		}
		if j != 1 {
			if _, n := recID(d.Record); n != 12+j {
				t.Errorf("dead letter %d holds record %d", j, n)
			}
		}
	}
	if got := damagedCount(t, reg, "db"); got != perChunk {
		t.Errorf("relay_spool_damaged_records_total{file=db} = %v, want %d", got, perChunk)
	}
	if n := logs.FilterMessageSnippet("failed its checksum").Len(); n != 1 {
		t.Errorf("%d log lines for the damaged chunk, want 1", n)
	}
}

// TestDamagedChunkFramingLost: a chunk of spool.db whose records no longer
// decode is moved whole to one dead letter holding its bytes, with the
// time it was accepted, and the lane reads on after it.
func TestDamagedChunkFramingLost(t *testing.T) {
	const chunks, perChunk = 10, 3
	dir := dbImage(t, chunks, perChunk, 100)
	db := filepath.Join(dir, "spool.db")
	b, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte(`{"lane":1,"n":13,`))
	if i < 1 || b[i-1] >= 0x7f {
		t.Fatalf("record 13 not found in spool.db behind a one-byte length (at %d)", i)
	}
	b[i-1] = 0x7f // its data's length: the records after it do not decode
	if err := os.WriteFile(db, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s, _, _, err := openObserved(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := readAll(t, s), idsExcept(chunks*perChunk, 12, 13, 14); !slices.Equal(got, want) {
		t.Fatalf("records %v, want %v", got, want)
	}
	dead, err := s.ListDead(context.Background(), storage.DeadFilter{Reason: reasonDamaged}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].Accepted.IsZero() || !bytes.Contains(dead[0].Record.Data, []byte(`{"lane":1,"n":12,`)) ||
		!bytes.Contains(dead[0].Record.Data, []byte(`{"lane":1,"n":14,`)) {
		t.Fatalf("dead letters %+v, want one holding the chunk's bytes", dead)
	}
}

// TestDamagedDBNeverCrashes damages spool.db's pages: truncated to half,
// both meta pages zeroed, every page header zeroed, a zeroed page, a
// flipped branch: Open fails with ErrDamaged or opens, reading never
// panics or faults, and Verify and Salvage report the damage and write what
// they can read.
func TestDamagedDBNeverCrashes(t *testing.T) {
	img := dbImage(t, 400, 4, 300)
	fi, err := os.Stat(filepath.Join(img, "spool.db"))
	if err != nil {
		t.Fatal(err)
	}
	const ps = 4096
	pages := fi.Size() / ps
	pf, err := openPageFile(filepath.Join(img, "spool.db"))
	if err != nil {
		t.Fatal(err)
	}
	used := int(pf.meta.hwm) * ps
	pf.f.Close()
	for _, tc := range []struct {
		name     string
		damage   func(b []byte) []byte
		mustFail bool
	}{
		{"truncated to half", func(b []byte) []byte { return b[:used/2] }, true},
		{"truncated by a page", func(b []byte) []byte { return b[:used-ps] }, true},
		{"meta pages zeroed", func(b []byte) []byte { clear(b[:2*ps]); return b }, true},
		{"page headers zeroed", func(b []byte) []byte {
			for p := int64(2); p < pages; p++ {
				clear(b[p*ps : p*ps+16])
			}
			return b
		}, false},
		{"a chunk's page zeroed", func(b []byte) []byte {
			p := bytes.Index(b, []byte(`{"lane":1,"n":800,`)) / ps * ps
			clear(b[p : p+ps])
			return b
		}, false},
		{"garbage pages", func(b []byte) []byte {
			for p := int64(2); p < pages; p += 3 {
				for i := range b[p*ps : p*ps+64] {
					b[p*ps+int64(i)] = byte(i*7 + int(p))
				}
			}
			return b
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, img, dir)
			db := filepath.Join(dir, "spool.db")
			b, err := os.ReadFile(db)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(db, tc.damage(b), 0o600); err != nil {
				t.Fatal(err)
			}
			rep, err := Verify(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Damaged == 0 && len(rep.Problems) == 0 {
				t.Errorf("Verify found no damage: %+v", rep)
			}
			salvaged := 0
			if _, err := Verify(dir, func(*SalvageRecord) error { salvaged++; return nil }); err != nil {
				t.Fatal(err)
			}
			t.Logf("verify: %d records, %d damaged; salvage: %d lines", rep.Records, rep.Damaged, salvaged)

			s, _, _, err := openObserved(t, dir)
			if err != nil {
				if !errors.Is(err, ErrDamaged) {
					t.Fatalf("Open: %v, want ErrDamaged", err)
				}
				return
			}
			if tc.mustFail {
				t.Fatal("Open succeeded on a file it must refuse")
			}
			for _, l := range s.Lanes() {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				for range 1000 {
					cs, err := readWhole(ctx, l, 1<<20)
					if err != nil {
						break
					}
					for _, c := range cs {
						l.Ack(c.Seq)
					}
				}
				cancel()
			}
			if _, err := s.ListDead(context.Background(), storage.DeadFilter{}, 0, 0); err != nil && !errors.Is(err, ErrDamaged) {
				t.Logf("ListDead: %v", err)
			}
		})
	}
}

// TestFormatUpgradeAndDowngrade: a format-3 spool (version 1 chunks in
// spool.db and in its WAL, no id, segments without a start record) opens,
// every record reads, and the file is of the current format afterwards; a
// file of a newer format is refused with a line saying so.
func TestFormatUpgradeAndDowngrade(t *testing.T) {
	dir := dbImage(t, 5, 2, 50)
	db, err := bolt.Open(filepath.Join(dir, "spool.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	var laneID uint64
	err = db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put(keyFormat, seqKey(3)); err != nil {
			return err
		}
		if err := meta.Delete(keyID); err != nil {
			return err
		}
		lanes := tx.Bucket(bucketLanes)
		k, v := lanes.Cursor().First()
		laneID = binary.BigEndian.Uint64(k)
		key, st, err := decodeLane(v)
		if err != nil {
			return err
		}
		// The lane record as version 1 wrote it: no checksum.
		lv := encodeLane(nil, key, st)
		lv = lv[:len(lv)-4]
		lv[0] = 1
		if err := lanes.Put(k, lv); err != nil {
			return err
		}
		q := tx.Bucket(queueName(laneID))
		c := q.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if err := q.Put(k, downgradeChunk(v)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	// A format-3 WAL segment holding chunk 6 (records 10, 11) of the lane.
	var b storage.Batch
	b.Add(rec(1, 10, 50))
	b.Add(rec(1, 11, 50))
	putChunkHeader(b.Encoded(), time.Now().UnixMilli(), b.Len(), b.Verdict() != 0)
	v1 := downgradeChunk(b.Encoded())
	seg := make([]byte, 4096)
	putRecHeader(seg, 7, recChunk, laneID, 6, len(v1), payloadCRC(v1))
	copy(seg[recHeaderLen:], v1)
	if err := os.WriteFile(filepath.Join(dir, walDirName, segName(7)), seg, 0o600); err != nil {
		t.Fatal(err)
	}

	s, logs, _, err := openObserved(t, dir)
	if err != nil {
		t.Fatalf("Open of a format-3 spool: %v", err)
	}
	if got := readAll(t, s); !slices.Equal(got, idsExcept(12)) {
		t.Fatalf("records %v, want 0..11", got)
	}
	if logs.Len() != 0 {
		t.Errorf("log lines opening a format-3 spool: %v", logs.All())
	}
	s.Close()
	db, err = bolt.Open(filepath.Join(dir, "spool.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get(keyFormat); !bytes.Equal(v, seqKey(formatVersion)) {
			return fmt.Errorf("format %x after the upgrade", v)
		}
		if len(meta.Get(keyID)) != 16 {
			return errors.New("no spool id after the upgrade")
		}
		return meta.Put(keyFormat, seqKey(formatVersion+1))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := openObserved(t, dir); err == nil || !strings.Contains(err.Error(), "unknown spool format") {
		t.Fatalf("Open of a newer format: %v, want unknown spool format", err)
	}
}

// downgradeChunk returns a version 2 chunk as version 1 encoded it.
func downgradeChunk(v []byte) []byte {
	acc, n, _ := chunkHeader(v)
	out := make([]byte, chunkV1HeaderLen, len(v))
	out[0] = 1
	binary.BigEndian.PutUint64(out[1:9], uint64(acc))
	binary.BigEndian.PutUint32(out[9:13], uint32(n))
	return append(out, v[chunkHeaderLen:]...)
}

// TestCheckpointFailureLoggedOnce: checkpoints that keep failing (the file
// may not grow) are logged once, not once per checkpoint interval, and
// their success again once.
func TestCheckpointFailureLoggedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		core, logs := observer.New(zapcore.InfoLevel)
		cfg := Config{Dir: t.TempDir(), MinFreeBytes: -1, CompactMinFileBytes: -1, flushAge: time.Nanosecond,
			checkpointEvery: time.Millisecond, maxFileBytes: 1 << 20}
		s, err := Open(cfg, zap.New(core), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		l := mustLane(t, s, testKey(1))
		appendChunks(t, s, l, 1, 4, 10, 40000) // ~1.6 MB: more than the file may hold
		polltest.Until(t, "a checkpoint failed", s.ckptFailing)
		time.Sleep(200 * time.Millisecond) // 200 checkpoint intervals of fake time
		synctest.Wait()
		if n := logs.FilterMessageSnippet("checkpoint failed").Len(); n != 1 {
			t.Fatalf("%d checkpoint failure lines, want 1", n)
		}
	})
}

// TestPowerCut cuts the power right after a chosen fsync of the WAL: the
// image holds what was written up to it, and what the next write would
// have put there is torn. Every append acknowledged before the cut
// survives, and nothing is reported as damage.
func TestPowerCut(t *testing.T) {
	for _, cutAt := range []int{1, 3, 7} {
		t.Run(fmt.Sprint(cutAt), func(t *testing.T) {
			dir := t.TempDir()
			var img string
			fsyncs := 0
			cfg := integrityCfg(dir)
			cfg.walFault = func(synced bool) error {
				if synced {
					fsyncs++
					if fsyncs == cutAt {
						img = crashImage(t, dir) // the disk as the power cut leaves it
					}
				}
				return nil
			}
			s, err := Open(cfg, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			l := mustLane(t, s, testKey(1))
			var b storage.Batch
			for i := range 10 {
				b.Reset()
				b.Add(rec(1, i, 200))
				if err := s.Append(context.Background(), l, &b); err != nil {
					t.Fatal(err)
				}
			}
			s.Close()
			// The write after the cut reached the disk torn: a header and
			// half its payload.
			segs, _, _ := walFiles(filepath.Join(img, walDirName))
			path := filepath.Join(img, walDirName, segName(segs[len(segs)-1]))
			data, recs := segRecords(t, img, segs[len(segs)-1])
			end := recs[len(recs)-1].end
			var nb storage.Batch
			nb.Add(rec(1, 999, 200))
			crc := putChunkHeader(nb.Encoded(), 1, 1, false)
			putRecHeader(data[end:], segs[len(segs)-1], recChunk, l.id, 99, len(nb.Encoded()), crc)
			copy(data[end+recHeaderLen:], nb.Encoded()[:len(nb.Encoded())/2])
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			s2, logs, reg, err := openObserved(t, img)
			if err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, s2); !slices.Equal(got, idsExcept(cutAt)) {
				t.Fatalf("records after a cut after fsync %d: %v, want the %d acknowledged", cutAt, got, cutAt)
			}
			if logs.FilterLevelExact(zapcore.ErrorLevel).Len() != 0 || damagedCount(t, reg, "wal") != 0 {
				t.Fatalf("damage reported for a torn write: %v", logs.All())
			}
		})
	}
}

// TestFullDiskDraining: a spool killed with a backlog in its WAL, reopened
// on a disk with no space left for the replay, opens draining (never
// fails): Draining says why, appends get ErrDiskLow, what spool.db holds
// is delivered; once space is free again the replay goes through, the
// WAL's chunks are delivered in order and appends are taken again. Run on
// a real full filesystem (a small tmpfs mounted by the test; skipped where
// mounting is not allowed) and with bbolt's size limit standing in.
func TestFullDiskDraining(t *testing.T) {
	t.Run("size limit", func(t *testing.T) {
		img := drainImage(t, filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "img"))
		pf, err := openPageFile(filepath.Join(img, "spool.db"))
		if err != nil {
			t.Fatal(err)
		}
		pf.f.Close()
		cfg := integrityCfg(img)
		// The file may not grow past the pages it uses: the replay fits
		// only once the delivered chunks' pages are free.
		cfg.maxFileBytes = int(pf.meta.hwm) * int(pf.ps)
		cfg.drainEvery = 20 * time.Millisecond
		checkDraining(t, cfg, func() {})
	})
	t.Run("tmpfs", func(t *testing.T) {
		mnt := diskfulltest.Tmpfs(t, "64m", "the size-limit variant covers the logic")
		img := drainImage(t, filepath.Join(mnt, "a"), filepath.Join(mnt, "img"))
		// Fill the filesystem.
		filler := filepath.Join(mnt, "filler")
		diskfulltest.Fill(t, filler)
		cfg := integrityCfg(img)
		cfg.drainEvery = 20 * time.Millisecond
		checkDraining(t, cfg, func() {
			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
		})
	})
}

// drainImage writes a spool in dir whose lane 1 holds 10 chunks of 10
// records (ids 0..99, 20 KB each) in spool.db and 10 more (ids
// 100..199, 5 KB each) in the WAL only, the first chunk acknowledged
// after those were appended (so that a checkpoint recorded the lane's next
// seq past the chunks in the WAL, as a relay's checkpoints do), and leaves
// a crash image of it in img (dir itself is removed).
func drainImage(t *testing.T, dir, img string) string {
	t.Helper()
	ctx := context.Background()
	cfg := integrityCfg(dir)
	s, err := Open(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	l := mustLane(t, s, testKey(1))
	appendChunks(t, s, l, 1, 10, 10, 20000)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(cfg, nil, nil); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l = mustLane(t, s, testKey(1))
	var b storage.Batch
	for i := range 10 {
		b.Reset()
		for j := range 10 {
			b.Add(rec(1, 100+i*10+j, 5000))
		}
		if err := s.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
	}
	cs := nextT(t, l, 1)
	l.Ack(cs[0].Seq)
	polltest.Until(t, "a checkpoint recorded the acknowledgement", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.cold.nextSeq == l.next && l.cold.chunks == 9
	})
	copySparse(t, dir, img)
	s.Close()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	return img
}

// checkDraining opens a drainImage that cannot replay, and checks the
// draining start; free makes space.
func checkDraining(t *testing.T, cfg Config, free func()) {
	t.Helper()
	ctx := context.Background()
	core, logs := observer.New(zapcore.InfoLevel)
	s, err := Open(cfg, zap.New(core), nil)
	if err != nil {
		t.Fatalf("Open on a full disk: %v", err)
	}
	defer s.Close()
	if !s.draining.Load() {
		t.Fatal("not draining")
	}
	l := mustLane(t, s, testKey(1))
	var b storage.Batch
	b.Add(rec(1, 1000, 10))
	if err := s.Append(ctx, l, &b); !errors.Is(err, ErrDiskLow) {
		t.Fatalf("Append while draining: %v, want ErrDiskLow", err)
	}
	// Read as the batcher does: wait for records, then take what there is
	// at once (a context already done).
	done, cancel := context.WithCancel(ctx)
	cancel()
	var ids []int
	var recs []storage.Record
	read := func(until int) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		for len(ids) < until {
			if err := l.Wait(wctx, nil); err != nil {
				t.Fatalf("read %d of %d records: %v (%v)", len(ids), until, err, logs.All())
			}
			cs, more, err := l.NextPart(done, 1<<20, recs)
			recs = more
			if errors.Is(err, context.Canceled) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				for _, r := range c.Records {
					_, n := recID(r)
					ids = append(ids, n)
				}
				l.Ack(c.Seq)
			}
		}
	}
	wantIDs := func(n int) []int { return idsExcept(n)[10:] } // the first chunk was acknowledged
	read(90)
	// spool.db's 90 records, in order. The replay may fit in the pages the
	// first ones' acknowledgements freed before the reader is done with
	// them (a reader slowed by a loaded machine gives the spool's retries,
	// every drainEvery, the time): then the replayed backlog follows them
	// at once, in order, and draining has ended.
	if len(ids) < 90 || !slices.Equal(ids, wantIDs(200)[:len(ids)]) || len(ids) > 90 && s.draining.Load() {
		t.Fatalf("while draining: read %v (draining: %v)", ids, s.draining.Load())
	}
	// A reader goes on reading (the batcher's does): nothing more while the
	// spool drains. The replay may already fit in the pages the chunks just
	// acknowledged freed (bbolt reuses them), so draining can end on its
	// own here: then what is read is the replayed backlog, which read(190)
	// checks in order.
	cs, more, err := l.NextPart(done, 1<<20, recs)
	recs = more
	if len(cs) != 0 && s.draining.Load() || len(cs) == 0 && !errors.Is(err, context.Canceled) {
		t.Fatalf("read while draining, after spool.db's records: %d chunks, %v (draining: %v)", len(cs), err, s.draining.Load())
	}
	for _, c := range cs {
		for _, r := range c.Records {
			_, n := recID(r)
			ids = append(ids, n)
		}
		l.Ack(c.Seq)
	}
	free()
	polltest.Until(t, "the draining over once space was freed", func() bool { return !s.draining.Load() })
	read(190)
	if !slices.Equal(ids, wantIDs(200)) {
		t.Fatalf("read %v, want 10..199", ids)
	}
	b.Reset()
	b.Add(rec(1, 1000, 10))
	if err := s.Append(ctx, l, &b); err != nil {
		t.Fatalf("Append after draining: %v", err)
	}
	if n := logs.FilterMessageSnippet("draining").FilterLevelExact(zapcore.ErrorLevel).Len(); n != 1 {
		t.Errorf("%d draining error lines, want 1", n)
	}
}

// copySparse copies the files of src into dst leaving holes where src's
// blocks are zeros, as bbolt's grown files and fresh WAL segments are on
// disk (a full copy would allocate what a crash leaves unallocated).
func copySparse(t *testing.T, src, dst string) {
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
		f, err := os.Create(filepath.Join(dst, rel))
		if err != nil {
			return err
		}
		defer f.Close()
		const blk = 4096
		zero := make([]byte, blk)
		for off := 0; off < len(b); off += blk {
			p := b[off:min(off+blk, len(b))]
			if bytes.Equal(p, zero[:len(p)]) {
				continue
			}
			if _, err := f.WriteAt(p, int64(off)); err != nil {
				return err
			}
		}
		return f.Truncate(int64(len(b)))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// FuzzScanSegment feeds arbitrary segment bytes (with and without valid
// records spliced in) to the WAL reader and to the decoders behind it: no
// panic, items in order, damage and records never overlapping, and a valid
// record that follows garbage is always found.
func FuzzScanSegment(f *testing.F) {
	f.Add([]byte{}, uint16(0), true)
	f.Add(bytes.Repeat([]byte{0}, 200), uint16(10), true)
	f.Add([]byte("garbage garbage garbage garbage garbage garbage garbage"), uint16(3), false)
	f.Fuzz(func(t *testing.T, garbage []byte, at uint16, patched bool) {
		const seg = 5
		var b storage.Batch
		b.Add(rec(1, 1, 20))
		crc := putChunkHeader(b.Encoded(), 1, 1, false)
		valid := make([]byte, recHeaderLen+len(b.Encoded()))
		putRecHeader(valid, seg, recChunk, 1, 1, len(b.Encoded()), crc)
		copy(valid[recHeaderLen:], b.Encoded())
		data := append([]byte(nil), garbage...)
		off := int64(-1)
		if patched {
			off = int64(min(int(at), len(data)))
			data = append(data[:off:off], append(valid, data[off:]...)...)
		}
		sc := scanSegment(data, seg, 0)
		last := int64(0)
		found := false
		for _, it := range sc.items {
			from, to := it.rec.pos.off, it.rec.end
			if it.damage != nil {
				from, to = it.damage.from, it.damage.to
			}
			if from < last || to <= from || to > int64(len(data)) {
				t.Fatalf("item [%d,%d) after %d in %d bytes", from, to, last, len(data))
			}
			last = to
			if it.damage == nil && it.rec.pos.off == off {
				found = true
				var c storage.Chunk
				if it.rec.typ == recChunk {
					_ = decodeChunk(it.rec.seq, it.rec.payload, &c, nil)
				}
			}
		}
		if sc.tail.to > sc.tail.from && sc.tail.from < last {
			t.Fatalf("tail [%d,%d) overlaps items up to %d", sc.tail.from, sc.tail.to, last)
		}
		if patched && !found && !overlapsValid(sc, off, off+int64(len(valid))) {
			t.Fatalf("the valid record at %d was not found", off)
		}
	})
}

// overlapsValid reports whether a record scanSegment took as valid covers
// part of [from, to) (then garbage before it happened to form a record
// that swallowed the spliced one: possible only with a valid checksum).
func overlapsValid(sc segScan, from, to int64) bool {
	for _, it := range sc.items {
		if it.damage == nil && it.rec.pos.off < to && it.rec.end > from {
			return true
		}
	}
	return false
}

// dropFreelist rewrites spool.db's meta pages as a crash before the
// freelist was written leaves them (no freelist page): bbolt then walks
// the tree at Open to rebuild it.
func dropFreelist(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ps := int(binary.LittleEndian.Uint32(b[boltPageHeader+8:]))
	for _, off := range []int{0, ps} {
		m := b[off+boltPageHeader : off+boltPageHeader+boltMetaLen]
		binary.LittleEndian.PutUint64(m[32:], ^uint64(0))
		h := fnv.New64a()
		h.Write(m[:56])
		binary.LittleEndian.PutUint64(m[56:], h.Sum64())
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedDBWithoutFreelist: after a crash that left no freelist on
// disk, bbolt rebuilds it at Open by walking the tree in a goroutine of its
// own, where a damaged page would crash the process: Open must find the
// damage first and return ErrDamaged. (Run in a child process would prove
// it; here the test process itself would die.)
func TestDamagedDBWithoutFreelist(t *testing.T) {
	img := dbImage(t, 400, 4, 300)
	db := filepath.Join(img, "spool.db")
	dropFreelist(t, db)
	if s, _, _, err := openObserved(t, img); err != nil {
		t.Fatalf("Open of a sound file without a freelist: %v", err)
	} else {
		s.Close()
	}
	dropFreelist(t, db)
	b, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	const ps = 4096
	for _, tc := range []struct {
		name   string
		damage func(b []byte)
	}{
		{"page headers zeroed", func(b []byte) {
			for p := 2; p < len(b)/ps; p++ {
				clear(b[p*ps : p*ps+16])
			}
		}},
		{"element counts huge", func(b []byte) {
			for p := 2; p < len(b)/ps; p++ {
				binary.LittleEndian.PutUint16(b[p*ps+10:], 0xffff)
			}
		}},
		{"a chunk's page garbled", func(b []byte) {
			p := bytes.Index(b, []byte(`{"lane":1,"n":800,`)) / ps * ps
			for i := range 64 {
				b[p+i] = byte(i * 13)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, img, dir)
			d := bytes.Clone(b)
			tc.damage(d)
			if err := os.WriteFile(filepath.Join(dir, "spool.db"), d, 0o600); err != nil {
				t.Fatal(err)
			}
			if _, _, _, err := openObserved(t, dir); !errors.Is(err, ErrDamaged) {
				t.Fatalf("Open: %v, want ErrDamaged", err)
			}
		})
	}
}
