package ingest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/valyala/fasthttp"
)

// sdkEvent is the i-th of a set of events shaped as the official SDKs send
// them (bench/loadgen's -profile sdk, in short): no insert_id and no time
// (the relay fills both in), ip "$remote", nested event_properties and
// user_properties, ~300-700 bytes varying with i.
func sdkEvent(i int) string {
	var b strings.Builder
	b.WriteByte('{')
	if i%10 < 7 {
		fmt.Fprintf(&b, `"user_id":"user-%08d@example.com",`, i*7919%100000)
	}
	types := [...]string{"Product Viewed", "Page Viewed", "Search", "Button Clicked"}
	et := types[i%len(types)]
	fmt.Fprintf(&b, `"device_id":"%08x-f612-4926-836d-%012x","event_type":"%s",`, i*2654435761%(1<<32), i*40503, et)
	if i%8 > 0 {
		fmt.Fprintf(&b, `"session_id":%d,`, 1763699990000+int64(i%1000)*1000)
	}
	if i%3 == 0 {
		b.WriteString(`"platform":"iOS","os_name":"ios","os_version":"17.5.1","device_model":"iPhone15,2",`)
	} else {
		b.WriteString(`"platform":"Web","os_name":"Chrome","os_version":"131.0.0",`)
	}
	b.WriteString(`"language":"en-US","ip":"$remote",`)
	if i%3 == 0 {
		fmt.Fprintf(&b, `"app_version":"3.%d.0",`, i%12)
	}
	b.WriteString(`"event_properties":{`)
	switch et {
	case "Product Viewed":
		fmt.Fprintf(&b, `"product_id":"SKU-%06d","category":"garden","price":%d.99,"quantity":%d,"tags":["summer","sale"],`, i*31%1000000, i%300, 1+i%3)
	case "Page Viewed":
		fmt.Fprintf(&b, `"page_path":"/shoes/lorem-%d","page_title":"ipsum dolor","referrer":"https://www.example.org/",`, i%1000)
	case "Search":
		fmt.Fprintf(&b, `"query":"lorem ipsum","results":%d,"filters":{"category":"garden","in_stock":%t},`, i%200, i%2 == 0)
	default:
		fmt.Fprintf(&b, `"screen":"checkout","element_id":"btn-do-%d","position":%d,`, i%100, i%50)
	}
	if pad := (i * 37) % 200; pad >= 4 {
		fmt.Fprintf(&b, `"note":"%s",`, strings.Repeat("et ", pad/3))
	}
	fmt.Fprintf(&b, `"sent_us":%d},"user_properties":{"plan":"growth","signup_cohort":"2026-W%02d","beta":%t}}`,
		1795682223335742+int64(i), 1+i%52, i%5 == 0)
	return b.String()
}

// BenchmarkHandle measures the handler alone, in process (no HTTP, no
// client: every allocation counted is the relay's), on SDK-shaped events
// (sdkEvent), 1 and 100 per request, into a real spool under SyncNone whose
// lane a reader goroutine drains and acknowledges (its reads are counted
// too: the spool's hand-over is part of the accept path's cost). An op is
// one request answered 200; events=N gives per-event figures in
// bench/gobench.sh; cpu-ns/op is the process's CPU time per request.
func BenchmarkHandle(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("shape=sdk/events=%d", n), func(b *testing.B) {
			sp, err := spool.Open(spool.Config{Dir: b.TempDir(), Sync: spool.SyncNone, MinFreeBytes: -1}, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer sp.Close()
			s, err := New(Config{}, sp, event.NewIDGen(), nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			events := make([]string, n)
			for i := range events {
				events[i] = sdkEvent(i)
			}
			body := envelope("bench-api-key-0123456789abcdef", "", events...)
			lane, err := sp.Lane(context.Background(), spool.LaneKey{Kind: spool.KindEvents, APIKey: "bench-api-key-0123456789abcdef"})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			drained := make(chan struct{})
			go func() { // the lane's reader: read, release, acknowledge
				defer close(drained)
				var recs []spool.Record
				for {
					cs, more, err := lane.NextInto(ctx, 1<<20, recs)
					if err != nil {
						return
					}
					recs = more
					for _, c := range cs {
						c.Buffer().Release()
						sp.Ack(lane, c.Seq)
					}
				}
			}()
			defer func() { cancel(); <-drained }()

			remote := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1234}
			var req fasthttp.Request
			req.Header.SetMethod("POST")
			req.SetRequestURI("/2/httpapi")
			req.Header.SetContentType("application/json")
			req.SetBody(body)
			var rc fasthttp.RequestCtx
			h := s.Handler()
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			cpu0 := processCPU()
			b.ResetTimer()
			for range b.N {
				rc.Init(&req, remote, nil)
				h(&rc)
				if rc.Response.StatusCode() != 200 {
					b.Fatalf("answer %d %s", rc.Response.StatusCode(), rc.Response.Body())
				}
			}
			b.StopTimer()
			// The process's CPU (the handler, the WAL writer, the reader,
			// the GC) per request: what a loaded machine moves less than
			// the wall time of ns/op.
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is the process's CPU time in ns (user+system).
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
