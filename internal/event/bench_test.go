package event

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// processCPU is the process's CPU time in ns (user+system): on a loaded
// machine a steadier figure than wall time for these single-goroutine,
// allocation-free loops.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// sdkEvent (a copy of internal/ingest's, which BenchmarkHandle uses) is the i-th of a set of events shaped as the official SDKs send
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

// BenchmarkParseSDK parses 100 SDK-shaped events (sdkEvent) per request.
func BenchmarkParseSDK(b *testing.B) {
	const n = 100
	evs := make([]string, n)
	for i := range evs {
		evs[i] = sdkEvent(i)
	}
	body := []byte(envelope(evs...))
	b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
		var req Request
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		cpu0 := processCPU()
		for b.Loop() {
			if err := Parse(body, &req); err != nil {
				b.Fatal(errJSON(err))
			}
		}
		b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
	})
}

func BenchmarkParse(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		body := []byte(envelope(realisticEvents(n)...))
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			var req Request
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			cpu0 := processCPU()
			for b.Loop() {
				if err := Parse(body, &req); err != nil {
					b.Fatal(errJSON(err))
				}
			}
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
		})
	}
}

func BenchmarkAppendRewritten(b *testing.B) {
	body := []byte(envelope(realisticEvents(100)...))
	var req Request
	if err := Parse(body, &req); err != nil {
		b.Fatal(errJSON(err))
	}
	ids := NewIDGen()
	ip := []byte("192.0.2.7")
	dst := make([]byte, 0, 1024)
	b.ReportAllocs()
	b.SetBytes(int64(len(req.Events[0].Raw)))
	i := 0
	cpu0 := processCPU()
	for b.Loop() {
		dst = req.Events[i%len(req.Events)].AppendRewritten(dst[:0], ids, 1700000000000, ip)
		i++
	}
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}

func BenchmarkIDGenAppend(b *testing.B) {
	g := NewIDGen()
	dst := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		dst = g.Append(dst[:0])
	}
}

func BenchmarkIDGenAppendParallel(b *testing.B) {
	g := NewIDGen()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]byte, 0, 64)
		for pb.Next() {
			dst = g.Append(dst[:0])
		}
	})
}

// BenchmarkAppendRewrittenFill rewrites events that need an insert_id and a
// time filled in (as the SDKs send them), with the time as an int64 (one
// formatting per event) and as text formatted once (AppendRewrittenMS).
func BenchmarkAppendRewrittenFill(b *testing.B) {
	evs := realisticEvents(100)
	drop := regexp.MustCompile(`"(insert_id|time)":("[^"]*"|[0-9]+),`)
	for i, e := range evs {
		evs[i] = drop.ReplaceAllString(e, "")
	}
	body := []byte(envelope(evs...))
	var req Request
	if err := Parse(body, &req); err != nil {
		b.Fatal(errJSON(err))
	}
	if req.Events[0].HasTime || req.Events[0].HasInsertID {
		b.Fatal("the events have a time or insert_id")
	}
	ids := NewIDGen()
	ip := []byte("192.0.2.7")
	dst := make([]byte, 0, 1024)
	for _, text := range []bool{false, true} {
		b.Run(fmt.Sprintf("text=%v", text), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			nowText := strconv.AppendInt(nil, 1700000000000, 10)
			cpu0 := processCPU()
			for b.Loop() {
				e := &req.Events[i%len(req.Events)]
				if text {
					dst = e.AppendRewrittenMS(dst[:0], ids, nowText, ip)
				} else {
					dst = e.AppendRewritten(dst[:0], ids, 1700000000000, ip)
				}
				i++
			}
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
