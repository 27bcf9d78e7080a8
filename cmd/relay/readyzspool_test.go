package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/diskfulltest"
	"github.com/svcrelay/relay/internal/polltest"
)

// TestReadyzCheckpointsFail: with the disk reserve off (--spool-min-free-bytes
// 0) and the upstream unreachable, a disk that fills up at run time makes
// the spool's checkpoints fail; once ingest answers 503 (Spool full: the
// memory bound of what checkpoints could not move; or, had the WAL's
// segment run out first, no space for a new one), /readyz is 503 naming
// why, and it is ready again (and ingest takes requests) once space
// returns. On a real full filesystem: a small tmpfs mounted by the test,
// skipped where mounting is not allowed.
func TestReadyzCheckpointsFail(t *testing.T) {
	t.Parallel() // its own tmpfs, relay and ports; no signals
	mnt := diskfulltest.Tmpfs(t, "64m", "internal/spool's TestRefusingWhileCheckpointsFail covers the spool's side")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close() // nothing listens: nothing is delivered, the spool only grows
	// Registered after the unmount's cleanup: runs before it.
	r := startServe(t, "--ingest-url", down, "--data-dir", filepath.Join(mnt, "data"))

	post := func(events, pad int) (int, string) {
		t.Helper()
		evs := make([]string, events)
		for i := range evs {
			evs[i] = fmt.Sprintf(`{"event_type":"e","device_id":"device-%d","event_properties":{"pad":%q}}`, i, strings.Repeat("x", pad))
		}
		resp, err := http.Post(r.ingest+"/2/httpapi", "application/json", strings.NewReader(`{"api_key":"k","events":[`+strings.Join(evs, ",")+`]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	if code, body := post(1, 10); code != 200 { // the WAL's first segment is allocated
		t.Fatalf("first ingest %d %s", code, body)
	}
	if code, body := getBody(t, r.admin+"/readyz"); code != 200 {
		t.Fatalf("/readyz before the disk fills: %d %q", code, body)
	}
	filler := filepath.Join(mnt, "filler")
	diskfulltest.Fill(t, filler)

	// 200 KB requests (100 events of 2 KB) until ingest refuses one: the
	// write-ahead log's segment has room, spool.db does not; the default
	// memory bound of what checkpoints could not move is 16 MiB.
	var code int
	var body string
	n := 0
	for ; n < 200; n++ {
		if code, body = post(100, 2000); code != 200 {
			break
		}
		time.Sleep(5 * time.Millisecond) // let checkpoints run (and fail)
	}
	if code != 503 {
		t.Fatalf("after %d requests taken on a full disk: %d %s, want 503", n, code, body)
	}
	t.Logf("%d requests taken on a full disk, then %d %s", n, code, body)
	if code, body := getBody(t, r.admin+"/readyz"); code != 503 || !strings.Contains(body, "no space left") ||
		!strings.Contains(body, "checkpoints fail") && !strings.Contains(body, "write-ahead log segment") {
		t.Fatalf("/readyz %d %q while ingest answers 503: want 503 naming the failing checkpoints (or the WAL's segment) and the lack of space", code, body)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	polltest.Until(t, "/readyz 200 once space returned", func() bool {
		code, body = getBody(t, r.admin+"/readyz")
		return code == 200
	})
	if code, body := post(100, 2000); code != 200 {
		t.Fatalf("ingest %d %s once ready again", code, body)
	}
}

// TestNotReadyBeforeIngestListens: the admin listener, and so /readyz, is
// up before the ingest listener is bound; until it is, the relay is not
// ready (a load balancer, or a test, that saw 200 would have its first
// request refused).
func TestNotReadyBeforeIngestListens(t *testing.T) {
	s := &server{}
	s.spoolOpen.Store(true)
	if err := s.ready(nil); err == nil || !strings.Contains(err.Error(), "ingest listener not open yet") {
		t.Fatalf("ready before the ingest listener is bound: %v", err)
	}
}
