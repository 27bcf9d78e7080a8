package fastserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/fastserver/fastservertest"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/valyala/fasthttp"
)

// start serves h on 127.0.0.1 with minute-long timeouts (so only Shutdown's
// closing can end a silent connection quickly).
func start(t *testing.T, h fasthttp.RequestHandler, state func(net.Conn, fasthttp.ConnState)) (*Server, string, chan error) {
	t.Helper()
	return serve(t, &fasthttp.Server{
		Handler:     h,
		ConnState:   state,
		ReadTimeout: 10 * time.Minute,
		IdleTimeout: 10 * time.Minute,
	})
}

// serve serves with srv on 127.0.0.1 and fails the test if fasthttp logs a
// message that does not contain one of expected.
func serve(t *testing.T, srv *fasthttp.Server, expected ...string) (*Server, string, chan error) {
	t.Helper()
	logged := &recordLogger{}
	t.Cleanup(func() {
		logged.mu.Lock()
		defer logged.mu.Unlock()
	msgs:
		for _, m := range logged.msgs {
			for _, e := range expected {
				if strings.Contains(m, e) {
					continue msgs
				}
			}
			t.Errorf("fasthttp logged %q (the Server's own closing must not be logged)", m)
		}
	})
	srv.Logger = logged
	s := New(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln, nil) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return s, ln.Addr().String(), served
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// get sends one keep-alive GET on c and reads its answer.
func get(t *testing.T, c net.Conn, br *bufio.Reader, path string) *http.Response {
	t.Helper()
	c.SetDeadline(time.Now().Add(polltest.Max))
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read answer of %s: %v", path, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// waitClosed fails unless the server closes c within d.
func waitClosed(t *testing.T, name string, c net.Conn, d time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(max(d, polltest.Max)))
	var b [1]byte
	if _, err := c.Read(b[:]); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("%s connection: read %v, want EOF (closed by Shutdown)", name, err)
	}
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

// TestShutdownClosesWaitingConnections: a silent connection and an idle
// keep-alive one are closed at once; a request in its handler still gets its
// 200, and Shutdown returns right after it.
func TestShutdownClosesWaitingConnections(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	s, addr, served := start(t, func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/slow" {
			close(entered)
			<-release
		}
		ctx.SetBodyString("ok")
	}, nil)

	silent := dial(t, addr)
	idle := dial(t, addr)
	if r := get(t, idle, bufio.NewReader(idle), "/"); r.StatusCode != 200 || r.Close {
		t.Fatalf("keep-alive request: %d close=%v", r.StatusCode, r.Close)
	}
	busy := dial(t, addr)
	busyAnswer := make(chan *http.Response, 1)
	go func() {
		busy.SetDeadline(time.Now().Add(polltest.Max))
		io.WriteString(busy, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
		r, err := http.ReadResponse(bufio.NewReader(busy), nil)
		if err != nil {
			t.Errorf("in-flight request: %v", err)
		}
		busyAnswer <- r
	}()
	<-entered

	// The bounds below are 10 s: the read and idle timeouts are a minute,
	// so a wrong Shutdown that left the waiting connections to them, or
	// waited for them, takes six times longer; and a loaded CI machine
	// may take a second or two where a quiet one takes 100 ms.
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	waitClosed(t, "silent", silent, 10*time.Second)
	waitClosed(t, "idle keep-alive", idle, 10*time.Second)
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a request in its handler", err)
	case <-time.After(50 * time.Millisecond): // can only miss a wrong return, never fail a right one
	}

	close(release)
	r := <-busyAnswer
	if r == nil || r.StatusCode != 200 {
		t.Fatalf("in-flight request answer: %+v, want 200", r)
	}
	if !r.Close {
		t.Errorf("in-flight answer during Shutdown without Connection: close")
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(polltest.Max): // about 100 ms on a quiet machine (fasthttp's poll)
		t.Fatalf("Shutdown still waiting %v after the last request ended (the idle timeout is 10 minutes)", polltest.Max)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve after Shutdown: %v", err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("connection accepted after Shutdown")
	}
}

// TestShutdownIdleOnly: with only waiting connections, Shutdown returns at
// once though their read and idle timeouts are 10 minutes.
func TestShutdownIdleOnly(t *testing.T) {
	var mu sync.Mutex
	states := map[fasthttp.ConnState]int{}
	s, addr, _ := start(t, func(ctx *fasthttp.RequestCtx) {}, func(_ net.Conn, st fasthttp.ConnState) {
		mu.Lock()
		states[st]++
		mu.Unlock()
	})
	dial(t, addr)
	idle := dial(t, addr)
	get(t, idle, bufio.NewReader(idle), "/")
	// The silent connection is accepted before Shutdown, but its StateNew
	// may come later: either way it must be closed.
	// fasthttp polls its count of open connections every 100 ms: about
	// 100 ms on a quiet machine. The bound is the ctx: polltest.Max, against
	// the 10 minutes a wrong Shutdown would wait for the read and idle
	// timeouts (start's).
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if states[fasthttp.StateNew] != 2 || states[fasthttp.StateIdle] != 1 {
		t.Fatalf("wrapped ConnState saw %v, want 2 new, 1 idle", states)
	}
}

