// Package fastserver is a fasthttp server that shuts down promptly and closes
// connections without resetting them.
//
// fasthttp's own Shutdown waits for every open connection, and it counts a
// connection that was accepted but never sent a request, or a keep-alive
// connection waiting for its next request, as open until its read or idle
// timeout: one silent client holds the stop for a minute. A Server tracks the
// state of each connection and closes, at Shutdown, every connection on which
// no request is being handled or answered; requests in their handler still
// finish (up to Shutdown's context), and their connections are closed after
// the answer. (fasthttp's StateActive cannot tell busy from silent: it fires
// for a new connection before any byte arrives.)
//
// fasthttp closes a connection right after answering a request it could not
// read whole (a body over MaxRequestBodySize is answered 413 from its
// Content-Length alone), while the client is still sending the body. Closing
// a TCP socket with unread data makes the kernel send RST, and the client
// then sees "connection reset by peer", usually on its write, instead of the
// answer: an SDK whose batch is too large retries it forever instead of
// splitting it. So a Server closes the TCP connections it accepts the way
// net/http does after a request whose body it did not read (its
// closeWriteAndWait), but reading: it lingers. It half-closes the connection
// (CloseWrite: the answer and a FIN go out), reads and discards what the peer
// still sends until the peer closes its side, lingerTimeout passes or
// lingerLimit bytes were read, and only then closes it.
//
// # Invariants
//
//   - Once Shutdown has started, a connection that is or becomes new or idle
//     is closed at once; one whose request reached the handler is never
//     closed by the Server before its answer was written (StateIdle). A
//     request still being read when Shutdown starts is cut off.
//   - fasthttp's "error when serving connection" messages caused by the
//     Server's own closing (net.ErrClosed once Shutdown started) are not
//     passed to srv.Logger: every stop with an idle client would log one.
//   - A request read on a connection the Server closed does not reach the
//     wrapped handler: it is answered 503 on the closed connection, so a
//     handler with side effects never runs for a client that cannot get its
//     answer.
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
//
// # Goroutines
//
// Serve runs fasthttp's goroutines. A Server starts one goroutine per
// lingering connection, which ends when the linger does (within
// lingerTimeout, or at once when Shutdown's ctx ends and closes the
// connection); Shutdown returns only after all of them ended.
package fastserver

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"os"
	"sync"
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

// Server wraps a fasthttp.Server. Create it with New.
type Server struct {
	srv     *fasthttp.Server
	handler fasthttp.RequestHandler
	state   func(net.Conn, fasthttp.ConnState) // the wrapped srv.ConnState, may be nil

	// lingerLimit bounds the bytes a linger discards: srv's body limit, at
	// least fasthttp's default (4 MiB). A client that writes its whole body
	// before it reads the answer gets its 413 if the body is no larger
	// (and arrives within lingerTimeout); one that reads while it writes
	// (Go's http.Transport) stops writing soon after it read the answer.
	lingerLimit int64

	mu         sync.Mutex
	lingerFor  time.Duration            // a linger's bound: lingerTimeout (tests lengthen it)
	conns      map[net.Conn]bool        // open connections: true from the handler's start to StateIdle
	stopping   bool                     // Shutdown was called
	lingering  map[*lingerConn]struct{} // connections in their linger goroutine
	lingerDone chan struct{}            // closed when lingering empties, if a Shutdown waits; else nil
}

// New returns a Server serving with srv, which it takes over: srv.Handler
// and srv.ConnState (either may be nil; a nil Handler answers 404) are
// wrapped, and srv must not be used directly afterwards. New sets
// srv.CloseOnShutdown, so a connection is closed after the answer of a
// request that was in progress when Shutdown began.
func New(srv *fasthttp.Server) *Server {
	s := &Server{
		srv:         srv,
		handler:     srv.Handler,
		state:       srv.ConnState,
		lingerLimit: int64(max(srv.MaxRequestBodySize, fasthttp.DefaultMaxRequestBodySize)),
		lingerFor:   lingerTimeout,
		conns:       make(map[net.Conn]bool),
		lingering:   make(map[*lingerConn]struct{}),
	}
	if s.handler == nil {
		s.handler = func(ctx *fasthttp.RequestCtx) { ctx.NotFound() }
	}
	srv.Handler = s.handle
	srv.ConnState = s.connState
	srv.CloseOnShutdown = true
	l := srv.Logger
	if l == nil {
		l = log.New(os.Stderr, "", log.LstdFlags) // fasthttp's default
	}
	srv.Logger = quietLogger{s, l}
	return s
}

