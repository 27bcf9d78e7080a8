package sim

import (
	"net"
	"net/http"
)

// connState counts the connections accepted by Serve (Stats.Connections).
func (s *Sim) connState(_ net.Conn, st http.ConnState) {
	if st == http.StateNew {
		s.connections.Add(1)
	}
}
