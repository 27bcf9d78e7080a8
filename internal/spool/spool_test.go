package spool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"minimal", Config{}, true},
		{"no dir", Config{}, false},
		{"negative quota", Config{MaxBytes: -1}, false},
		{"everything", Config{NoSync: true, MaxBytes: 1, MinFreeBytes: -1, maxCommitBytes: 1, CompactMinFileBytes: -1, compactPercent: 50}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name != "no dir" {
				tt.cfg.Dir = t.TempDir()
			}
			s, err := Open(tt.cfg, nil, nil)
			if (err == nil) != tt.ok {
				t.Fatalf("Open(%+v) = %v, want ok=%v", tt.cfg, err, tt.ok)
			}
			if s != nil {
				s.Close()
			}
		})
	}
}

func TestBatch(t *testing.T) {
	var b storage.Batch
	if b.Len() != 0 || b.Bytes() != 0 {
		t.Fatalf("empty batch: len %d bytes %d", b.Len(), b.Bytes())
	}
	in := []storage.Record{
		{OrderKey: []byte("d1"), UserID: []byte("u1"), Data: []byte(`{"a":1}`)},
		{OrderKey: []byte("d2"), Data: []byte(`{}`)},
		{Data: make([]byte, 300)},
	}
	for round := range 2 {
		b.Reset()
		for _, r := range in {
			b.Add(r)
		}
		if b.Len() != len(in) {
			t.Fatalf("round %d: Len %d", round, b.Len())
		}
		putChunkHeader(b.Encoded(), 1234, b.Len(), b.Verdict() != 0)
		var c storage.Chunk
		if err := decodeChunk(9, b.Encoded(), &c, nil); err != nil {
			t.Fatal(err)
		}
		if c.Seq != 9 || c.Accepted.UnixMilli() != 1234 || c.Size != b.Bytes() || len(c.Records) != len(in) {
			t.Fatalf("decoded %+v", c)
		}
		for i, r := range c.Records {
			if string(r.OrderKey) != string(in[i].OrderKey) || string(r.UserID) != string(in[i].UserID) || string(r.Data) != string(in[i].Data) {
				t.Fatalf("record %d: %+v want %+v", i, r, in[i])
			}
		}
		// The index a hot chunk's reader uses gives the same records,
		// empty fields as nil.
		idx := b.Records()
		if len(idx) != len(c.Records) {
			t.Fatalf("indexed records: %d, decoded %d", len(idx), len(c.Records))
		}
		for i, r := range idx {
			d := c.Records[i]
			if !bytes.Equal(r.OrderKey, d.OrderKey) || !bytes.Equal(r.UserID, d.UserID) || !bytes.Equal(r.Data, d.Data) ||
				(r.UserID == nil) != (d.UserID == nil) || (r.OrderKey == nil) != (d.OrderKey == nil) {
				t.Fatalf("indexed record %d: %+v, decoded %+v", i, r, d)
			}
		}
	}
	allocs := testing.AllocsPerRun(100, func() {
		b.Reset()
		for _, r := range in {
			b.Add(r)
		}
	})
	if allocs != 0 {
		t.Fatalf("Batch reuse allocates %v times", allocs)
	}
	// A batch that grows past its buffer moves to a larger class, keeping
	// what it holds.
	var g storage.Batch
	big := storage.Record{OrderKey: []byte("k"), Data: bytes.Repeat([]byte("x"), 700)}
	for range 50 {
		g.Add(big)
	}
	putChunkHeader(g.Encoded(), 1, g.Len(), g.Verdict() != 0)
	var c storage.Chunk
	if err := decodeChunk(1, g.Encoded(), &c, nil); err != nil || len(c.Records) != 50 || !bytes.Equal(c.Records[49].Data, big.Data) {
		t.Fatalf("grown batch: %d records, %v", len(c.Records), err)
	}
	if rs := g.Records(); len(rs) != 50 || !bytes.Equal(rs[49].Data, big.Data) || !bytes.Equal(rs[0].OrderKey, big.OrderKey) {
		t.Fatalf("grown batch's index: %d records", len(rs))
	}
}

