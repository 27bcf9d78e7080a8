package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestLoopbackNotBoundedPerClient: the relay bounds connections per remote
// client only; processes of its own host (loopback) are not bounded, so a
// local proxy, an app beside a sidecar or a load test is not cut at
// --max-connections-per-client.
func TestLoopbackNotBoundedPerClient(t *testing.T) {
	r := startServe(t, "--max-connections-per-client", "1")
	addr := strings.TrimPrefix(r.ingest, "http://")
	for i := range 3 {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close() // held open: kept-alive connections of one client
		c.SetDeadline(time.Now().Add(20 * time.Second))
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: relay\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("loopback connection %d of a bound of 1: %v", i+1, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("loopback connection %d: %d", i+1, resp.StatusCode)
		}
	}
}
