package ingest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/spool"
)

// TestRejectLogsSampledAndKeyless: a flood of bad requests yields a handful of
// log lines, and no log line ever holds the api_key.
func TestRejectLogsSampledAndKeyless(t *testing.T) {
	const secret = "secret-api-key-4242"
	r := startRelay(t, Config{}, spool.Config{NoSync: true, MaxBytes: 4 << 10})
	// A second server on the same spool, with the observed logger.
	_, addr, logs := serveObserved(t, Config{}, r.sp)
	r.url = "http://" + addr

	for i := range 100 {
		r.post("/2/httpapi", []byte(fmt.Sprintf(`{"api_key":%q,"events":[{"user_id":"u%d"}]}`, secret, i)))
	}
	// Fill the spool so that spool errors are logged too.
	big := fmt.Sprintf(`{"user_id":"user-00001","event_type":"a","pad":"%s"}`, strings.Repeat("x", 1000))
	for range 20 {
		r.post("/2/httpapi", envelope(secret, "", big, big))
	}
	rejected := logs.FilterMessage("ingest request rejected").Len()
	if rejected == 0 || rejected > 10 { // 5 a second; the loop may straddle a tick
		t.Errorf("%d rejection log lines for 120 rejections, want 1..10", rejected)
	}
	for _, e := range logs.All() {
		if s := fmt.Sprint(e.Message, e.ContextMap()); strings.Contains(s, secret) {
			t.Fatalf("log line holds the api_key: %s", s)
		}
	}
}
