// Package natstest runs a real NATS JetStream cluster inside a test process:
// three nats-server nodes (by default) on 127.0.0.1, routed to each other,
// each with its own store directory under t.TempDir(). A node can be killed
// (Shutdown) and restarted on the same ports with the same store, as a
// crashed and restarted server would be. Cleanup stops every node.
//
// Ports are chosen free (porttest) before the servers start, so that all
// routes can be written into every node's options and a restarted node
// comes back on the same address. Another listener could still take one in
// that instant: the node then fails at once with the listen error, and
// Start lays the cluster out again.
//
// Every wait is bounded (Config.ReadyTimeout) and polls: nothing here sleeps
// for a fixed time hoping the cluster is ready.
//
// Layout (the nodes' ports, routes, and a node's nats-server configuration
// file) also serves the clusters of nats-server processes that test/fleet
// kills with SIGKILL and bench/fleet measures.
package natstest

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/svcrelay/relay/internal/polltest"
)

// Config configures a Cluster. The zero value is three nodes, fsync on
// every write off (the server's default two-minute sync interval) and a
// polltest.Max bound on waits.
type Config struct {
	// Nodes is the number of servers; zero means 3.
	Nodes int
	// SyncAlways makes every node fsync each write before acknowledging it
	// (the server's `sync_interval: always`).
	SyncAlways bool
	// ReadyTimeout bounds Start's and Restart's waits for a JetStream meta
	// leader with every running node current; zero means polltest.Max (the
	// cluster is ready in about 5 s on a loaded 2-core machine, and the
	// bound only decides how long a failing test takes to say so).
	ReadyTimeout time.Duration
	// TLS makes the nodes serve clients over TLS only, with a certificate
	// of a CA made for the cluster (Cluster.Certs), and require a client
	// certificate of that CA. Routes between the nodes stay plain.
	TLS bool
	// Operator runs the nodes in operator mode (JWT and nkey
	// authentication, accounts preloaded in a memory resolver): a client
	// needs the credentials file Cluster.Creds, and the streams live in
	// that user's account, not the global one.
	Operator bool
}

// Cluster is a running in-process JetStream cluster.
type Cluster struct {
	// fatalf reports a failure: t.Fatalf under Start, a panic under New.
	fatalf func(format string, args ...any)
	helper func()
	cfg    Config
	lay    Layout
	certs  Certs      // cfg.TLS
	op     Operator   // cfg.Operator
	mu     sync.Mutex // guards nodes[i].srv
	nodes  []*node
}

type node struct {
	name string
	dir  string
	srv  *server.Server // nil while killed
}

// Start starts the cluster and waits until it is ready (WaitReady). It stops the cluster when the test ends.
func Start(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	c, err := start(cfg, func(int) string { return t.TempDir() }, t.TempDir(), t.Fatalf, t.Helper)
	if c != nil {
		t.Cleanup(c.Close)
	}
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return c
}

// New starts a cluster outside a test (a benchmark program), its stores in
// dir/n1, dir/n2, ... (its TLS and credentials files in dir); the caller
// stops it with Close. Kill, Restart and WaitReady panic where Start's
// cluster would fail the test.
func New(cfg Config, dir string) (*Cluster, error) {
	c, err := start(cfg, func(i int) string { return filepath.Join(dir, fmt.Sprintf("n%d", i+1)) }, dir,
		func(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }, func() {})
	if err != nil && c != nil {
		c.Close()
		return nil, err
	}
	return c, err
}

func start(cfg Config, dir func(int) string, secrets string, fatalf func(string, ...any), helper func()) (*Cluster, error) {
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = polltest.Max
	}
	// A port taken between NewLayout and a node's listen fails that
	// node's start at once; the cluster is then laid out again.
	var c *Cluster
	var err error
	for try := 0; try < 3; try++ {
		if c, err = startOnce(cfg, dir, secrets, fatalf, helper); !errors.Is(err, errListen) {
			break
		}
		c.Close()
		for _, n := range c.nodes {
			os.RemoveAll(n.dir) // a fresh cluster's stores: nothing of the failed one
		}
	}
	if err != nil {
		return c, err
	}
	return c, c.waitReady()
}

func startOnce(cfg Config, dir func(int) string, secrets string, fatalf func(string, ...any), helper func()) (*Cluster, error) {
	lay, err := NewLayout(cfg.Nodes)
	if err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, lay: lay, fatalf: fatalf, helper: helper}
	if cfg.TLS {
		if c.certs, err = WriteCerts(secrets); err != nil {
			return nil, fmt.Errorf("certificates: %w", err)
		}
	}
	if cfg.Operator {
		if c.op, err = WriteOperator(secrets); err != nil {
			return nil, fmt.Errorf("operator: %w", err)
		}
	}
	for i, n := range lay.Nodes {
		c.nodes = append(c.nodes, &node{name: n.Name, dir: dir(i)})
	}
	for i := range c.nodes {
		if err := c.start(i); err != nil {
			return c, fmt.Errorf("start %s: %w", c.nodes[i].name, err)
		}
	}
	return c, nil
}

// Close stops every node.
func (c *Cluster) Close() { c.stopAll() }

