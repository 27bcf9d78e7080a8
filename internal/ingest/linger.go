package ingest

// Closing connections at Shutdown, and lingering.
//
// fasthttp's own Shutdown waits for a connection that never sent a request,
// or a keep-alive one waiting for its next, until its read or idle timeout:
// one silent client holds the stop for a minute. So the Server tracks the
// state of each connection (connState, Server.tracked), and Shutdown closes
// those on which no request is being handled or answered. (fasthttp's
// StateActive cannot tell busy from silent: it fires for a new connection
// before any byte arrives.)
//
// fasthttp closes a connection right after answering a request it could not
// read whole (a body over MaxRequestBodySize is answered 413 from its
// Content-Length alone), while the client is still sending the body. Closing
// a TCP socket with unread data makes the kernel send RST, and the client
// then sees "connection reset by peer", usually on its write, instead of the
// answer: an SDK whose batch is too large retries it forever instead of
// splitting it. So the Server closes the TCP connections it accepts the way
// net/http does after a request whose body it did not read (its
// closeWriteAndWait), but reading: it lingers. It half-closes the connection
// (CloseWrite: the answer and a FIN go out), reads and discards what the peer
// still sends until the peer closes its side, lingerTimeout passes or
// lingerLimit bytes were read, and only then closes it.
//
// Invariants:
//
//   - Once Shutdown has started, a connection that is or becomes new or idle
//     is closed at once; one whose request reached the handler is never
//     closed by the Server before its answer was written (StateIdle). A
//     request still being read when Shutdown starts is cut off.
//   - fasthttp's messages caused by the Server's own closing (net.ErrClosed
//     once Shutdown started) are not logged: every stop with an idle client
//     would log one.
//   - A request read on a connection the Server closed does not reach the
//     handler: it is answered 503 on the closed connection, so nothing is
//     spooled for a client that cannot get its answer.
//   - A connection fasthttp closes lingers (see above) unless the peer
//     already closed or reset it (a read returned EOF or an error other
//     than a timeout; a write failed), Shutdown has started, or maxLingering
//     connections linger already; then it is closed at once. A linger lasts
//     at most lingerTimeout, and usually one round trip: a client closes
//     once it read the answer and the FIN. Only *net.TCPConn connections
//     linger; others are served unwrapped.
//   - Once Shutdown has started, no connection starts lingering: every
//     connection closed then either had no request in the handler (cut off,
//     as above) or had its request read whole before the handler, so a
//     plain close resets nothing the client still waits for. Connections
//     already lingering finish their linger; Shutdown waits for them (at most
//     lingerTimeout more) and, if its ctx ends first, closes them at once.

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

const (
	// lingerTimeout bounds a linger: net/http's rstAvoidanceDelay.
	lingerTimeout = 500 * time.Millisecond
	// maxLingering bounds the connections lingering at once; past it a
	// connection is closed at once (a flood of refused requests must not
	// hold descriptors for the linger).
	maxLingering = 1024
)

// waitLingering waits until no connection lingers or ctx ends; then it
// closes the lingering connections, waits for their goroutines to end, and
// returns ctx's error. No linger starts once closing is set, so none is
// added to s.lingers while it is waited for.
func (s *Server) waitLingering(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.lingers.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	for c := range s.lingering {
		c.tcp.Close() // fails the linger's read
	}
	s.mu.Unlock()
	<-done
	return ctx.Err()
}

// busy marks the connection of ctx busy until StateIdle (the answer is
// written after the handler returns), unless Shutdown closed it before its
// request reached the handler: then it answers 503 and returns false.
func (s *Server) busy(ctx *fasthttp.RequestCtx) bool {
	c := ctx.Conn()
	if c == nil {
		return true
	}
	s.mu.Lock()
	_, open := s.tracked[c]
	if open {
		s.tracked[c] = true
	}
	closed := !open && s.closing.Load()
	s.mu.Unlock()
	if closed {
		ctx.Error("shutting down", fasthttp.StatusServiceUnavailable)
	}
	return !closed
}

// lingerConn is an accepted TCP connection whose Close lingers. It does not
// embed *net.TCPConn, so that every read and write goes through Read and
// Write (no promoted ReadFrom or WriteTo). It lacks the methods fasthttp's
// TCPKeepalive needs, which the Server leaves off.
type lingerConn struct {
	net.Conn // tcp
	tcp      *net.TCPConn
	s        *Server

	peerGone atomic.Bool // a read saw EOF or a reset, or a write failed: nothing to linger for
	closed   atomic.Bool // Close was called
}

func (c *lingerConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && errorClass(err) != classTimeout {
		c.peerGone.Store(true)
	}
	return n, err
}

func (c *lingerConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil {
		c.peerGone.Store(true)
	}
	return n, err
}

// Close closes the connection, at once or after a linger, and returns
// without waiting for the linger. Only the first call closes; later ones
// return an error wrapping net.ErrClosed.
func (c *lingerConn) Close() error {
	if c.closed.Swap(true) {
		return &net.OpError{Op: "close", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: net.ErrClosed}
	}
	if c.peerGone.Load() || !c.s.startLinger(c) {
		return c.tcp.Close()
	}
	go c.s.linger(c)
	return nil
}

// closeNow closes c without lingering, and leaves it as it is if it is
// already closed or lingering: the Server's own closing of waiting
// connections, with s.mu held (which Close, through startLinger, takes).
func closeNow(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn() // no close_notify: its write could wait with s.mu held
	}
	lc, ok := c.(*lingerConn)
	if !ok {
		c.Close()
	} else if !lc.closed.Swap(true) {
		lc.tcp.Close()
	}
}

// startLinger half-closes c and registers it as lingering, and reports
// whether it did; it does not when Shutdown has started or maxLingering
// connections linger already.
func (s *Server) startLinger(c *lingerConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() || len(s.lingering) >= maxLingering {
		return false
	}
	// The answer is written (fasthttp flushes before it closes): CloseWrite
	// sends the FIN after it.
	if c.tcp.CloseWrite() != nil || c.tcp.SetReadDeadline(time.Now().Add(s.lingerFor)) != nil {
		return false
	}
	s.lingering[c] = struct{}{}
	s.lingers.Add(1)
	return true
}

// linger discards what the peer of the half-closed c still sends until it
// closes its side, the read deadline set by startLinger passes, lingerLimit
// bytes were read or waitLingering closes c; then it closes c.
func (s *Server) linger(c *lingerConn) {
	io.CopyN(io.Discard, c.tcp, s.lingerLimit)
	c.tcp.Close()
	s.mu.Lock()
	delete(s.lingering, c)
	s.mu.Unlock()
	s.lingers.Done()
}