func TestLaneLabel(t *testing.T) {
	s := openTest(t, Config{NoSync: true})
	secret := "0123456789abcdef-secret"
	l := mustLane(t, s, storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: secret, Options: `{"min_id_length":3}`})
	if strings.Contains(l.Key().Label(), secret) || !strings.HasPrefix(l.Key().Label(), "groupidentify-") || len(l.Key().Label()) != len("groupidentify-")+8 {
		t.Fatalf("label %q", l.Key().Label())
	}
	l2 := mustLane(t, s, storage.LaneKey{Kind: storage.KindGroupIdentify, APIKey: secret})
	if l2.Key().Label() == l.Key().Label() || l2.ID() == l.ID() {
		t.Fatalf("lanes with different options share label %q / id %d", l.Key().Label(), l.ID())
	}
	if again := mustLane(t, s, l.Key()); again != l {
		t.Fatal("Lane returned a new handle for an existing key")
	}
}

func TestAppendNextAckReopen(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s, err := Open(Config{Dir: dir}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, changed := s.lanesFrom(0)
	l := mustLane(t, s, testKey(1))
	select {
	case <-changed:
	default:
		t.Fatal("lanesFrom's channel not closed after a lane was created")
	}
	var b storage.Batch
	for i := range 10 {
		b.Reset()
		for j := range 3 {
			b.Add(rec(1, i*3+j, 10))
		}
		if err := s.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Append(ctx, l, new(storage.Batch)); err != nil {
		t.Fatalf("empty append: %v", err)
	}
	st := l.Stats()
	if st.Chunks != 10 || st.Records != 30 || st.Oldest.IsZero() || s.Stats().LiveBytes != st.Bytes {
		t.Fatalf("stats %+v, spool %+v", st, s.Stats())
	}
	cs := nextT(t, l, 1) // at least one
	if len(cs) != 1 || cs[0].Seq != 1 {
		t.Fatalf("first Next: %d chunks", len(cs))
	}
	cs = append(cs, nextT(t, l, 1<<20)...)
	if len(cs) != 10 {
		t.Fatalf("read %d chunks", len(cs))
	}
	for i, c := range cs {
		if c.Seq != uint64(i+1) {
			t.Fatalf("chunk %d has seq %d", i, c.Seq)
		}
		for j, r := range c.Records {
			if _, n := recID(r); n != i*3+j {
				t.Fatalf("chunk %d record %d is %d", i, j, n)
			}
		}
	}
	for _, c := range cs[:4] {
		l.Ack(c.Seq)
	}
	l.Ack(2)   // twice
	l.Ack(999) // never written
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := readWhole(ctx, l, 100); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
	if b.Len() != 0 {
		t.Fatalf("batch holds %d records after a successful Append", b.Len())
	}
	b.Add(rec(1, 99, 1))
	if err := s.Append(ctx, l, &b); !errors.Is(err, ErrClosed) {
		t.Fatalf("Append after Close: %v", err)
	}
	if b.Len() != 1 {
		t.Fatalf("a refused Append emptied the batch")
	}

	s = openTest(t, Config{Dir: dir})
	lanes := s.Lanes()
	if len(lanes) != 1 || lanes[0].Key() != testKey(1) {
		t.Fatalf("lanes after reopen: %v", lanes)
	}
	l = lanes[0]
	if st := l.Stats(); st.Chunks != 6 || st.Records != 18 {
		t.Fatalf("stats after reopen %+v", st)
	}
	cs = drainAvailable(t, l)
	if len(cs) != 6 || cs[0].Seq != 5 {
		t.Fatalf("after reopen read %d chunks from %d", len(cs), cs[0].Seq)
	}
	b.Reset()
	b.Add(rec(1, 30, 1))
	if err := s.Append(ctx, l, &b); err != nil {
		t.Fatal(err)
	}
	if cs := nextT(t, l, 0); len(cs) != 1 || cs[0].Seq != 11 {
		t.Fatalf("append after reopen: %+v", cs)
	}
}

// TestNextBlocks checks that Next waits for an Append, and returns on ctx
// end and on Close.
func TestNextBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := openTest(t, Config{NoSync: true})
		l := mustLane(t, s, testKey(1))
		got := make(chan []storage.Chunk, 1)
		go func() {
			cs, err := readWhole(context.Background(), l, 1000)
			if err != nil {
				t.Error(err)
			}
			got <- cs
		}()
		synctest.Wait() // the reader is blocked in Next
		var b storage.Batch
		b.Add(rec(1, 1, 1))
		t0 := time.Now()
		if err := s.Append(context.Background(), l, &b); err != nil {
			t.Fatal(err)
		}
		select {
		case cs := <-got:
			if len(cs) != 1 {
				t.Fatalf("%d chunks", len(cs))
			}
			// Fake time: woken by the Append itself, not by the
			// reader's idle tick (recIdleDrop) finding the chunk.
			if el := time.Since(t0); el != 0 {
				t.Fatalf("Next woke %v after the Append", el)
			}
		case <-time.After(polltest.Max):
			t.Fatal("Next did not wake")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if _, err := readWhole(ctx, l, 1000); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Next with expired ctx: %v", err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := readWhole(context.Background(), l, 1000)
			errc <- err
		}()
		synctest.Wait() // the reader is blocked in Next
		t0 = time.Now()
		s.Close()
		if err := <-errc; !errors.Is(err, ErrClosed) {
			t.Fatalf("blocked Next after Close: %v", err)
		}
		if el := time.Since(t0); el != 0 {
			t.Fatalf("blocked Next returned %v after Close", el)
		}
	})
}

