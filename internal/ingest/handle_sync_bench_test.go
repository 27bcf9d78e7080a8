package ingest

import (
	"fmt"
	"testing"
)

// BenchmarkHandleSync is BenchmarkHandle under the setting, a
// spool fsynced per commit (--sync always), with 32 concurrent handlers as
// 32 connections (and with 1): the WAL writer's group commits, fdatasyncs
// and hand-offs are in its cpu-ns/op as they are in the relay's.
func BenchmarkHandleSync(b *testing.B) {
	for _, par := range []int{1, 32} {
		for _, n := range []int{1, 100} {
			b.Run(fmt.Sprintf("sync=always/events=%d/handlers=%d", n, par), func(b *testing.B) {
				benchHandle(b, false, n, par)
			})
		}
	}
}