// TestRequestOnClosedConnectionNotHandled: a request whose connection
// Shutdown closed before it became active never reaches the handler.
func TestRequestOnClosedConnectionNotHandled(t *testing.T) {
	called := false
	s := New(&fasthttp.Server{Handler: func(*fasthttp.RequestCtx) { called = true }})
	c1, c2 := net.Pipe()
	defer c2.Close()
	s.connState(c1, fasthttp.StateNew)
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	var ctx fasthttp.RequestCtx
	ctx.Init2(c1, nil, false)
	s.handle(&ctx)
	if called || ctx.Response.StatusCode() != fasthttp.StatusServiceUnavailable {
		t.Fatalf("handler called=%v, status %d; want not called, 503", called, ctx.Response.StatusCode())
	}
}

// recordLogger keeps fasthttp's messages.
type recordLogger struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recordLogger) Printf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}

// TestOversizedBodyAnswered: a client still sending a body over
// MaxRequestBodySize when the server answers 413 and closes gets the whole
// answer, every time, and its writes do not fail: the server half-closes and
// discards what the client still sends instead of resetting the connection.
// (Closing a socket with unread data sends RST; a client whose body write
// fails with "connection reset by peer" before it read the answer, as Go's
// http.Transport does, reports the reset instead of the 413, and a client
// that sends its whole body before reading never sees the answer.)
func TestOversizedBodyAnswered(t *testing.T) {
	const (
		limit = 64 << 10
		size  = 1 << 20 // the body the client sends: 16 times the limit
		conns = 50
	)
	_, addr, _ := serve(t, &fasthttp.Server{
		Handler:            func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") },
		ErrorHandler:       tooLargeHandler,
		MaxRequestBodySize: limit,
		ReadTimeout:        time.Minute,
		IdleTimeout:        time.Minute,
	}, fasthttp.ErrBodyTooLarge.Error())
	fastservertest.Repeat(t, conns, func() error {
		c, err := fastservertest.Dial(addr, polltest.Max)
		if err != nil {
			return err
		}
		defer c.Close()
		return fastservertest.PostOversized(c, "/ingest", size, fasthttp.StatusRequestEntityTooLarge, "too large")
	})
}

// tooLargeHandler answers 413 to a body over the limit, 400 otherwise.
func tooLargeHandler(ctx *fasthttp.RequestCtx, err error) {
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		ctx.Error("too large", fasthttp.StatusRequestEntityTooLarge)
		return
	}
	ctx.Error("bad request", fasthttp.StatusBadRequest)
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
	client = dial(t, ln.Addr().String())
	c, err := lingerListener{ln, s}.Accept()
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
	s := New(&fasthttp.Server{})

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
	s := New(&fasthttp.Server{})
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
	if err == nil || isTimeout(err) {
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
			s, addr, served := serve(t, &fasthttp.Server{
				ErrorHandler:       tooLargeHandler,
				MaxRequestBodySize: 1 << 10,
				ReadTimeout:        time.Minute,
				IdleTimeout:        time.Minute,
			}, fasthttp.ErrBodyTooLarge.Error())
			s.mu.Lock() // startLinger reads it under s.mu
			s.lingerFor = tc.linger
			s.mu.Unlock()
			// A client that sent part of an oversized body, read the
			// 413 and stays silent: its connection lingers.
			c := dial(t, addr)
			c.SetDeadline(time.Now().Add(polltest.Max))
			if _, err := fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", 1<<20, make([]byte, 8<<10)); err != nil {
				t.Fatal(err)
			}
			if r, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || r.StatusCode != 413 {
				t.Fatalf("answer: %v, %v; want 413", r, err)
			}
			waitLingeringCount(t, s, 1, 5*time.Second)

			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			begin := time.Now()
			if err := s.Shutdown(ctx); err != tc.want {
				t.Fatalf("Shutdown: %v, want %v", err, tc.want)
			}
			if d := time.Since(begin); d > tc.within {
				t.Errorf("Shutdown took %v with a lingering connection, want < %v", d, tc.within)
			}
			if n := lingeringCount(s); n != 0 {
				t.Errorf("%d connections lingering after Shutdown returned", n)
			}
			if err := <-served; err != nil {
				t.Fatalf("Serve: %v", err)
			}
		})
	}
}