// TestConcurrentLanes appends from many goroutines to many lanes while one
// reader per lane reads and acks, and checks order, completeness and that
// commits were shared.
func TestConcurrentLanes(t *testing.T) {
	reg := prometheus.NewRegistry()
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		if err := checkFile(dir + "/spool.db"); err != nil {
			t.Error(err)
		}
	})
	const lanes, writersPerLane, perWriter = 8, 8, 25 // 64 concurrent appenders
	ctx := context.Background()
	var ls []*Lane
	for i := range lanes {
		ls = append(ls, mustLane(t, s, testKey(i)))
	}
	var wg sync.WaitGroup
	for i := range lanes {
		for w := range writersPerLane {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var b storage.Batch
				for n := range perWriter {
					b.Reset()
					b.Add(rec(i, w*1000+n, 100))
					b.Add(rec(i, w*1000+n, 100))
					if err := s.Append(ctx, ls[i], &b); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	readers := make([][]storage.Chunk, lanes)
	var rwg sync.WaitGroup
	for i := range lanes {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			for n := 0; n < writersPerLane*perWriter; {
				cs := nextT(t, ls[i], 4096)
				for _, c := range cs {
					ls[i].Ack(c.Seq)
				}
				n += len(cs)
				readers[i] = append(readers[i], cs...)
			}
		}()
	}
	wg.Wait()
	rwg.Wait()
	for i, cs := range readers {
		last := map[int]int{}
		for k, c := range cs {
			if c.Seq != uint64(k+1) {
				t.Fatalf("lane %d: chunk %d has seq %d", i, k, c.Seq)
			}
			lane, n := recID(c.Records[0])
			if lane != i {
				t.Fatalf("lane %d got a record of lane %d", i, lane)
			}
			w := n / 1000
			if p, ok := last[w]; ok && n != p+1 {
				t.Fatalf("lane %d writer %d: %d after %d", i, w, n, p)
			}
			last[w] = n
		}
	}
	commits := gatherValue(t, reg, "relay_spool_commits_total", "")
	appends := float64(lanes * writersPerLane * perWriter)
	t.Logf("%v appends in %v commits", appends, commits)
	if commits >= appends/2 {
		t.Fatalf("group commit did not group: %v commits for %v appends", commits, appends)
	}
	// Acks ride in commits of their own when nothing else is queued.
	polltest.Until(t, "no live bytes after acking all", func() bool { return s.Stats().LiveBytes == 0 })
	for _, l := range ls {
		if v := gatherValue(t, reg, "relay_spool_records", l.Key().Label()); v != 0 {
			t.Fatalf("relay_spool_records{lane=%s} = %v", l.Key().Label(), v)
		}
	}
	if v := gatherValue(t, reg, "relay_spool_commit_records", ""); v != appends*2 {
		t.Fatalf("relay_spool_commit_records sum %v, want %v", v, appends*2)
	}
}

// gatherValue returns a counter's or gauge's value, or a histogram's sum,
// of the series of name with the given lane label ("" = no label).
func gatherValue(t testing.TB, reg *prometheus.Registry, name, lane string) float64 {
	t.Helper()
	return gatherLabel(t, reg, name, "lane", lane)
}

// gatherLabel is gatherValue for any one label.
func gatherLabel(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					l = lp.GetValue()
				}
			}
			if l != value {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return m.GetHistogram().GetSampleSum()
			}
		}
	}
	t.Fatalf("metric %s{%s=%q} not found", name, label, value)
	return 0
}

func TestSecondOpenFails(t *testing.T) {
	s := openTest(t, Config{NoSync: true})
	start := time.Now()
	_, err := Open(s.cfg, nil, nil)
	if !errors.Is(err, errLocked) || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("second Open: %v", err)
	}
	// One that waited for the lock would never return.
	if time.Since(start) > polltest.Max {
		t.Fatalf("second Open took %v", time.Since(start))
	}
}

