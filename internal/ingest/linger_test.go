package ingest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// dialSmall connects to addr with a small send buffer (32 KiB: the kernels
// cannot take a large body before the server's close, so the client is
// still writing then) and a deadline of d on every read and write.
func dialSmall(addr string, d time.Duration) (*net.TCPConn, error) {
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)
	tc.SetWriteBuffer(32 << 10)
	tc.SetDeadline(time.Now().Add(d))
	return tc, nil
}

// postOversized sends on c a POST of path with a body of size bytes,
// writing in a goroutine while it reads the answer, as Go's http.Transport
// does. It returns an error unless the answer has status status and a body
// containing want, and the whole body was written. It returns once the
// writer ended: c's deadline bounds the wait. The caller closes c.
func postOversized(c net.Conn, path string, size, status int, want string) error {
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

// repeatPosts calls post n times, or as many as fit in 30 s on a slow
// machine, and fails t if any call failed, naming how many and the first
// error.
func repeatPosts(t testing.TB, n int, post func() error) {
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

// TestOversizedBodyAnswered: a client still sending a body over the limit
// when the relay refuses it from its Content-Length gets the whole 413,
// every time, and its writes do not fail: the server half-closes and
// discards what the client still sends instead of resetting the connection.
// (Closing a socket with unread data sends RST; a client whose body write
// fails with "connection reset by peer" before it read the answer, as Go's
// http.Transport does, reports the reset instead of the 413, and a client
// that sends its whole body before reading never sees the answer.)
func TestOversizedBodyAnswered(t *testing.T) {
	r := startRelay(t, Config{MaxRequestBytes: 1000}, spool.Config{NoSync: true})
	repeatPosts(t, 50, func() error {
		c, err := dialSmall(r.addr, polltest.Max)
		if err != nil {
			return err
		}
		defer c.Close()
		return postOversized(c, "/2/httpapi", 1<<20, 413, "Payload too large")
	})
}

// TestRequestOnClosedConnectionNotHandled: a request whose connection
// Shutdown closed before it became active never reaches the handler.
func TestRequestOnClosedConnectionNotHandled(t *testing.T) {
	s, _ := newServer(t, Config{}, true, nil)
	c1, c2 := net.Pipe()
	defer c2.Close()
	s.connState(c1, fasthttp.StateNew)
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	var ctx fasthttp.RequestCtx
	ctx.Init2(c1, nil, false)
	ctx.Request.Header.SetMethod(fasthttp.MethodPost)
	ctx.Request.SetRequestURI("/2/httpapi")
	s.strictHandle(&ctx)
	// The handler's own answer while shutting down is a JSON 503.
	if ctx.Response.StatusCode() != 503 || string(ctx.Response.Body()) != "shutting down" {
		t.Fatalf("answer %d %q; want 503 \"shutting down\"", ctx.Response.StatusCode(), ctx.Response.Body())
	}
}

// TestOwnClosingNotLogged: fasthttp's error about a connection the Server
// closed during Shutdown is not logged (every stop with an idle client
// would log one); before Shutdown, the same error is.
func TestOwnClosingNotLogged(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	s, _ := newServer(t, Config{}, true, zap.New(core))
	local, remote := &net.TCPAddr{Port: 1}, &net.TCPAddr{Port: 2}
	closed := &net.OpError{Op: "read", Net: "tcp", Err: net.ErrClosed}
	for _, stopping := range []bool{false, true} {
		s.closing.Store(stopping)
		fasthttpLogger{s}.Printf("error when serving connection %q<->%q: %v", local, remote, closed)
	}
	if n := logs.FilterMessage("ingest connection error").Len(); n != 1 {
		t.Fatalf("%d lines logged, want 1 (before Shutdown only)", n)
	}
}

// tcpPair returns the two ends of a TCP connection on 127.0.0.1, the server
// end accepted through s's listener wrapper.
func tcpPair(t *testing.T, s *Server) (srv *lingerConn, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.DialTimeout("tcp", ln.Addr().String(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	c, err := (&limitListener{Listener: ln, s: s, done: make(chan struct{})}).Accept()
	if err != nil {
		t.Fatal(err)
	}
	lc, ok := c.(*lingerConn)
	if !ok {
		c.Close()
		t.Fatalf("accepted %T, want *lingerConn", c)
	}
	t.Cleanup(func() { lc.tcp.Close() })
	return lc, client
}

// lingeringCount is the number of connections lingering on s.
func lingeringCount(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.lingering)
}

// waitLingeringCount fails unless the lingering count on s becomes n within d.
func waitLingeringCount(t *testing.T, s *Server, n int, d time.Duration) {
	t.Helper()
	polltest.Within(t, max(d, polltest.Max), fmt.Sprintf("%d connections lingering", n), func() bool { return lingeringCount(s) == n })
}

// TestLingerEnds: a connection the peer closed first is closed at once; one
// closed while the peer may still send lingers until the peer closes, or at
// most lingerTimeout.
func TestLingerEnds(t *testing.T) {
	s, _ := newServer(t, Config{}, true, nil)

	t.Run("peer closed first", func(t *testing.T) {
		c, client := tcpPair(t, s)
		client.Close()
		c.SetReadDeadline(time.Now().Add(polltest.Max))
		if _, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("read after the peer closed: %v, want EOF", err)
		}
		c.Close()
		if n := lingeringCount(s); n != 0 {
			t.Fatalf("%d connections lingering after the peer closed first", n)
		}
		if err := c.Close(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("second Close: %v, want net.ErrClosed", err)
		}
	})

	t.Run("peer closes after the answer", func(t *testing.T) {
		c, client := tcpPair(t, s)
		if _, err := io.WriteString(c, "answer"); err != nil {
			t.Fatal(err)
		}
		closed := time.Now() // the linger's deadline is lingerTimeout after this
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if n := lingeringCount(s); n != 1 {
			t.Fatalf("%d connections lingering after Close, want 1", n)
		}
		// The peer gets the answer and the FIN (CloseWrite), and may still
		// send: the server discards it.
		client.SetDeadline(time.Now().Add(polltest.Max))
		if b, err := io.ReadAll(client); err != nil || string(b) != "answer" {
			t.Fatalf("peer read %q, %v; want the answer and EOF", b, err)
		}
		if _, err := client.Write(make([]byte, 64<<10)); err != nil {
			t.Fatalf("peer write while the server lingers: %v", err)
		}
		peerClosed := time.Now()
		client.Close()
		waitLingeringCount(t, s, 0, 10*time.Second)
		// A linger that ignored the peer's close would end on its
		// deadline, lingerTimeout after closed. Only when the peer closed
		// well before that (a loaded machine may be slower) does the end
		// tell the two apart.
		if early := peerClosed.Sub(closed) < lingerTimeout/4; early {
			if d := time.Since(closed); d >= lingerTimeout {
				t.Errorf("linger ended %v after it began though the peer closed %v after it began: it waited for its deadline", d, peerClosed.Sub(closed))
			}
		} else {
			t.Logf("the peer closed %v after the linger began: too late to tell its close from the deadline", peerClosed.Sub(closed))
		}
	})

	t.Run("silent peer", func(t *testing.T) {
		c, client := tcpPair(t, s)
		begin := time.Now()
		c.Close()
		client.SetDeadline(time.Now().Add(polltest.Max))
		if _, err := client.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("peer read: %v, want EOF (the server's FIN)", err)
		}
		waitLingeringCount(t, s, 0, 10*time.Second) // a linger that never ended fails here
		// Timers never fire early, so the lower bound holds on any machine;
		// the upper one is the wait above.
		if d := time.Since(begin); d < lingerTimeout-50*time.Millisecond {
			t.Errorf("linger with a silent peer lasted %v, want about %v", d, lingerTimeout)
		}
	})
}

// TestLingerByteLimit: a peer that keeps sending is cut off once the server
// discarded lingerLimit bytes, before lingerTimeout.
func TestLingerByteLimit(t *testing.T) {
	s, _ := newServer(t, Config{}, true, nil)
	s.lingerLimit = 64 << 10
	// A linger far longer than the test may take, so that only the byte
	// limit can end it in time, however loaded the machine.
	s.lingerFor = 10 * time.Minute
	c, client := tcpPair(t, s)
	begin := time.Now() // the linger's deadline is s.lingerFor after this
	c.Close()
	client.SetDeadline(time.Now().Add(polltest.Max))
	chunk := make([]byte, 16<<10)
	var err error
	for sent := 0; sent < 256<<20 && err == nil; sent += len(chunk) {
		_, err = client.Write(chunk)
	}
	if err == nil || errorClass(err) == classTimeout {
		t.Fatalf("peer sent 256 MiB to a lingering connection (%v), want it closed after 64 KiB", err)
	}
	// Without the byte limit the write fails only when the deadline ends
	// the linger: s.lingerFor after begin, never sooner.
	if d := time.Since(begin); d >= s.lingerFor {
		t.Errorf("peer's write failed after %v, want before the linger's end (%v)", d, s.lingerFor)
	}
	waitLingeringCount(t, s, 0, 10*time.Second)
}

// TestShutdownWithLingering: Shutdown waits for a connection that was
// lingering when it began no longer than the linger's bound, and closes it
// at once when its ctx ends first.
func TestShutdownWithLingering(t *testing.T) {
	for _, tc := range []struct {
		name    string
		linger  time.Duration
		timeout time.Duration
		want    error
		within  time.Duration
	}{
		// A Shutdown that waited forever fails on its ctx; one that did
		// not wait at all leaves the connection lingering (checked
		// below).
		{"linger ends", lingerTimeout, polltest.Max, nil, polltest.Max},
		// A Shutdown that waited for the linger past its ctx would
		// return the linger's 10 minutes after it began, far past the
		// bound.
		{"ctx ends first", 10 * time.Minute, 50 * time.Millisecond, context.DeadlineExceeded, polltest.Max},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRelay(t, Config{MaxRequestBytes: 1 << 10, ReadTimeout: time.Minute, IdleTimeout: time.Minute}, spool.Config{NoSync: true})
			r.srv.mu.Lock() // startLinger reads it under s.mu
			r.srv.lingerFor = tc.linger
			r.srv.mu.Unlock()
			// A client that sent part of an oversized body, read the
			// 413 and stays silent: its connection lingers.
			c, err := net.DialTimeout("tcp", r.addr, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(polltest.Max))
			if _, err := fmt.Fprintf(c, "POST /2/httpapi HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", 1<<20, make([]byte, 8<<10)); err != nil {
				t.Fatal(err)
			}
			if r, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || r.StatusCode != 413 {
				t.Fatalf("answer: %v, %v; want 413", r, err)
			}
			waitLingeringCount(t, r.srv, 1, 5*time.Second)

			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			begin := time.Now()
			if err := r.srv.Shutdown(ctx); !errors.Is(err, tc.want) {
				t.Fatalf("Shutdown: %v, want %v", err, tc.want)
			}
			if d := time.Since(begin); d > tc.within {
				t.Errorf("Shutdown took %v with a lingering connection, want < %v", d, tc.within)
			}
			if n := lingeringCount(r.srv); n != 0 {
				t.Errorf("%d connections lingering after Shutdown returned", n)
			}
		})
	}
}
