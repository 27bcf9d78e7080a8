package spool

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

const crashChildEnv = "SPOOL_CRASH_CHILD"

// TestMain lets the test binary act as the crash test's child process.
func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		return
	}
	os.Exit(m.Run())
}

// crashAppend is what a writer's append n holds: one to three small
// records, or every sixteenth one record of 33 KiB (a chunk stored as a
// bucket of its own, chunkstore.go).
func crashAppend(n int) (records, pad int) {
	if n%16 == 15 {
		return 1, 33 << 10
	}
	return 1 + n%3, 200
}

// crashChild appends from concurrent goroutines forever, printing "ok <id>"
// after every Append that returned nil, and reads and acknowledges every
// lane, printing "ack <id>" before each Ack, until killed. Its WAL segments
// are small (many rotations and reuses) and its checkpoints frequent; the
// round chooses the flush age, from "every chunk goes to bbolt at once" to
// the default.
func crashChild(dir string) {
	round, _ := strconv.Atoi(os.Getenv("SPOOL_CRASH_ROUND"))
	noSync := round%2 == 0
	flush := []time.Duration{time.Nanosecond, 20 * time.Millisecond, 0}[round%3]
	s, err := Open(Config{Dir: dir, NoSync: noSync, segmentBytes: 256 << 10, checkpointEvery: 5 * time.Millisecond, flushAge: flush}, nil, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		os.Exit(2)
	}
	var out sync.Mutex
	ctx := context.Background()
	for w := range 16 {
		go func() {
			l, err := s.Lane(ctx, testKey(w%4))
			if err != nil {
				fmt.Fprintln(os.Stderr, "child lane:", err)
				os.Exit(2)
			}
			var b storage.Batch
			for n := 0; ; n++ {
				id := round*1_000_000 + w*10_000 + n
				b.Reset()
				records, pad := crashAppend(n)
				for range records {
					b.Add(rec(w%4, id, pad))
				}
				if err := s.Append(ctx, l, &b); err != nil {
					fmt.Fprintln(os.Stderr, "child append:", err)
					os.Exit(2)
				}
				out.Lock()
				fmt.Fprintf(os.Stdout, "ok %d\n", id)
				out.Unlock()
			}
		}()
	}
	for lane := range 4 {
		go func() {
			l, err := s.Lane(ctx, testKey(lane))
			if err != nil {
				fmt.Fprintln(os.Stderr, "child lane:", err)
				os.Exit(2)
			}
			for {
				cs, err := readWhole(ctx, l, 64<<10)
				if err != nil {
					fmt.Fprintln(os.Stderr, "child next:", err)
					os.Exit(2)
				}
				for _, c := range cs {
					_, id := recID(c.Records[0])
					out.Lock()
					fmt.Fprintf(os.Stdout, "ack %d\n", id)
					out.Unlock()
					l.Ack(c.Seq)
					c.Buffer.Release()
				}
			}
		}()
	}
	select {}
}

