package simtest

import (
	"fmt"
	"net"
	"sync"
)

// switchListener is the listener Serve hands to the Sim. It can be switched
// "down" (the real listener is closed, so connections are refused, and the
// connections it accepted are cut) and "up" again (a new listener on the
// same address).
type switchListener struct {
	network, addr string
	address       net.Addr
	conns         chan net.Conn
	done          chan struct{}
	closeOnce     sync.Once

	mu   sync.Mutex
	cur  net.Listener // nil while down
	open map[*trackedConn]struct{}
}

func newSwitchListener(ln net.Listener, down bool) *switchListener {
	l := &switchListener{
		network: ln.Addr().Network(), addr: ln.Addr().String(), address: ln.Addr(),
		conns: make(chan net.Conn), done: make(chan struct{}), open: map[*trackedConn]struct{}{},
	}
	if down {
		ln.Close()
	} else {
		l.cur = ln
		go l.acceptLoop(ln)
	}
	return l
}

func (l *switchListener) acceptLoop(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed by down or Close
		}
		tc := &trackedConn{Conn: c, l: l}
		l.mu.Lock()
		l.open[tc] = struct{}{}
		l.mu.Unlock()
		select {
		case l.conns <- tc:
		case <-l.done:
			tc.Close()
			return
		}
	}
}

func (l *switchListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *switchListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != nil {
		err := l.cur.Close()
		l.cur = nil
		return err
	}
	return nil
}

func (l *switchListener) Addr() net.Addr { return l.address }

// goDown closes the real listener and cuts the connections it accepted.
func (l *switchListener) goDown() {
	l.mu.Lock()
	if l.cur != nil {
		l.cur.Close()
		l.cur = nil
	}
	open := make([]*trackedConn, 0, len(l.open))
	for c := range l.open {
		open = append(open, c)
	}
	l.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

func (l *switchListener) goUp() error {
	select {
	case <-l.done:
		return ErrClosed
	default:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != nil {
		return nil
	}
	ln, err := net.Listen(l.network, l.addr)
	if err != nil {
		return fmt.Errorf("simtest: listen again on %s: %w", l.addr, err)
	}
	l.cur = ln
	go l.acceptLoop(ln)
	return nil
}

// trackedConn leaves its listener's open set when closed.
type trackedConn struct {
	net.Conn
	l *switchListener
}

func (c *trackedConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.open, c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}
