// Package porttest picks free TCP ports of 127.0.0.1 for servers that a
// test or a benchmark starts later, and may restart on the same port.
//
// The ports are below the kernel's ephemeral range (32768-60999 by
// default): a port the kernel picked for 127.0.0.1:0 can be handed out
// again, to another test's listener or to any outgoing connection, between
// its release here and the server's bind (go test runs packages in
// parallel), and the server would then fail to start. Ports below the range
// are never handed out by the kernel; only another explicit bind can take
// one. Where the range leaves too little room below it, the kernel picks.
package porttest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
)

// low is the lowest port drawn, above the ports services commonly use.
const low = 10000

// Free returns n distinct ports of 127.0.0.1 that nothing listened on when
// it returned.
func Free(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	high := ephemeralLow()
	ports := make([]int, 0, n)
	for try := 0; len(ports) < n; try++ {
		addr := "127.0.0.1:0"
		if high > low+1000 && try < 200*n {
			addr = fmt.Sprintf("127.0.0.1:%d", low+rand.IntN(high-low))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			if addr != "127.0.0.1:0" {
				continue // in use: draw again
			}
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), 32768 when it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil || lo <= 0 {
		return 32768
	}
	return lo
}
