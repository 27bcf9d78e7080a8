package spool

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

// openTest opens a spool in a new temporary directory (or cfg.Dir when set)
// and, at cleanup, closes it and checks the file: bbolt's consistency check
// and the lane counters against the queues.
func openTest(t testing.TB, cfg Config) *Spool {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	s, err := Open(cfg, nil, nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
		if err := checkFile(filepath.Join(cfg.Dir, "spool.db")); err != nil {
			t.Errorf("spool file check: %v", err)
		}
	})
	return s
}

// checkFile runs bbolt's consistency check and checks that each lane's
// stored counters match its queue, and the dead letter counters the dead bucket.
func checkFile(path string) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return fmt.Errorf("bbolt check: %w", err)
		}
		err := tx.Bucket(bucketLanes).ForEach(func(k, v []byte) error {
			key, st, err := decodeLane(v)
			if err != nil {
				return err
			}
			var got laneState
			q := tx.Bucket(queueName(binary.BigEndian.Uint64(k)))
			if q == nil {
				return fmt.Errorf("lane %v: no queue", k)
			}
			var last uint64
			err = q.ForEach(func(k, v []byte) error {
				v = chunkValue(q, k, v)
				seq := binary.BigEndian.Uint64(k)
				if seq >= st.nextSeq {
					return fmt.Errorf("lane %d: seq %d >= next %d", key.Kind, seq, st.nextSeq)
				}
				var c storage.Chunk
				if err := decodeChunk(seq, v, &c, nil); err != nil {
					return err
				}
				got.chunks++
				got.records += uint64(len(c.Records))
				got.bytes += uint64(len(v))
				last = seq
				return nil
			})
			if err != nil {
				return err
			}
			_ = last
			got.nextSeq = st.nextSeq
			if got != st {
				return fmt.Errorf("lane counters %+v, queue holds %+v", st, got)
			}
			return nil
		})
		if err != nil {
			return err
		}
		var n, b uint64
		_ = tx.Bucket(bucketDead).ForEach(func(k, v []byte) error {
			n++
			b += uint64(len(v))
			return nil
		})
		var sn, sb uint64
		if v := tx.Bucket(bucketMeta).Get(keyDead); len(v) == 16 {
			sn, sb = binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:])
		}
		if n != sn || b != sb {
			return fmt.Errorf("dead counters %d/%d, bucket holds %d/%d", sn, sb, n, b)
		}
		return nil
	})
}

func testKey(i int) storage.LaneKey {
	return storage.LaneKey{Kind: storage.KindEvents, APIKey: fmt.Sprintf("key-%03d", i), Options: ""}
}

func mustLane(t testing.TB, s *Spool, key storage.LaneKey) *Lane {
	t.Helper()
	l, err := s.Lane(context.Background(), key)
	if err != nil {
		t.Fatalf("Lane: %v", err)
	}
	return l
}

// rec builds a record whose data names it.
func rec(lane, n int, pad int) storage.Record {
	d := fmt.Appendf(nil, `{"lane":%d,"n":%d,"pad":"`, lane, n)
	d = append(d, bytes.Repeat([]byte{'x'}, pad)...)
	d = append(d, `"}`...)
	return storage.Record{OrderKey: fmt.Appendf(nil, "dev-%d", n%7), UserID: fmt.Appendf(nil, "u%d", n), Data: d}
}

// recID parses the n of a record built by rec.
func recID(r storage.Record) (lane, n int) {
	if _, err := fmt.Sscanf(string(r.Data), `{"lane":%d,"n":%d,`, &lane, &n); err != nil {
		panic(fmt.Sprintf("bad record %q: %v", r.Data, err))
	}
	return lane, n
}

// readWhole reads as the removed Lane.Next did, for tests that want whole
// chunks: a chunk NextPart returns in parts is joined (its Size is then its
// records' bytes, not its encoding's), and the chunks and Records are fresh.
func readWhole(ctx context.Context, l *Lane, maxBytes int) ([]storage.Chunk, error) {
	cs, _, err := l.NextPart(ctx, maxBytes, nil)
	cs = slices.Clone(cs)
	for err == nil && cs[0].First+len(cs[0].Records) < cs[0].Total {
		var more []storage.Chunk
		if more, _, err = l.NextPart(ctx, maxBytes, nil); err == nil {
			cs[0].Records = append(cs[0].Records, more[0].Records...)
			cs[0].Size += more[0].Size
		}
	}
	return cs, err
}

// nextT calls readWhole with a deadline.
func nextT(t testing.TB, l *Lane, maxBytes int) []storage.Chunk {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	defer cancel()
	cs, err := readWhole(ctx, l, maxBytes)
	if err != nil {
		t.Fatalf("NextPart: %v", err)
	}
	return cs
}

// nextPartT calls NextPart with a deadline.
func nextPartT(t testing.TB, l *Lane, recs []storage.Record) ([]storage.Chunk, []storage.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	defer cancel()
	cs, recs, err := l.NextPart(ctx, 1<<20, recs)
	if err != nil {
		t.Fatalf("NextPart: %v", err)
	}
	return cs, recs
}

// drainAvailable reads everything committed in l now, without blocking.
func drainAvailable(t testing.TB, l *Lane) []storage.Chunk {
	t.Helper()
	var out []storage.Chunk
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		cs, err := readWhole(ctx, l, 1<<20)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatalf("NextPart: %v", err)
		}
		out = append(out, cs...)
	}
}

// checkpointed reports whether everything appended and acknowledged so far
// is applied to bbolt: no chunk held in memory, nothing queued for the
// store, the applied position at the WAL's end.
func (s *Spool) checkpointed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hotHeld.Load() == 0 && len(s.coldAcks) == 0 && len(s.sops) == 0 && s.walTotal == s.appliedTotal.Load()
}

// ckptFailing reports whether the last checkpoint failed.
func (s *Spool) ckptFailing() bool { return s.ckptErr.Load() != nil }