// TestOldestAndRejectMetrics: a lane's Oldest follows its first live chunk
// through acks, and refused appends are counted by reason.
func TestOldestAndRejectMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		dir := t.TempDir()
		s, err := Open(Config{Dir: dir, NoSync: true, MaxBytes: 2000}, nil, reg)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx := context.Background()
		l := mustLane(t, s, testKey(1))
		var b storage.Batch
		for i := range 3 {
			b.Reset()
			b.Add(rec(1, i, 100))
			if err := s.Append(ctx, l, &b); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Millisecond) // distinct accepted milliseconds (fake time: exactly 2)
		}
		b.Reset()
		b.Add(rec(1, 9, 2000))
		if err := s.Append(ctx, l, &b); !errors.Is(err, ErrFull) {
			t.Fatalf("oversized append: %v", err)
		}
		if v := gatherLabel(t, reg, "relay_spool_append_rejected_total", "reason", "full"); v != 1 {
			t.Fatalf("rejected total %v", v)
		}
		cs := drainAvailable(t, l)
		if len(cs) != 3 {
			t.Fatalf("%d chunks", len(cs))
		}
		for i, c := range cs {
			if got := l.Stats().Oldest; !got.Equal(c.Accepted) {
				t.Fatalf("before ack %d: Oldest %v, want %v", i, got, c.Accepted)
			}
			if age := gatherValue(t, reg, "relay_spool_oldest_record_age_seconds", l.Key().Label()); age <= 0 {
				t.Fatalf("oldest age %v", age)
			}
			l.Ack(c.Seq)
			polltest.Until(t, "the ack applied", func() bool { return l.Stats().Chunks == int64(2-i) })
		}
		if st := l.Stats(); !st.Oldest.IsZero() || st.Chunks != 0 || st.Bytes != 0 {
			t.Fatalf("empty lane stats %+v", st)
		}
		if age := gatherValue(t, reg, "relay_spool_oldest_record_age_seconds", l.Key().Label()); age != 0 {
			t.Fatalf("empty lane oldest age %v", age)
		}
	})
}

// AddFunc writes the data in place with a length prefix sized from maxData:
// wider than needed (a padded uvarint), exact, or too narrow (the data is
// moved to make room). Decoding and the reader's index agree on every case,
// and a chunk of AddFunc records round-trips through a spool.
func TestBatchAddFunc(t *testing.T) {
	var b storage.Batch
	var want []storage.Record
	for i, tc := range []struct{ n, maxData int }{
		{5, 5}, {5, 1000}, {5, 100000}, {200, 100}, {20000, 10}, {0, 0}, {0, 300}, {130, 127},
	} {
		data := bytes.Repeat([]byte{byte('a' + i)}, tc.n)
		r := storage.Record{OrderKey: []byte(fmt.Sprintf("d:%d", i)), UserID: []byte("u"), Data: data}
		b.AddFunc(r.OrderKey, r.UserID, tc.maxData, func(dst []byte) []byte { return append(dst, data...) })
		want = append(want, r)
	}
	putChunkHeader(b.Encoded(), 1, b.Len(), b.Verdict() != 0)
	var c storage.Chunk
	if err := decodeChunk(1, b.Encoded(), &c, nil); err != nil {
		t.Fatal(err)
	}
	for name, rs := range map[string][]storage.Record{"decoded": c.Records, "indexed": b.Records()} {
		if len(rs) != len(want) {
			t.Fatalf("%s: %d records", name, len(rs))
		}
		for i, r := range rs {
			if !bytes.Equal(r.Data, want[i].Data) || !bytes.Equal(r.OrderKey, want[i].OrderKey) || !bytes.Equal(r.UserID, want[i].UserID) {
				t.Fatalf("%s record %d: %d bytes of data, want %d", name, i, len(r.Data), len(want[i].Data))
			}
		}
	}
	s := openTest(t, Config{NoSync: true})
	l := mustLane(t, s, testKey(1))
	if err := s.Append(context.Background(), l, &b); err != nil {
		t.Fatal(err)
	}
	cs := nextT(t, l, 0)
	if len(cs) != 1 || len(cs[0].Records) != len(want) || !bytes.Equal(cs[0].Records[4].Data, want[4].Data) {
		t.Fatalf("read back %+v", cs)
	}
}