// Serve accepts connections on ln until Shutdown, over TLS with cfg unless
// it is nil; see fasthttp.Server.Serve. It returns nil after Shutdown. The
// error is fasthttp's, unwrapped. The TCP connections ln accepts linger when
// closed (see the package doc), under their TLS layer.
func (s *Server) Serve(ln net.Listener, cfg *tls.Config) error {
	ln = lingerListener{ln, s}
	if cfg != nil {
		ln = tls.NewListener(ln, cfg)
	}
	return s.srv.Serve(ln)
}

// Shutdown stops accepting, closes the connections on which no request is
// active, and waits until the active requests are answered and the
// connections already lingering are closed, or ctx ends (then it closes the
// lingering connections and returns ctx's error; see
// fasthttp.Server.ShutdownWithContext).
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.stopping = true
	for c, active := range s.conns {
		if !active {
			closeNow(c)
			delete(s.conns, c)
		}
	}
	s.mu.Unlock()
	err := s.srv.ShutdownWithContext(ctx)
	if lerr := s.waitLingering(ctx); err == nil {
		err = lerr
	}
	return err
}

// waitLingering waits until no connection lingers or ctx ends; then it
// closes the lingering connections, waits for their goroutines to end, and
// returns ctx's error. No linger starts once stopping is set.
func (s *Server) waitLingering(ctx context.Context) error {
	s.mu.Lock()
	if len(s.lingering) == 0 {
		s.mu.Unlock()
		return nil
	}
	if s.lingerDone == nil {
		s.lingerDone = make(chan struct{})
	}
	done := s.lingerDone
	s.mu.Unlock()
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

// connState tracks the connections (fasthttp.Server.ConnState).
func (s *Server) connState(c net.Conn, st fasthttp.ConnState) {
	s.mu.Lock()
	switch st {
	case fasthttp.StateNew, fasthttp.StateIdle:
		if s.stopping {
			closeNow(c)
			delete(s.conns, c)
		} else {
			s.conns[c] = false
		}
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		delete(s.conns, c)
	}
	s.mu.Unlock()
	if s.state != nil {
		s.state(c, st)
	}
}

// handle marks the connection busy and runs the wrapped handler, unless
// Shutdown closed the connection before its request reached the handler.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	if c := ctx.Conn(); c != nil {
		s.mu.Lock()
		_, open := s.conns[c]
		if open {
			s.conns[c] = true // until StateIdle: the answer is written after h returns
		}
		closed := !open && s.stopping
		s.mu.Unlock()
		if closed {
			ctx.SetConnectionClose()
			ctx.Error("shutting down", fasthttp.StatusServiceUnavailable)
			return
		}
	}
	s.handler(ctx)
}

// quietLogger passes fasthttp's messages on to l, except those about a
// connection the Server closed during Shutdown.
type quietLogger struct {
	s *Server
	l fasthttp.Logger
}

func (q quietLogger) Printf(format string, args ...any) {
	q.s.mu.Lock()
	stopping := q.s.stopping
	q.s.mu.Unlock()
	if stopping {
		for _, a := range args {
			if err, ok := a.(error); ok && errors.Is(err, net.ErrClosed) {
				return
			}
		}
	}
	q.l.Printf(format, args...)
}

// lingerListener wraps the TCP connections ln accepts in lingerConns.
type lingerListener struct {
	net.Listener
	s *Server
}

func (l lingerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok && err == nil {
		return &lingerConn{Conn: tc, tcp: tc, s: l.s}, nil
	}
	return c, err
}

// lingerConn is an accepted TCP connection whose Close lingers. It does not
// embed *net.TCPConn, so that every read and write goes through Read and
// Write (no promoted ReadFrom or WriteTo). It lacks the methods fasthttp's
// TCPKeepalive needs: its one user leaves that off, since net.Listen's
// connections keep alive already.
type lingerConn struct {
	net.Conn // tcp
	tcp      *net.TCPConn
	s        *Server

	peerGone atomic.Bool // a read saw EOF or a reset, or a write failed: nothing to linger for
	closed   atomic.Bool // Close was called
}

func (c *lingerConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && !isTimeout(err) {
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

// Close closes the connection, at once or after a linger (see the package
// doc), and returns without waiting for the linger. Only the first call
// closes; later ones return an error wrapping net.ErrClosed.
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
	if s.stopping || len(s.lingering) >= maxLingering {
		return false
	}
	// The answer is written (fasthttp flushes before it closes): CloseWrite
	// sends the FIN after it.
	if c.tcp.CloseWrite() != nil || c.tcp.SetReadDeadline(time.Now().Add(s.lingerFor)) != nil {
		return false
	}
	s.lingering[c] = struct{}{}
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
	if len(s.lingering) == 0 && s.lingerDone != nil {
		close(s.lingerDone)
		s.lingerDone = nil
	}
	s.mu.Unlock()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
