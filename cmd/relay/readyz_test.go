package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/polltest"
)

func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestReadyzDiskReserve: /readyz is 503, naming the disk reserve, while
// ingest would refuse for it.
func TestReadyzDiskReserve(t *testing.T) {
	r := startServe(t, "--spool-min-free-bytes", "1000TB")
	code, body := getBody(t, r.admin+"/readyz")
	if code != 503 || !strings.Contains(body, "below the reserve") || !strings.Contains(body, "upstream: ") {
		t.Fatalf("/readyz %d %q: want 503 naming the disk reserve, and a word on the upstream", code, body)
	}
	resp, err := http.Post(r.ingest+"/2/httpapi", "application/json", strings.NewReader(`{"api_key":"k","events":[{"event_type":"e","device_id":"device-1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Fatalf("ingest answered %d while /readyz said the disk reserve refuses; want 503", resp.StatusCode)
	}
}

// TestReadyzQuota: /readyz turns 503 once the spool's quota is (nearly)
// used, while the upstream cannot be reached; its body says the upstream is
// unreachable, and the status does not depend on that.
func TestReadyzQuota(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close() // nothing listens: every delivery is refused
	r := startServe(t, "--ingest-url", down, "--spool-max-bytes", "100KB")
	if code, body := getBody(t, r.admin+"/readyz"); code != 200 || !strings.HasPrefix(body, "ready\n") {
		t.Fatalf("/readyz before ingest: %d %q", code, body)
	}
	var events []string
	for i := range 150 {
		events = append(events, fmt.Sprintf(`{"event_type":"e","device_id":"device-%d","event_properties":{"pad":"%s"}}`, i, strings.Repeat("x", 300)))
	}
	resp, err := http.Post(r.ingest+"/2/httpapi", "application/json", strings.NewReader(`{"api_key":"k","events":[`+strings.Join(events, ",")+`]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("ingest %d", resp.StatusCode)
	}
	var code int
	var body string
	polltest.Until(t, "a delivery attempt to fail", func() bool {
		code, body = getBody(t, r.admin+"/readyz")
		return strings.Contains(body, "upstream: unreachable")
	})
	if code != 503 || !strings.Contains(body, "spool quota reached") || !strings.Contains(body, "upstream: unreachable") {
		t.Fatalf("/readyz %d %q: want 503 naming the quota, and the upstream unreachable", code, body)
	}
}
