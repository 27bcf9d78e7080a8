package spool

import (
	"context"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

// TestIdleTrim: pages the writer's commits touched leave the RSS once the
// writer has been idle for a moment, even when the last trim was recent.
func TestIdleTrim(t *testing.T) {
	ctx := context.Background()
	s := openTest(t, Config{Dir: t.TempDir(), NoSync: true, CompactMinFileBytes: -1})
	l := mustLane(t, s, testKey(1))
	time.Sleep(3 * idleFreelistDelay) // the open's own trim done first; a late one only raises base
	base := rssFileKiB(t)
	var b storage.Batch
	var peak int64
	for i := range 64 {
		b.Reset()
		for j := range 100 {
			b.Add(rec(1, i*100+j, 5000))
		}
		if err := s.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
		peak = max(peak, rssFileKiB(t))
	}
	after, idle := rssFileKiB(t), int64(0)
	polltest.Until(t, "the file-backed RSS back within 1 MiB of its start", func() bool {
		idle = rssFileKiB(t)
		return idle-base <= 1<<10
	})
	t.Logf("file-backed RSS: %d KiB before, peak %d, after the appends %d, idle %d", base, peak, after, idle)
}
