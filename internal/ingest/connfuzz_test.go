package ingest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
)

// memListener is a net.Listener of in-memory connections that, unlike
// net.Pipe's, can be half-closed: a client writes its bytes, closes its
// writing side, and reads the answers until the server closes.
type memListener struct {
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

func newMemListener() *memListener {
	return &memListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *memListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *memListener) Addr() net.Addr { return memAddr }

var memAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}

// dial returns the client side of a new connection the listener accepts,
// or an error when it accepts none within wait (a connection slot that was
// never given back would show so).
func (l *memListener) dial(wait time.Duration) (*memConn, error) {
	c2s, fromClient := io.Pipe()
	s2c, fromServer := io.Pipe()
	client := &memConn{r: s2c, w: fromClient}
	server := &memConn{r: c2s, w: fromServer}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-t.C:
		return nil, errors.New("no connection accepted")
	}
}

// memConn is one side of a memListener connection. Deadlines are ignored:
// a peer always ends by closing.
type memConn struct {
	r *io.PipeReader
	w *io.PipeWriter
}

func (c *memConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *memConn) Write(p []byte) (int, error)      { return c.w.Write(p) }
func (c *memConn) CloseWrite() error                { return c.w.Close() }
func (c *memConn) Close() error                     { c.r.Close(); return c.w.Close() }
func (c *memConn) LocalAddr() net.Addr              { return memAddr }
func (c *memConn) RemoteAddr() net.Addr             { return memAddr }
func (c *memConn) SetDeadline(time.Time) error      { return nil }
func (c *memConn) SetReadDeadline(time.Time) error  { return nil }
func (c *memConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzIngestConn writes arbitrary bytes on a connection of the ingest
// listener (request lines, headers, body framing, pipelining) through the
// whole server: the connection handling, the strict head checks, fasthttp's
// parser and the handler over a real spool. The server never panics or
// hangs (it closes the connection once the client closed its side, and
// gives back its connection slot: the limit is small), what it
// writes is a sequence of well-formed HTTP/1.1 responses, none is a 500,
// a refused framing closes the connection, and nothing follows an answer
// that closes it (a request behind a refused one is never served). Seeds in
// testdata/fuzz/FuzzIngestConn.
func FuzzIngestConn(f *testing.F) {
	s, _ := newServer(f, Config{MaxRequestBytes: 4 << 10, MaxConnections: 64}, true, nil)
	ln := newMemListener()
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	f.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		<-served
	})

	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := ln.dial(polltest.Max)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go func() {
			c.Write(in) // fails when the server closed first
			c.CloseWrite()
		}()
		outc := make(chan []byte, 1)
		go func() {
			out, _ := io.ReadAll(c)
			outc <- out
		}()
		var out []byte
		select {
		case out = <-outc:
		case <-time.After(polltest.Max):
			t.Fatalf("no end of the answers to %q", in)
		}
		checkAnswers(t, in, out)
	})
}

// checkAnswers checks out is a sequence of well-formed responses.
func checkAnswers(t *testing.T, in, out []byte) {
	br := bufio.NewReader(bytes.NewReader(out))
	// A response to HEAD has no body whatever its Content-Length, which a
	// reader without the request cannot tell: past one, only the first
	// answer is checked.
	head := bytes.Contains(in, []byte("HEAD"))
	for i := 0; ; i++ {
		if _, err := br.Peek(1); err != nil {
			return // the end of the answers
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d to %q is malformed: %v\nanswers: %q", i, in, err, out)
		}
		if resp.StatusCode < 100 || resp.StatusCode > 599 || resp.StatusCode == 500 || resp.ProtoMajor != 1 {
			t.Fatalf("answer %d to %q: %s\nanswers: %q", i, in, resp.Status, out)
		}
		if head {
			return
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("answer %d to %q: body: %v\nanswers: %q", i, in, err, out)
		}
		for _, msg := range headFaultMsgs[1:] {
			if bytes.Contains(body, []byte(msg)) && !resp.Close {
				t.Fatalf("answer %d to %q refuses the framing but keeps the connection: %q", i, in, out)
			}
		}
		if resp.Close {
			if rest, _ := io.ReadAll(br); len(rest) > 0 {
				t.Fatalf("bytes after an answer that closes the connection, to %q: %q", in, rest)
			}
			return
		}
	}
}
