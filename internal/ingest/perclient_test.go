package ingest

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/tlsreload/tlstest"
)

// --max-connections-per-client.

const healthzReq = "GET /healthz HTTP/1.1\r\nHost: relay\r\n\r\n"

// dialFrom connects to addr from the local address from (127.0.0.0/8 is
// all loopback on Linux: 127.0.0.2 is another client than 127.0.0.1). It
// returns nil when the connection was reset during the dial (a server
// refusing it at accept can be that fast on loopback).
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 20 * time.Second}
	c, err := d.Dial("tcp", addr)
	if errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	if err != nil {
		t.Fatalf("dial from %s: %v", from, err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second)) // bounds every read
	return c
}

// servedFrom dials from and reports whether a /healthz request on the new
// connection was answered (see served).
func servedFrom(t *testing.T, from, addr string) bool {
	t.Helper()
	c := dialFrom(t, from, addr)
	return c != nil && served(t, c, bufio.NewReader(c))
}

// mustDialFrom is dialFrom for a connection that must be accepted.
func mustDialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	c := dialFrom(t, from, addr)
	if c == nil {
		t.Fatalf("connection from %s reset at once", from)
	}
	return c
}

// served sends a /healthz request on c and reports whether it was answered
// 200; false when the server closed (or reset) c without an answer. A
// server that does neither within the deadline fails the test.
func served(t *testing.T, c net.Conn, br *bufio.Reader) bool {
	t.Helper()
	io.WriteString(c, healthzReq) // may fail on a reset connection: the read says
	resp, err := http.ReadResponse(br, nil)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("connection neither answered nor closed")
	}
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("healthz: %d", resp.StatusCode)
	}
	return true
}

// TestMaxConnectionsPerClient: a client holding its share gets further
// connections closed at accept, without an answer, while another client is
// served; a closed connection gives its share back.
func TestMaxConnectionsPerClient(t *testing.T) {
	r := startRelay(t, Config{MaxConnectionsPerClient: 2}, spool.Config{NoSync: true})
	var held [2]net.Conn
	for i := range held {
		held[i] = mustDialFrom(t, "127.0.0.1", r.addr)
		if !served(t, held[i], bufio.NewReader(held[i])) {
			t.Fatalf("connection %d of 2 not served", i)
		}
	}
	if servedFrom(t, "127.0.0.1", r.addr) {
		t.Fatal("third connection of one client served; want it closed at accept")
	}
	if v := r.counter("relay_ingest_client_connection_refusals_total"); v != 1 {
		t.Errorf("relay_ingest_client_connection_refusals_total %v, want 1", v)
	}
	// Another client is served; the held connections too.
	other := mustDialFrom(t, "127.0.0.2", r.addr)
	if !served(t, other, bufio.NewReader(other)) {
		t.Fatal("another client's connection not served")
	}
	br0 := bufio.NewReader(held[0])
	if !served(t, held[0], br0) {
		t.Fatal("held connection no longer served")
	}
	if got := r.srv.perClient.clients(); got != 2 {
		t.Errorf("%d client addresses counted, want 2", got)
	}

	// Closing one gives its share back, once the server has seen the close
	// (fasthttp reports it from the connection's goroutine): retry, bounded.
	held[0].Close()
	polltest.Until(t, "a connection served after one of the client's two closed", func() bool {
		return servedFrom(t, "127.0.0.1", r.addr)
	})

	// Nothing is left counted once every connection is closed (the table
	// holds only clients with open connections).
	r.client.CloseIdleConnections()
	for _, c := range []net.Conn{held[1], other} {
		c.Close()
	}
	r.stop()
	// fasthttp reports a connection closed just after Shutdown may have
	// seen it gone: wait, bounded.
	polltest.Until(t, "no client address counted after every connection closed", func() bool {
		return r.srv.perClient.clients() == 0
	})
}

