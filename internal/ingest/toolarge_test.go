package ingest

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/spool"
)

// An event that cannot fit alone in one upstream request (with the envelope,
// as rewritten for the spool) is refused with 413 naming its index, and
// nothing of its request is spooled; one that just fits is taken.
func TestEventTooLargeForOneRequest(t *testing.T) {
	const limit = 4000
	r := startRelay(t, Config{MaxBatchBytes: limit}, spool.Config{})
	overhead := event.EnvelopeOverhead("key", []byte(`{"min_id_length":3}`))
	event := func(id string, size int) string {
		head := fmt.Sprintf(`{"event_type":"e","device_id":"dev-1","insert_id":%q,"time":1,"event_properties":{"p":"`, id)
		return head + strings.Repeat("x", size-len(head)-3) + `"}}`
	}
	// Rewriting adds nothing to an event with insert_id and time: its size
	// is as sent.
	fits := event("fits", limit-overhead-1)
	big := event("big", limit-overhead)
	for _, tc := range []struct {
		events  []string
		status  int
		tooBig  []int
		spooled int64
	}{
		{[]string{fits}, 200, nil, 1},
		{[]string{event("a", 100), big, event("b", 100), big}, 413, []int{1, 3}, 0},
		{[]string{event("c", 3_000_000)}, 413, []int{0}, 0}, // the 3 MB event
	} {
		body := `{"api_key":"key","events":[` + strings.Join(tc.events, ",") + `],"options":{"min_id_length":3}}`
		before := laneRecords(r)
		a := r.post("/2/httpapi", []byte(body))
		if a.status != tc.status {
			t.Fatalf("%d events: status %d %s, want %d", len(tc.events), a.status, a.body, tc.status)
		}
		if tc.status == 413 {
			var got struct {
				Code  int    `json:"code"`
				Error string `json:"error"`
				Big   []int  `json:"events_too_large"`
			}
			if err := json.Unmarshal(a.body, &got); err != nil || got.Code != 413 || got.Error != "Payload too large" || fmt.Sprint(got.Big) != fmt.Sprint(tc.tooBig) {
				t.Fatalf("body %s (%v)", a.body, err)
			}
		}
		if n := laneRecords(r) - before; n != tc.spooled {
			t.Fatalf("spooled %d records, want %d", n, tc.spooled)
		}
	}
}

func laneRecords(r *testRelay) int64 {
	var n int64
	for _, l := range r.sp.Lanes() {
		n += l.Stats().Records
	}
	return n
}
