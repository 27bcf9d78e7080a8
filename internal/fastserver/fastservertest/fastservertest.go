// Package fastservertest is a raw HTTP/1.1 client for tests of servers
// wrapped by fastserver: it sends a body over the server's limit while it
// reads the answer, as Go's http.Transport does, to check that the client
// gets the whole 413 instead of a reset. It is imported by tests only (those
// of fastserver and of ingest, the latter over TLS).
package fastservertest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Dial connects to addr with a small send buffer (32 KiB: the kernels
// cannot take a large body before the server's close, so the client is
// still writing then) and a deadline of d on every read and write.
func Dial(addr string, d time.Duration) (*net.TCPConn, error) {
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)
	tc.SetWriteBuffer(32 << 10)
	tc.SetDeadline(time.Now().Add(d))
	return tc, nil
}

// PostOversized sends on c a POST of path with a body of size bytes,
// writing in a goroutine while it reads the answer. It returns an error
// unless the answer has status status and a body containing want, and the
// whole body was written. It returns once the writer ended: c's deadline
// bounds the wait. The caller closes c.
func PostOversized(c net.Conn, path string, size, status int, want string) error {
	wrote := make(chan error, 1)
	go func() {
		if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", path, size); err != nil {
			wrote <- err
			return
		}
		chunk := make([]byte, 16<<10)
		for sent := 0; sent < size; sent += len(chunk) {
			if _, err := c.Write(chunk); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	resp, rerr := http.ReadResponse(bufio.NewReader(c), nil)
	var body []byte
	if rerr == nil {
		body, rerr = io.ReadAll(resp.Body)
	}
	werr := <-wrote
	switch {
	case rerr != nil:
		return fmt.Errorf("read answer: %w (body write: %v)", rerr, werr)
	case resp.StatusCode != status || !strings.Contains(string(body), want):
		return fmt.Errorf("answer %d %q, want %d %q", resp.StatusCode, body, status, want)
	case werr != nil:
		// A client that writes its whole body before it reads sees only
		// this: the reset, not the answer.
		return fmt.Errorf("answer read, but the body write failed: %w", werr)
	}
	return nil
}

// Repeat calls post n times, or as many as fit in 30 s on a slow machine,
// and fails t if any call failed, naming how many and the first error.
func Repeat(t testing.TB, n int, post func() error) {
	t.Helper()
	var failed, tried int
	var first error
	for stop := time.Now().Add(30 * time.Second); tried < n && time.Now().Before(stop); tried++ {
		if err := post(); err != nil {
			if failed++; first == nil {
				first = err
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d clients did not get the whole answer with their body written; first: %v", failed, tried, first)
	}
}
