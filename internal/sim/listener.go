package sim

import (
	"fmt"
	"net"
	"net/http"
	"sync"
)

// switchListener is the listener Serve hands to net/http. It can be switched
// "down" (the real listener is closed, so connections are refused) and "up"
// again (a new listener on the same address).
type switchListener struct {
	network, addr string
	address       net.Addr
	conns         chan net.Conn
	done          chan struct{}
	closeOnce     sync.Once

	mu  sync.Mutex
	cur net.Listener // nil while down
}

func (s *Sim) addListener(ln net.Listener) (*switchListener, error) {
	sl := &switchListener{
		network: ln.Addr().Network(), addr: ln.Addr().String(), address: ln.Addr(),
		conns: make(chan net.Conn), done: make(chan struct{}),
	}
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	if s.closed {
		ln.Close()
		return nil, ErrClosed
	}
	s.listeners = append(s.listeners, sl)
	s.faultMu.Lock()
	down := s.faults.down == DownRefuse
	s.faultMu.Unlock()
	if down {
		ln.Close()
	} else {
		sl.cur = ln
		go sl.acceptLoop(ln)
	}
	return sl, nil
}

func (l *switchListener) acceptLoop(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return // closed by down or Close
		}
		select {
		case l.conns <- c:
		case <-l.done:
			c.Close()
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

func (l *switchListener) goDown() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != nil {
		l.cur.Close()
		l.cur = nil
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
		return fmt.Errorf("sim: listen again on %s: %w", l.addr, err)
	}
	l.cur = ln
	go l.acceptLoop(ln)
	return nil
}

// connState tracks open connections so that going down can cut them.
func (s *Sim) connState(c net.Conn, st http.ConnState) {
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	switch st {
	case http.StateNew:
		if s.conns == nil {
			s.conns = make(map[net.Conn]struct{})
		}
		s.conns[c] = struct{}{}
		s.connections.Add(1)
	case http.StateClosed, http.StateHijacked:
		delete(s.conns, c)
	}
}

// setListenersDown closes (down) or reopens (up) every Serve listener and,
// going down, cuts the open connections.
func (s *Sim) setListenersDown(down bool) error {
	s.lnMu.Lock()
	ls := append([]*switchListener(nil), s.listeners...)
	var conns []net.Conn
	if down {
		for c := range s.conns {
			conns = append(conns, c)
		}
	}
	s.lnMu.Unlock()
	var firstErr error
	for _, l := range ls {
		if down {
			l.goDown()
		} else if err := l.goUp(); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for _, c := range conns {
		c.Close()
	}
	return firstErr
}
