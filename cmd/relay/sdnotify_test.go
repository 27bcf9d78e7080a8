package main

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
)

// TestSDNotify: under systemd (NOTIFY_SOCKET set) the relay says READY=1
// once it serves and STOPPING=1 when it stops.
func TestSDNotify(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	r := startServe(t)
	read := func() string {
		t.Helper()
		buf := make([]byte, 4096)
		if err := conn.SetReadDeadline(time.Now().Add(polltest.Max)); err != nil {
			t.Fatal(err)
		}
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		return string(buf[:n])
	}
	if got := read(); !strings.HasPrefix(got, "READY=1\n") {
		t.Fatalf("first notification %q, want READY=1", got)
	}
	// The listeners answer by the time READY=1 is sent.
	if code, _ := getBody(t, r.admin+"/readyz"); code != 200 {
		t.Fatalf("/readyz %d after READY=1", code)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "STOPPING=1" {
		t.Fatalf("notification at stop %q, want STOPPING=1", got)
	}
}