// TestNextPartReuse checks that NextPart returns what Next would, carves the
// Records of every chunk from the slice it is given (growing it when one
// call needs more), and does so for chunks in the WAL and in bbolt.
func TestNextPartReuse(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s := openTest(t, Config{Dir: dir})
	l := mustLane(t, s, testKey(1))
	n := 0
	appendChunks := func(s *Spool, l *Lane, chunks, per int) {
		t.Helper()
		var b storage.Batch
		for range chunks {
			b.Reset()
			for range per {
				b.Add(rec(1, n, 10))
				n++
			}
			if err := s.Append(ctx, l, &b); err != nil {
				t.Fatal(err)
			}
		}
	}
	read := 0
	readReuse := func(l *Lane, recs []storage.Record) ([]storage.Chunk, []storage.Record) {
		t.Helper()
		cs, recs := nextPartT(t, l, recs)
		total := 0
		for _, c := range cs {
			for _, r := range c.Records {
				if _, id := recID(r); id != read {
					t.Fatalf("record %d read as %d", read, id)
				}
				if want := rec(1, read, 10); !bytes.Equal(r.OrderKey, want.OrderKey) || !bytes.Equal(r.UserID, want.UserID) {
					t.Fatalf("record %d: %q %q", read, r.OrderKey, r.UserID)
				}
				read++
				total++
			}
		}
		if len(recs) == 0 || len(recs) > total {
			t.Fatalf("NextPart returned %d records to reuse for %d read", len(recs), total)
		}
		return cs, recs
	}

	// More records than the first slice holds (256): it grows within the
	// call, and the records carved before stay intact.
	appendChunks(s, l, 6, 100)
	_, recs := readReuse(l, nil)
	first := &recs[0]

	// The next call carves from the same slice.
	appendChunks(s, l, 2, 50)
	cs, recs := readReuse(l, recs)
	if &cs[0].Records[0] != first || &recs[0] != first {
		t.Fatal("NextPart did not reuse the slice it was given")
	}

	// From bbolt: unacknowledged chunks are there after a reopen.
	appendChunks(s, l, 3, 20)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, Config{Dir: dir})
	l = s.Lanes()[0]
	l.mu.Lock()
	hot := l.hot.chunks
	l.mu.Unlock()
	if hot != 0 {
		t.Fatalf("%d chunks in the WAL after a reopen; the test wants them in bbolt", hot)
	}
	read = 0
	for read < n {
		cs, recs = readReuse(l, recs)
		if &cs[0].Records[0] != first {
			t.Fatal("NextPart did not reuse the slice for chunks read from bbolt")
		}
	}
	if read != n {
		t.Fatalf("read %d records of %d", read, n)
	}
}

// TestNextPartIdle checks that NextPart keeps reusing the slice (and its
// []Chunk) across a short wait for chunks and drops them when the wait
// passes recIdleDrop.
func TestNextPartIdle(t *testing.T) {
	old := recIdleDrop
	t.Cleanup(func() { recIdleDrop = old })
	s := openTest(t, Config{})
	l := mustLane(t, s, testKey(1))
	ctx := context.Background()
	n := 0
	appendAfter := func(d time.Duration) chan error {
		done := make(chan error, 1)
		time.AfterFunc(d, func() {
			var b storage.Batch
			b.Add(rec(1, n, 10))
			n++
			done <- s.Append(ctx, l, &b)
		})
		return done
	}
	if err := <-appendAfter(0); err != nil {
		t.Fatal(err)
	}
	cs0, recs := nextPartT(t, l, nil)
	first, firstChunk := &recs[0], &cs0[0]

	recIdleDrop = 10 * time.Second // the append's fsync may be slow on a busy machine
	done := appendAfter(10 * time.Millisecond)
	cs, recs := nextPartT(t, l, recs)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if &cs[0].Records[0] != first {
		t.Fatal("NextPart dropped the slice after a short wait")
	}
	if &cs[0] != firstChunk {
		t.Fatal("NextPart did not reuse its []storage.Chunk after a short wait")
	}
	if _, id := recID(cs[0].Records[0]); id != 1 {
		t.Fatalf("read record %d, want 1", id)
	}

	recIdleDrop = 20 * time.Millisecond
	done = appendAfter(200 * time.Millisecond)
	cs, _ = nextPartT(t, l, recs)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if &cs[0].Records[0] == first {
		t.Fatal("NextPart kept the slice through a wait longer than recIdleDrop")
	}
	if &cs[0] == firstChunk {
		t.Fatal("NextPart kept its []storage.Chunk through a wait longer than recIdleDrop")
	}
	if _, id := recID(cs[0].Records[0]); id != 2 {
		t.Fatalf("read record %d, want 2", id)
	}
}