func (c *Cluster) options(i int) (*server.Options, error) {
	n, addr := c.nodes[i], c.lay.Nodes[i]
	var routes []*url.URL
	for _, r := range c.lay.Routes(i) {
		u, _ := url.Parse(r) // nats-route://127.0.0.1:port
		routes = append(routes, u)
	}
	opts := &server.Options{
		ServerName:             n.name,
		Host:                   "127.0.0.1",
		Port:                   addr.Port,
		NoLog:                  true,
		NoSigs:                 true,
		JetStream:              true,
		StoreDir:               n.dir,
		JetStreamMaxMemory:     64 << 20,
		JetStreamMaxStore:      1 << 30,
		DisableJetStreamBanner: true,
		SyncAlways:             c.cfg.SyncAlways,
		Cluster: server.ClusterOpts{
			Name: "relaytest",
			Host: "127.0.0.1",
			Port: addr.Route,
		},
		Routes: routes,
	}
	if c.cfg.TLS {
		tc, err := c.certs.serverTLS()
		if err != nil {
			return nil, err
		}
		opts.TLSConfig, opts.TLS, opts.TLSVerify = tc, true, true
	}
	if c.cfg.Operator {
		if err := c.op.configure(opts); err != nil {
			return nil, err
		}
	}
	return opts, nil
}

func (c *Cluster) start(i int) error {
	opts, err := c.options(i)
	if err != nil {
		return err
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return err
	}
	// The server reports a port it cannot listen on only to its logger,
	// and would otherwise be waited for until ReadyTimeout.
	fatal := &fatalLog{}
	s.SetLogger(fatal, false, false)
	s.Start()
	for deadline := time.Now().Add(c.cfg.ReadyTimeout); !s.ReadyForConnections(100 * time.Millisecond); {
		if err := fatal.err(); err != nil || time.Now().After(deadline) {
			s.Shutdown()
			if err != nil {
				return err
			}
			return fmt.Errorf("not accepting connections within %v", c.cfg.ReadyTimeout)
		}
	}
	c.mu.Lock()
	c.nodes[i].srv = s
	c.mu.Unlock()
	return nil
}

// errListen marks a node's start that failed on a port another listener
// took after NewLayout chose it.
var errListen = errors.New("listen")

// fatalLog keeps the first fatal line of a server (NoLog keeps the rest
// quiet).
type fatalLog struct {
	mu    sync.Mutex
	fatal string
}

func (l *fatalLog) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fatal == "" {
		return nil
	}
	return fmt.Errorf("%w: %s", errListen, l.fatal)
}

func (l *fatalLog) Fatalf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fatal == "" {
		l.fatal = fmt.Sprintf(format, v...)
	}
}

func (*fatalLog) Noticef(string, ...any) {}
func (*fatalLog) Warnf(string, ...any)   {}
func (*fatalLog) Errorf(string, ...any)  {}
func (*fatalLog) Debugf(string, ...any)  {}
func (*fatalLog) Tracef(string, ...any)  {}

func (c *Cluster) stopAll() {
	for i := range c.nodes {
		c.stop(i)
	}
}

func (c *Cluster) stop(i int) {
	c.mu.Lock()
	s := c.nodes[i].srv
	c.nodes[i].srv = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// URLs returns the client URLs of all nodes (killed ones included: clients
// are expected to be given the whole list); tls://host:port with Config.TLS.
func (c *Cluster) URLs() []string {
	us := c.lay.ClientURLs()
	if c.cfg.TLS {
		for i, u := range us {
			us[i] = "tls://" + strings.TrimPrefix(u, "nats://")
		}
	}
	return us
}

// JetStream is a JetStream client on the cluster for a test's checks, on
// its own connection (with ClientOptions), closed when the test ends.
func (c *Cluster) JetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	return Connect(t, c.URL(), c.ClientOptions()...)
}

// URL is URLs joined by commas, as nats.Connect and --spool take them.
func (c *Cluster) URL() string { return strings.Join(c.URLs(), ",") }

// Server returns node i's server, nil while it is killed.
func (c *Cluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].srv
}

// Len is the number of nodes.
func (c *Cluster) Len() int { return len(c.nodes) }

// Kill shuts node i down (its store stays for Restart).
func (c *Cluster) Kill(i int) { c.stop(i) }

// Restart starts node i again on the same ports with the same store and
// waits until the cluster is ready (WaitReady).
func (c *Cluster) Restart(i int) {
	c.helper()
	if c.Server(i) != nil {
		c.fatalf("natstest: restart %s: still running", c.nodes[i].name)
	}
	if err := c.start(i); err != nil {
		c.fatalf("natstest: restart %s: %v", c.nodes[i].name, err)
	}
	c.WaitReady()
}

// StreamLeader returns the index of the node leading stream (in the
// global account, or the user's with Config.Operator), -1 when none does.
func (c *Cluster) StreamLeader(stream string) int {
	account := server.DEFAULT_GLOBAL_ACCOUNT
	if c.cfg.Operator {
		account = c.op.Account
	}
	for i := range c.nodes {
		if s := c.Server(i); s != nil && s.JetStreamIsStreamLeader(account, stream) {
			return i
		}
	}
	return -1
}

// WaitReady waits until some running node is the JetStream meta leader,
// every running node is current with it, and the leader has seen every
// running node online (it places a stream's replicas only on those); it
// fails the test after Config.ReadyTimeout.
func (c *Cluster) WaitReady() {
	c.helper()
	if err := c.waitReady(); err != nil {
		c.fatalf("natstest: %v", err)
	}
}

func (c *Cluster) waitReady() error {
	deadline := time.Now().Add(c.cfg.ReadyTimeout)
	for !c.ready() {
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not ready within %v", c.cfg.ReadyTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func (c *Cluster) ready() bool {
	var up []*server.Server
	for i := range c.nodes {
		if s := c.Server(i); s != nil {
			up = append(up, s)
		}
	}
	leader := false
	for _, s := range up {
		if !s.JetStreamIsCurrent() {
			return false
		}
		if s.JetStreamIsLeader() {
			// The leader places replicas only on the peers it has seen
			// online with their stats; until it saw every running node,
			// creating an R3 stream fails with "no suitable peers for
			// placement, peer offline".
			if len(s.JetStreamClusterPeers()) < len(up) {
				return false
			}
			leader = true
		}
	}
	return leader
}