// TestMaxConnectionsPerClientTrustedProxy: a trusted proxy carries many
// clients and is not bounded; other peers are.
func TestMaxConnectionsPerClientTrustedProxy(t *testing.T) {
	r := startRelay(t, Config{
		MaxConnectionsPerClient: 1,
		TrustedProxies:          []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
	}, spool.Config{NoSync: true})
	checkUnbounded(t, r.addr, "trusted proxy", "127.0.0.1", "127.0.0.2")
}

// checkUnbounded checks a relay at addr bounded to one connection per
// client: three connections from the exempt peer (what) are all served;
// of the bounded peer's, the first is served and the second closed at
// accept.
func checkUnbounded(t *testing.T, addr, what, exempt, bounded string) {
	t.Helper()
	for i := range 3 {
		c := mustDialFrom(t, exempt, addr)
		if !served(t, c, bufio.NewReader(c)) {
			t.Fatalf("%s's connection %d not served", what, i)
		}
	}
	c := mustDialFrom(t, bounded, addr)
	if !served(t, c, bufio.NewReader(c)) {
		t.Fatalf("first connection of %s not served", bounded)
	}
	if servedFrom(t, bounded, addr) {
		t.Fatalf("second connection of %s served; want it closed at accept", bounded)
	}
}

// TestMaxConnectionsPerClientOff: 0 bounds nothing.
func TestMaxConnectionsPerClientOff(t *testing.T) {
	r := startRelay(t, Config{}, spool.Config{NoSync: true})
	if r.srv.perClient != nil {
		t.Fatal("per-client count kept with the bound off")
	}
	for i := range 4 {
		c := mustDialFrom(t, "127.0.0.1", r.addr)
		if !served(t, c, bufio.NewReader(c)) {
			t.Fatalf("connection %d not served", i)
		}
	}
}

// fakeConn is a net.Conn with a remote address only.
type fakeConn struct {
	net.Conn
	remote net.Addr
}

func (f fakeConn) RemoteAddr() net.Addr { return f.remote }

func tcpPeer(s string) net.Conn {
	return fakeConn{remote: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s))}
}

// TestClientConnsKeys: which connections count as one client.
func TestClientConnsKeys(t *testing.T) {
	cc := newClientConns(2, []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")})
	take := func(peer string) bool { t.Helper(); return cc.take(tcpPeer(peer)) }

	// IPv6: one client per /64.
	if !take("[2001:db8::1]:1") || !take("[2001:db8::ffff:2]:2") {
		t.Fatal("first two connections of a /64 refused")
	}
	if take("[2001:db8::3]:3") {
		t.Error("third connection of one /64 taken")
	}
	if !take("[2001:db8:0:1::1]:1") {
		t.Error("the next /64 shares the first's count")
	}
	// IPv4, also mapped into IPv6.
	if !take("192.0.2.1:1") || !take("[::ffff:192.0.2.1]:2") {
		t.Fatal("first two connections of an IPv4 client refused")
	}
	if take("192.0.2.1:3") {
		t.Error("an IPv4-mapped address counted apart from its IPv4 form")
	}
	if !take("192.0.2.2:1") {
		t.Error("a neighbour IPv4 address shares the count")
	}
	// Trusted proxies and connections without a TCP peer are not counted.
	for range 5 {
		if !take("10.9.1.1:1") {
			t.Fatal("trusted proxy bounded")
		}
		if !cc.take(fakeConn{remote: &net.UnixAddr{Name: "@x", Net: "unix"}}) {
			t.Fatal("non-TCP connection bounded")
		}
	}
	if got := cc.clients(); got != 4 {
		t.Errorf("%d clients counted, want 4", got)
	}
	// Releasing frees the share and, at zero, the entry.
	cc.release(tcpPeer("[2001:db8::7]:9"))
	if !take("[2001:db8::8]:1") {
		t.Error("share not given back by release")
	}
	for _, p := range []string{"[2001:db8::1]:1", "[2001:db8::2]:1", "[2001:db8:0:1::1]:1", "192.0.2.1:1", "192.0.2.1:2", "192.0.2.2:1", "10.9.1.1:1"} {
		cc.release(tcpPeer(p))
	}
	cc.release(tcpPeer("192.0.2.99:1")) // never taken: no effect
	if got := cc.clients(); got != 0 {
		t.Errorf("%d clients counted after every release, want 0", got)
	}
}

// TestMaxConnectionsPerClientTLS: over TLS the bound holds too (a refused
// connection gets no handshake), and a closed TLS connection gives its
// share back (fasthttp reports the *tls.Conn, not the TCP connection).
func TestMaxConnectionsPerClientTLS(t *testing.T) {
	rl, certFile, _ := selfSignedReloader(t)
	roots := x509.NewCertPool()
	tlstest.Trust(t, roots, certFile)
	r := startRelay(t, Config{TLS: rl.TLSConfig(), MaxConnectionsPerClient: 2}, spool.Config{NoSync: true})

	// open returns a served TLS connection, or nil when the server closed
	// it without an answer (at accept: the handshake fails).
	open := func() *tls.Conn {
		t.Helper()
		raw := dialFrom(t, "127.0.0.1", r.addr)
		if raw == nil {
			return nil
		}
		c := tls.Client(raw, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
		if err := c.Handshake(); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("handshake neither done nor refused")
			}
			return nil
		}
		if !served(t, c, bufio.NewReader(c)) {
			return nil
		}
		return c
	}
	waitCounted := func(want int) {
		t.Helper()
		polltest.Until(t, fmt.Sprintf("%d client addresses counted", want), func() bool {
			return r.srv.perClient.clients() == want
		})
	}

	a, b := open(), open()
	if a == nil || b == nil {
		t.Fatal("first two TLS connections not served")
	}
	if open() != nil {
		t.Fatal("third TLS connection of one client served")
	}
	a.Close()
	b.Close()
	waitCounted(0)
	// Shares come back: more connections, one after the other, than the bound.
	for i := range 5 {
		c := open()
		if c == nil {
			t.Fatalf("TLS connection %d (one at a time) not served", i)
		}
		c.Close()
		waitCounted(0)
	}
}

