// Package benchtest holds what the relay's Go benchmarks share: the
// SDK-shaped events they measure on and the process's CPU time, which on a
// loaded machine is a steadier figure than wall time. Test and benchmark
// code only: the relay binary does not depend on it.
package benchtest

import (
	"fmt"
	"strings"
	"syscall"
)

// SDKEvent is the i-th of a set of events shaped as the official SDKs send
// them (bench/loadgen's -profile sdk, in short): no insert_id and no time
// (the relay fills both in), ip "$remote", nested event_properties and
// user_properties, ~300-700 bytes varying with i.
func SDKEvent(i int) string {
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

// ProcessCPU is the process's CPU time in ns (user+system).
func ProcessCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
