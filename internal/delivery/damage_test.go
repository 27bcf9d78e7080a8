package delivery

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/throttle"
)

// TestDamagedChunkDelivered runs the pipeline over a spool.db whose chunk
// in the middle of a lane fails its checksum, as the relay does after a
// start on such a file: the chunk's records become dead letters with
// reason damaged (counted and logged once), every other event is
// delivered in order per device, and the pipeline stops promptly. The
// reader reads with a context that is already done (NextPart returns at
// once when there is nothing to read): a dead-letter write that used that
// context failed, and the lane spun on the chunk for ever.
func TestDamagedChunkDelivered(t *testing.T) {
	h := newHarness(t, sim.Config{}, Config{}, throttle.Config{})
	var chunks [][]string
	for range 12 {
		chunks = append(chunks, h.add("key-a", ev{Device: "device-1"}, ev{Device: "device-2"}, ev{User: "user-1"}, ev{Device: "device-1", Pad: 200}))
	}
	// Closed, the spool has every chunk in spool.db; flip bytes inside
	// chunk 5's second record, as a bad sector would.
	if err := h.sp.Close(); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(h.dir, "spool.db")
	b, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(b, []byte(chunks[5][1]))
	if at < 0 || bytes.Contains(b[at+1:], []byte(chunks[5][1])) {
		t.Fatalf("event %s found %d times in spool.db, want once", chunks[5][1], bytes.Count(b, []byte(chunks[5][1])))
	}
	for i := range 8 {
		b[at+i] ^= 0x5a
	}
	if err := os.WriteFile(db, b, 0o600); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	h.sp, err = spool.Open(spool.Config{Dir: h.dir, NoSync: true, MinFreeBytes: -1}, zap.New(core), h.reg)
	if err != nil {
		t.Fatal(err)
	}
	h.lanes = map[string]*spool.Lane{}
	h.p, err = New(h.cfg, local(h.sp), h.send, h.thr, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	h.start()
	h.waitDrained(3*time.Minute, 0)
	h.stop()

	// The flipped record's insert_id is no longer its own: forget it, and
	// expect the chunk's other records as dead letters.
	damaged := map[string]bool{}
	for _, id := range chunks[5] {
		damaged[id] = true
	}
	h.mu.Lock()
	delete(h.appended, chunks[5][1])
	h.mu.Unlock()
	dead := h.check(nil)
	if len(dead) != len(chunks[5]) {
		t.Errorf("%d dead letters, want the %d records of the damaged chunk", len(dead), len(chunks[5]))
	}
	for id, d := range dead {
		if d.Reason != "damaged" {
			t.Errorf("dead letter %s: reason %q, want damaged", id, d.Reason)
		}
		if _, known := h.appended[id]; known && !damaged[id] {
			t.Errorf("dead letter %s is not of the damaged chunk", id)
		}
	}
	for _, id := range chunks[5] {
		if id == chunks[5][1] {
			continue
		}
		if _, ok := dead[id]; !ok {
			t.Errorf("record %s of the damaged chunk is no dead letter", id)
		}
	}
	if n := h.metric("relay_spool_damaged_records_total", "file", "db"); n != float64(len(chunks[5])) {
		t.Errorf("relay_spool_damaged_records_total{file=db} = %v, want %d", n, len(chunks[5]))
	}
	if n := logs.FilterMessageSnippet("failed its checksum").Len(); n != 1 {
		t.Errorf("%d log lines for the damaged chunk, want 1", n)
	}
}
