package main

import (
	"fmt"
	"syscall"
	"time"

	"github.com/svcrelay/relay/internal/upstream"
)

// readyMargin is the room under the spool quota and above the disk reserve
// below which /readyz says not ready: ingest refuses a request whose data
// does not fit, and with less than this left it refuses most of them.
const readyMargin = 64 << 10

// ingestRefusal returns why ingest would answer 503 now, nil when it would
// take a request of ordinary size: the spool quota (live bytes within
// readyMargin of maxBytes) or the disk reserve (the data dir's free space
// within readyMargin of minFree). maxBytes or minFree 0 disables its check.
// (The lane limit of --max-lanes belongs here too.)
func ingestRefusal(liveBytes, maxBytes int64, dataDir string, minFree int64) error {
	// A quota under twice the margin (tests, toys) keeps half of it as margin.
	if maxBytes > 0 && liveBytes > maxBytes-min(readyMargin, maxBytes/2) {
		return fmt.Errorf("spool quota reached (%d of %d bytes, --spool-max-bytes): ingest answers 503 until delivery drains it", liveBytes, maxBytes)
	}
	if minFree > 0 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dataDir, &st); err != nil {
			return fmt.Errorf("free disk space of %s unknown: %w", dataDir, err)
		}
		if free := int64(st.Bavail) * int64(st.Bsize); free < minFree+readyMargin {
			return fmt.Errorf("free disk space %d bytes is below the reserve of %d (--spool-min-free-bytes): ingest answers 503", free, minFree)
		}
	}
	return nil
}

// upstreamInfo is /readyz's line about the upstream, from the outcome of the
// latest upstream request: reachable (an HTTP answer came, whatever its
// status) or not. It never changes /readyz's status: a relay whose upstream
// is down still accepts and spools, which is its purpose.
func upstreamInfo(c *upstream.Client, now time.Time) string {
	o, ok := c.Last()
	if !ok {
		return "upstream: unknown (no request sent yet)\n"
	}
	ago := now.Sub(o.At).Round(time.Second)
	if o.Reached {
		return fmt.Sprintf("upstream: reachable (last answer %s, %s ago)\n", o.Status, ago)
	}
	return fmt.Sprintf("upstream: unreachable (last request: %s, %s ago)\n", o.Status, ago)
}