// TestMaxConnectionsPerClientLog: a refusal is logged with the client's
// address, anonymized under AnonymizeIP.
func TestMaxConnectionsPerClientLog(t *testing.T) {
	for _, tc := range []struct {
		anon bool
		want string
	}{{false, "127.0.0.1"}, {true, "127.0.0.0"}} {
		r := startRelay(t, Config{}, spool.Config{NoSync: true})
		// A second server on the same spool, with the observed logger.
		cfg := Config{MaxConnectionsPerClient: 1}
		cfg.AnonymizeIP = tc.anon
		srv, addr, logs := serveObserved(t, cfg, r.sp)
		held := mustDialFrom(t, "127.0.0.1", addr)
		if !served(t, held, bufio.NewReader(held)) {
			t.Fatal("first connection not served")
		}
		if servedFrom(t, "127.0.0.1", addr) {
			t.Fatal("second connection served")
		}
		srv.Shutdown(t.Context())
		lines := logs.FilterMessage("ingest connection closed: its client holds --max-connections-per-client").All()
		if len(lines) != 1 {
			t.Fatalf("anonymize %v: %d refusal log lines, want 1", tc.anon, len(lines))
		}
		if got := lines[0].ContextMap()["client"]; got != tc.want {
			t.Errorf("anonymize %v: client %v in the log, want %s", tc.anon, got, tc.want)
		}
	}
}

// TestMaxConnectionsPerClientUnboundedPeers: Config.UnboundedPeers are not
// bounded (the relay gives loopback); other peers are.
func TestMaxConnectionsPerClientUnboundedPeers(t *testing.T) {
	r := startRelay(t, Config{
		MaxConnectionsPerClient: 1,
		UnboundedPeers:          []netip.Prefix{netip.MustParsePrefix("::ffff:127.0.0.2/128")}, // 4-in-6: compared unmapped
	}, spool.Config{NoSync: true})
	checkUnbounded(t, r.addr, "unbounded peer", "127.0.0.2", "127.0.0.1")
}
