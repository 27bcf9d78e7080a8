package ingest

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Accept back-off: net/http's (5ms doubling, at most 1s).
const (
	acceptDelayMin = 5 * time.Millisecond
	acceptDelayMax = time.Second
)

// retryableAcceptError reports whether an accept error may end by itself:
// a time-out, or an errno of exhausted resources or of a connection lost
// between the handshake and the accept. Other errors (a closed or broken
// listener) end Serve.
func retryableAcceptError(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	switch errno {
	case syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
		syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EPROTO, syscall.EPERM,
		syscall.EINTR, syscall.EAGAIN, syscall.ETIMEDOUT:
		return true
	}
	return errno.Temporary()
}

// clientConns counts the connections each client address holds open, so
// that one client cannot take every --max-connections slot. The key is the
// peer's address (an IPv6 address by its /64: see limiterKey); trusted
// proxies (which carry many clients) and Config.UnboundedPeers are not
// counted. The map holds only
// addresses with a connection open, so it never has more entries than the
// connections a Server holds (Config.MaxConnections). Lock order: mu alone,
// no call out under it.
type clientConns struct {
	max    int
	exempt []netip.Prefix // not counted; unmapped, masked (Config.withDefaults)

	mu sync.Mutex
	n  map[[16]byte]int
}

// newClientConns returns the per-client count, nil when max is 0 (no limit).
func newClientConns(max int, exempt []netip.Prefix) *clientConns {
	if max == 0 {
		return nil
	}
	return &clientConns{max: max, exempt: exempt, n: make(map[[16]byte]int)}
}

// connPeer is the peer address of an accepted connection; ok is false when
// it has none (not TCP): such a connection is not counted.
func connPeer(c net.Conn) (netip.Addr, bool) {
	ta, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return netip.Addr{}, false
	}
	a := ta.AddrPort().Addr().Unmap().WithZone("")
	return a, a.IsValid()
}

// key returns the count's key of c's peer; ok is false for a connection not
// counted (no TCP peer, or a trusted proxy).
func (cc *clientConns) key(c net.Conn) (k [16]byte, ok bool) {
	a, ok := connPeer(c)
	if !ok || isTrusted(a, cc.exempt) {
		return k, false
	}
	return limiterKey(a), true
}

