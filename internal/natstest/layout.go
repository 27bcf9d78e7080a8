package natstest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/svcrelay/relay/internal/porttest"
)

// Layout is where the nodes of a cluster on 127.0.0.1 listen. Start and New
// lay out their in-process nodes with it; a test or a benchmark that runs
// nats-server processes (to SIGKILL them) writes each node's configuration
// file with Conf and starts the binary on it.
type Layout struct {
	Nodes []NodeAddr
}

// NodeAddr is one node's name (n1, n2, ...) and ports on 127.0.0.1: for
// clients, for the other nodes' routes, and for monitoring (HTTP:
// /healthz). An in-process node serves no monitoring port.
type NodeAddr struct {
	Name                 string
	Port, Route, Monitor int
}

// NewLayout lays out n nodes on free ports (porttest: another listener
// could still take one before a node binds it; an in-process node then
// fails to start with the bind error, and Start lays the cluster out
// again).
func NewLayout(n int) (Layout, error) {
	ports, err := porttest.Free(3 * n)
	if err != nil {
		return Layout{}, err
	}
	l := Layout{Nodes: make([]NodeAddr, n)}
	for i := range l.Nodes {
		l.Nodes[i] = NodeAddr{Name: fmt.Sprintf("n%d", i+1), Port: ports[3*i], Route: ports[3*i+1], Monitor: ports[3*i+2]}
	}
	return l, nil
}

// Routes is the route URL of every node but node i.
func (l Layout) Routes(i int) []string {
	var rs []string
	for j, o := range l.Nodes {
		if j != i {
			rs = append(rs, fmt.Sprintf("nats-route://127.0.0.1:%d", o.Route))
		}
	}
	return rs
}

// ClientURLs is the client URL of every node.
func (l Layout) ClientURLs() []string {
	us := make([]string, len(l.Nodes))
	for i, n := range l.Nodes {
		us[i] = fmt.Sprintf("nats://127.0.0.1:%d", n.Port)
	}
	return us
}

// SpoolURL is the cluster as the README writes --spool:
// nats://127.0.0.1:P1,127.0.0.1:P2,...
func (l Layout) SpoolURL() string {
	hosts := make([]string, len(l.Nodes))
	for i, n := range l.Nodes {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", n.Port)
	}
	return "nats://" + strings.Join(hosts, ",")
}

// Conf is node i's nats-server configuration file: its client, monitoring
// and route ports as laid out, routes to every other node, the cluster's
// name, and JetStream storing in storeDir with the jetstream lines given
// (limits, sync_interval).
func (l Layout) Conf(i int, cluster, storeDir string, jetstream ...string) string {
	n := l.Nodes[i]
	var js strings.Builder
	for _, line := range jetstream {
		js.WriteString("  " + line + "\n")
	}
	return fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
jetstream {
  store_dir: %q
%s}
cluster {
  name: %s
  listen: 127.0.0.1:%d
  routes: [%s]
}
`, n.Name, n.Port, n.Monitor, storeDir, js.String(), cluster, n.Route, strings.Join(l.Routes(i), ", "))
}

// Connect is a JetStream client on url (one or more client URLs, comma
// separated) with the connection's options, closed when the test ends.
func Connect(t testing.TB, url string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("natstest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	return js
}
