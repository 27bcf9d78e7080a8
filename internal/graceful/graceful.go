// Package graceful is a fasthttp server that shuts down promptly.
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
//
// # Goroutines
//
// A Server starts no goroutine of its own; Serve runs fasthttp's.
package graceful

import (
	"context"
	"errors"
	"log"
	"net"
	"os"
	"sync"

	"github.com/valyala/fasthttp"
)

// Server wraps a fasthttp.Server. Create it with New.
type Server struct {
	srv     *fasthttp.Server
	handler fasthttp.RequestHandler
	state   func(net.Conn, fasthttp.ConnState) // the wrapped srv.ConnState, may be nil

	mu       sync.Mutex
	conns    map[net.Conn]bool // open connections: true from the handler's start to StateIdle
	stopping bool              // Shutdown was called
}

// New returns a Server serving with srv, which it takes over: srv.Handler
// and srv.ConnState (either may be nil; a nil Handler answers 404) are
// wrapped, and srv must not be used directly afterwards. New sets
// srv.CloseOnShutdown, so a connection is closed after the answer of a
// request that was in progress when Shutdown began.
func New(srv *fasthttp.Server) *Server {
	s := &Server{srv: srv, handler: srv.Handler, state: srv.ConnState, conns: make(map[net.Conn]bool)}
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

// Serve accepts connections on ln until Shutdown; see fasthttp.Server.Serve.
// It returns nil after Shutdown. The error is fasthttp's, unwrapped.
func (s *Server) Serve(ln net.Listener) error { return s.srv.Serve(ln) }

// Shutdown stops accepting, closes the connections on which no request is
// active, and waits until the active requests are answered or ctx ends (then
// it returns ctx's error; see fasthttp.Server.ShutdownWithContext).
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.stopping = true
	for c, active := range s.conns {
		if !active {
			c.Close()
			delete(s.conns, c)
		}
	}
	s.mu.Unlock()
	return s.srv.ShutdownWithContext(ctx)
}

// connState tracks the connections (fasthttp.Server.ConnState).
func (s *Server) connState(c net.Conn, st fasthttp.ConnState) {
	s.mu.Lock()
	switch st {
	case fasthttp.StateNew, fasthttp.StateIdle:
		if s.stopping {
			c.Close()
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