// take counts c against its client; false (c not counted) when the client
// holds max connections already.
func (cc *clientConns) take(c net.Conn) bool {
	k, ok := cc.key(c)
	if !ok {
		return true
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	n := cc.n[k]
	if n >= cc.max {
		return false
	}
	cc.n[k] = n + 1
	return true
}

// release uncounts c, a connection take counted, when it is closed.
func (cc *clientConns) release(c net.Conn) {
	k, ok := cc.key(c)
	if !ok {
		return
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	switch n := cc.n[k]; {
	case n > 1:
		cc.n[k] = n - 1
	case n == 1:
		delete(cc.n, k)
	}
}

// limitListener takes a slot of Server.conns for every connection it
// returns, closes at once the connections of a client that holds its share
// (Server.perClient) already, wraps the TCP ones in lingerConns, and waits
// and retries the accept errors that
// end when resources free up (out of file descriptors, buffers or memory, a
// connection aborted before it was accepted), as net/http's Serve does:
// fasthttp's Serve returns on any accept error but a time-out, and the
// relay would stop serving when it runs out of descriptors.
type limitListener struct {
	net.Listener
	s *Server

	closeOnce sync.Once
	done      chan struct{} // closed by Close: ends a wait for a slot or a back-off
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.s.conns <- struct{}{}:
	default:
		l.s.connsFull()
		select {
		case l.s.conns <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if err = l.backOff(err, &delay); err != nil {
				<-l.s.conns
				return nil, err
			}
			continue
		}
		delay = 0
		if l.s.perClient == nil || l.s.perClient.take(c) {
			if tc, ok := c.(*net.TCPConn); ok {
				return &lingerConn{Conn: tc, tcp: tc, s: l.s}, nil
			}
			return c, nil
		}
		// Over its client's share: closed before any byte is read (and
		// before a TLS handshake), with a reset rather than a FIN, so that
		// neither side keeps the socket in TIME_WAIT. The slot is kept
		// for the next connection. Counted first: a client that saw the
		// reset finds the refusal counted.
		l.s.clientRefused(c)
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
}

// backOff waits before the next accept after err (5ms doubling, at most
// 1s), or returns the error that ends Serve.
func (l *limitListener) backOff(err error, delay *time.Duration) error {
	select {
	case <-l.done:
		return net.ErrClosed
	default:
	}
	if !retryableAcceptError(err) {
		return err
	}
	*delay = min(max(2**delay, acceptDelayMin), acceptDelayMax)
	l.s.m.acceptRetries.Inc()
	if ce := l.s.rejLog.Check(zapcore.WarnLevel, "ingest accept failed; retrying"); ce != nil {
		// The error of accept(2) names no peer and no request content.
		ce.Write(zap.Error(err), zap.Duration("retry_in", *delay))
	}
	t := time.NewTimer(*delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-l.done:
		return net.ErrClosed
	}
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// clientRefused notes a connection closed at accept because its client held
// Config.MaxConnectionsPerClient already.
func (s *Server) clientRefused(c net.Conn) {
	s.m.clientRefusals.Inc()
	ce := s.rejLog.Check(zapcore.WarnLevel, "ingest connection closed: its client holds --max-connections-per-client")
	if ce == nil {
		return
	}
	fields := []zap.Field{zap.Int("max_connections_per_client", s.cfg.MaxConnectionsPerClient)}
	if a, ok := connPeer(c); ok {
		if s.st().anonIP {
			a = anonymizeAddr(a)
		}
		fields = append(fields, zap.String("client", a.String()))
	}
	ce.Write(fields...)
}

// connsFull notes that the connection limit holds new connections back.
func (s *Server) connsFull() {
	s.m.connsFull.Inc()
	if ce := s.rejLog.Check(zapcore.WarnLevel, "ingest connection limit reached: new connections wait"); ce != nil {
		ce.Write(zap.Int("max_connections", s.cfg.MaxConnections))
	}
}

// connState tracks the connections for Shutdown (see linger.go) and gives
// a connection's slot back when fasthttp is done with it.
func (s *Server) connState(c net.Conn, st fasthttp.ConnState) {
	s.mu.Lock()
	switch st {
	case fasthttp.StateNew, fasthttp.StateIdle:
		if s.closing.Load() {
			closeNow(c)
			delete(s.tracked, c)
		} else {
			s.tracked[c] = false
		}
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		delete(s.tracked, c)
	}
	s.mu.Unlock()
	if st == fasthttp.StateClosed || st == fasthttp.StateHijacked {
		select {
		case <-s.conns:
		default: // never taken: not a connection of a limitListener
		}
		if s.perClient != nil {
			s.perClient.release(c)
		}
	}
}

// fasthttpLogger sends fasthttp's own messages to a (sampled) zap logger
// without their content: fasthttp's messages quote request heads (header
// values, query strings holding an api_key) when it cannot parse them. A
// line says only that a connection failed, the peer's address (anonymized
// under AnonymizeIP), and a class of the error; neither the format nor the
// error text is logged. Errors of a connection the Server closed during
// Shutdown (net.ErrClosed) are not logged at all.
type fasthttpLogger struct{ s *Server }

func (f fasthttpLogger) Printf(_ string, args ...any) {
	var remote net.Addr
	class := "other"
	for _, a := range args {
		switch v := a.(type) {
		case net.Addr: // fasthttp names the local address first, the peer last
			remote = v
		case error:
			class = errorClass(v)
		}
	}
	if class == classClosed && f.s.closing.Load() {
		return
	}
	ce := f.s.rejLog.Check(zapcore.WarnLevel, "ingest connection error")
	if ce == nil {
		return
	}
	fields := []zap.Field{zap.String("class", class)}
	if ta, ok := remote.(*net.TCPAddr); ok && f.s.st().anonIP {
		fields = append(fields, zap.String("remote", netip.AddrPortFrom(anonymizeAddr(ta.AddrPort().Addr()), ta.AddrPort().Port()).String()))
	} else if remote != nil && !f.s.st().anonIP {
		fields = append(fields, zap.String("remote", remote.String()))
	}
	ce.Write(fields...)
}

// Classes of errorClass that handleReadError answers, and the Server's own
// closing.
const (
	classClosed         = "closed"
	classTimeout        = "timeout"
	classBodyTooLarge   = "body too large"
	classHeaderTooLarge = "header too large"
)

// errorClass names the kind of a connection error in a few fixed words.
func errorClass(err error) string {
	var ne net.Error
	var small *fasthttp.ErrSmallBuffer
	var rec tls.RecordHeaderError
	var alert tls.AlertError
	switch {
	case errors.Is(err, net.ErrClosed):
		return classClosed
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, os.ErrDeadlineExceeded):
		return classTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "reset"
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return classBodyTooLarge
	case errors.As(err, &small):
		return classHeaderTooLarge
	case errors.As(err, &rec), errors.As(err, &alert), strings.HasPrefix(err.Error(), "tls: "):
		return "tls"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return "syscall"
	}
	return "malformed request"
}
