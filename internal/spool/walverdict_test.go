package spool

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/svcrelay/relay/internal/storage"
)

// Tests of the one verdict on the write-ahead log that a start (replay)
// and Verify share (readLog): what is damage, what it cost, and what is
// not damage at all.

// verdict opens dir after Verify read it, and returns both readers' word
// on damage: Verify's report, the replay's damage lines and counter.
func verdict(t *testing.T, dir string) (VerifyReport, []observer.LoggedEntry, *observer.ObservedLogs, float64) {
	t.Helper()
	rep, err := Verify(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, logs, reg, err := openObserved(t, dir)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	errs := logs.FilterLevelExact(zapcore.ErrorLevel).FilterMessageSnippet("damaged write-ahead log records").All()
	return rep, errs, logs, damagedCount(t, reg, "wal")
}

// TestStopAndCrashReportNoDamage: a spool that reuses its WAL files (small
// segments, chunks acknowledged as they come), stopped cleanly, or copied
// as a crash leaves it at any moment, is no damage to either reader: no
// damage line, no counter, no problem, and after a clean stop not even a
// note (the log ends where its last write ended, not in a reused file's
// old bytes).
func TestStopAndCrashReportNoDamage(t *testing.T) {
	dir := t.TempDir()
	cfg := integrityCfg(dir)
	cfg.segmentBytes = 64 << 10
	s, err := Open(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	l := mustLane(t, s, testKey(1))
	var imgs []string
	var b storage.Batch
	for i := range 400 {
		b.Reset()
		for j := range 3 {
			b.Add(rec(1, i*3+j, 97+i%13)) // record sizes that old bytes do not line up with
		}
		if err := s.Append(context.Background(), l, &b); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			for _, c := range drainAvailable(t, l) {
				l.Ack(c.Seq)
			}
		}
		if i%40 == 39 {
			imgs = append(imgs, crashImage(t, dir))
		}
	}
	if _, spares, _ := walFiles(walPath(dir)); len(spares) == 0 {
		t.Fatal("no spare WAL file: the test reuses none")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for i, img := range append(imgs, dir) {
		clean := img == dir
		t.Run(fmt.Sprintf("image %d clean %v", i, clean), func(t *testing.T) {
			rep, errs, logs, counted := verdict(t, img)
			if rep.Damaged != 0 || len(rep.Problems) != 0 || len(errs) != 0 || counted != 0 {
				t.Fatalf("no damage, yet Verify: %d damaged %q; start: %d damage lines %v, counter %v",
					rep.Damaged, rep.Problems, len(errs), errs, counted)
			}
			if torn := logs.FilterMessageSnippet("write cut short").Len(); clean && (torn != 0 || len(rep.Notes) != 0) {
				t.Fatalf("a clean stop: %d torn-write lines, notes %q; want none", torn, rep.Notes)
			}
		})
	}
}

// TestDamageReportedExactly flips a byte inside acknowledged chunk records
// of 50 events each and requires both readers to say exactly what was
// lost: the lane, one damaged record, 50 events (the counter counts
// events); a damaged chunk that the log acknowledges later (delivered)
// lost nothing and raises no alarm.
func TestDamageReportedExactly(t *testing.T) {
	const chunks, per = 6, 50
	img, seg, recs := walImage(t, chunks, per, -1, 100)
	label := testKey(1).Label()
	for _, tc := range []struct {
		name   string
		damage []int // chunk indexes whose payload gets a flipped byte
	}{
		{"one chunk", []int{2}},
		{"two chunks apart", []int{1, 4}},
		{"the last chunk", []int{chunks - 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, img, dir)
			path := filepath.Join(dir, walDirName, segName(seg))
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			for _, i := range tc.damage {
				data[recs[i].pos.off+recHeaderLen+60] ^= 0x04
			}
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			rep, errs, _, counted := verdict(t, dir)
			n := len(tc.damage)
			if rep.Damaged != int64(n*per) || len(rep.Problems) != n {
				t.Errorf("Verify: %d damaged, problems %q; want %d events in %d problems", rep.Damaged, rep.Problems, n*per, n)
			}
			for _, p := range rep.Problems {
				if want := fmt.Sprintf("lane %s: 1 damaged records, %d events lost", label, per); !strings.Contains(p, want) {
					t.Errorf("Verify problem %q; want it to say %q", p, want)
				}
			}
			if counted != float64(n*per) || len(errs) != n {
				t.Fatalf("start: counter %v, %d damage lines; want %d, %d", counted, len(errs), n*per, n)
			}
			for k, e := range errs {
				f := e.ContextMap()
				if f["lane"] != label || f["records"] != int64(1) || f["events"] != int64(per) || f["from"] != recs[tc.damage[k]].pos.off {
					t.Errorf("damage line %v; want lane %s, records 1, events %d, from %d", f, label, per, recs[tc.damage[k]].pos.off)
				}
			}
		})
	}

	t.Run("delivered before the damage", func(t *testing.T) {
		dir := t.TempDir()
		cfg := integrityCfg(dir)
		cfg.checkpointEvery = time.Hour
		s, err := Open(cfg, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		l := mustLane(t, s, testKey(1))
		var b storage.Batch
		for i := range 4 {
			b.Reset()
			for j := range per {
				b.Add(rec(1, i*per+j, 100))
			}
			if err := s.Append(context.Background(), l, &b); err != nil {
				t.Fatal(err)
			}
			if i == 2 {
				// The second chunk delivered (the first not yet: spool.db's
				// applied position stays before both); the ack is written
				// with the next append.
				cs := nextT(t, l, 1<<20)
				l.Ack(cs[1].Seq)
			}
		}
		mustLane(t, s, testKey(2)) // a checkpoint: the end acknowledged
		img := crashImage(t, dir)
		s.Close()
		segs, _, _ := walFiles(walPath(img))
		data, all := segRecords(t, img, segs[0])
		var chunkRecs []walRecord
		for _, r := range all {
			if r.typ == recChunk {
				chunkRecs = append(chunkRecs, r)
			}
		}
		data[chunkRecs[1].pos.off+recHeaderLen+60] ^= 0x04
		if err := os.WriteFile(filepath.Join(img, walDirName, segName(segs[0])), data, 0o600); err != nil {
			t.Fatal(err)
		}
		rep, errs, _, counted := verdict(t, img)
		if rep.Damaged != 0 || len(rep.Problems) != 0 || len(errs) != 0 || counted != 0 {
			t.Fatalf("a delivered chunk's damage: Verify %d damaged %q, start %d damage lines, counter %v; want no alarm",
				rep.Damaged, rep.Problems, len(errs), counted)
		}
		if rep.Records != 3*per || len(rep.Notes) != 1 {
			t.Errorf("Verify: %d records, notes %q; want %d records and a note of the damage", rep.Records, rep.Notes, 3*per)
		}
	})
}