// TestCrash kills a child process that appends concurrently at random
// moments, and checks after each kill that every Append that returned nil is
// in the spool exactly once and in order per writer; it then drains the
// spool (acks) before the next round, so reopen after acks is covered too.
func TestCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess crash test")
	}
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for round := range 6 {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, "SPOOL_CRASH_ROUND="+strconv.Itoa(round))
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		killAfter := 50 + rand.IntN(400) // acknowledged appends before the kill
		confirmed, acked := map[int]bool{}, map[int]bool{}
		note := func(line string) bool {
			f := strings.Fields(line)
			if len(f) != 2 {
				return false
			}
			id, err := strconv.Atoi(f[1])
			switch {
			case err != nil:
				return false
			case f[0] == "ok":
				confirmed[id] = true
			case f[0] == "ack":
				acked[id] = true
			default:
				return false
			}
			return true
		}
		sc := bufio.NewScanner(stdout)
		deadline := time.Now().Add(polltest.Max)
		for len(confirmed) < killAfter && time.Now().Before(deadline) && sc.Scan() {
			if !note(sc.Text()) {
				t.Fatalf("child said %q", sc.Text())
			}
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// Lines written before the kill still count: the child printed them
		// after Append returned (before Ack). The scanner may hold some
		// already: read on with it.
		for sc.Scan() {
			note(sc.Text())
		}
		_ = cmd.Wait()
		if len(confirmed) < killAfter {
			t.Fatalf("round %d: child confirmed only %d appends", round, len(confirmed))
		}

		s, err := Open(Config{Dir: dir, NoSync: true}, nil, nil)
		if err != nil {
			t.Fatalf("round %d: reopen: %v", round, err)
		}
		found := map[int]int{}
		lastByWriter := map[int]int{}
		for _, l := range s.Lanes() {
			for _, c := range drainAvailable(t, l) {
				_, id := recID(c.Records[0])
				if want, _ := crashAppend(id % 10_000); len(c.Records) != want {
					t.Fatalf("round %d: append %d has %d records", round, id, len(c.Records))
				}
				for _, r := range c.Records {
					if _, rid := recID(r); rid != id {
						t.Fatalf("round %d: chunk of %d holds %d", round, id, rid)
					}
				}
				found[id]++
				w := id / 10_000
				if p, ok := lastByWriter[w]; ok && id <= p {
					t.Fatalf("round %d: writer %d: %d after %d", round, w, id, p)
				}
				lastByWriter[w] = id
				l.Ack(c.Seq)
			}
		}
		// A confirmed append not acknowledged is there once; an
		// acknowledged one at most once (its ack may not have reached the
		// disk: delivered again).
		again := 0
		for id := range confirmed {
			if !acked[id] && found[id] != 1 {
				t.Fatalf("round %d: confirmed append %d found %d times", round, id, found[id])
			}
			if acked[id] && found[id] == 1 {
				again++
			}
		}
		for id, n := range found {
			if n != 1 || id/1_000_000 != round {
				t.Fatalf("round %d: append %d found %d times (old rounds must be drained)", round, id, n)
			}
		}
		t.Logf("%v round %d: %d confirmed, %d acked (%d of them back), %d found after the restart",
			time.Now().Format("05.000"), round, len(confirmed), len(acked), again, len(found))
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := checkFile(dir + "/spool.db"); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}

// TestColdAckSurvivesCrash: a chunk of spool.db acknowledged and killed
// before the checkpoint that deletes it is not read again after the
// restart, nor counted by Verify: the ack reached the write-ahead log.
func TestColdAckSurvivesCrash(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir, MinFreeBytes: -1})
	l := mustLane(t, s, testKey(1))
	for i := range 3 {
		var b storage.Batch
		b.Add(rec(1, i, 100))
		if err := s.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
	}
	s.Close() // puts the three chunks into spool.db

	s = openTest(t, Config{Dir: dir, MinFreeBytes: -1, checkpointEvery: time.Hour})
	l = mustLane(t, s, testKey(1))
	mustLane(t, s, testKey(2)) // the store's first checkpoint is done: the next is an hour away
	s.mu.Lock()
	end := s.walEnd
	s.mu.Unlock()
	cs := nextT(t, l, 1)
	l.Ack(cs[0].Seq)
	polltest.Until(t, "the ack written to the WAL", func() bool { // it moves the WAL's end
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.walEnd != end
	})
	img := crashImage(t, dir)
	if rep, err := Verify(img, nil); err != nil || rep.Records != 2 || rep.Damaged != 0 {
		t.Fatalf("Verify after the crash: %+v, %v; want 2 records", rep, err)
	}
	s2 := openTest(t, Config{Dir: img, MinFreeBytes: -1})
	if got := readAll(t, s2); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("read after the crash: %v, want [1 2]", got)
	}
}
