package main

import (
	"fmt"
	"net"
	"strings"
)

// notifier sends systemd's readiness notifications (sd_notify(3)): a
// datagram of "KEY=value" lines to the unix socket named by NOTIFY_SOCKET,
// which systemd sets for a Type=notify unit. Without it every call is a
// no-op. Written out here rather than taken from a library: it is one
// datagram.
type notifier struct {
	addr string // NOTIFY_SOCKET; "" means not under systemd
}

// notify sends state, e.g. "READY=1". An abstract socket is named with a
// leading '@'.
func (n notifier) notify(state string) error {
	if n.addr == "" {
		return nil
	}
	addr := n.addr
	if strings.HasPrefix(addr, "@") {
		addr = "\x00" + addr[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	return nil
}
