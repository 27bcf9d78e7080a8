package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/svcrelay/relay/internal/natstest"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// buildNATSServer builds the real nats-server binary, at the version go.mod
// pins, into dir: the same binary the README's commands build.
func buildNATSServer(t *testing.T, dir string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	bin := filepath.Join(dir, "nats-server")
	cmd := exec.Command(goBin, "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	cmd.Dir = harness.ModuleRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build nats-server: %v\n%s", err, out)
	}
	return bin
}

// natsCluster is a JetStream cluster of nats-server processes on 127.0.0.1:
// each node can be killed with SIGKILL and restarted on the same ports
// with the same store, as a crashed server would be.
type natsCluster struct {
	t     *testing.T
	bin   string
	lay   natstest.Layout
	nodes []*natsNode
}

type natsNode struct {
	natstest.NodeAddr
	conf, log, store string
	p                *proc // nil before the first start
}

// startCluster starts three nodes and waits until the cluster serves
// JetStream with every node healthy. Cleanup kills every node.
func startCluster(t *testing.T, bin, dir string) *natsCluster {
	t.Helper()
	lay, err := natstest.NewLayout(3)
	if err != nil {
		t.Fatal(err)
	}
	c := &natsCluster{t: t, bin: bin, lay: lay}
	for i, a := range lay.Nodes {
		nd := &natsNode{NodeAddr: a, conf: filepath.Join(dir, a.Name+".conf"), log: filepath.Join(dir, a.Name+".log"), store: filepath.Join(dir, a.Name)}
		conf := lay.Conf(i, "fleettest", nd.store, "max_memory_store: 64MB", "max_file_store: 1GB")
		if err := os.WriteFile(nd.conf, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, nd)
	}
	for i := range c.nodes {
		c.start(i)
	}
	c.WaitReady(polltest.Max)
	return c
}

func (c *natsCluster) start(i int) {
	c.t.Helper()
	nd := c.nodes[i]
	if nd.p.running() {
		c.t.Fatalf("nats %s: already running", nd.Name)
	}
	nd.p = startProc(c.t, "nats "+nd.Name, c.bin, nd.log, "-c", nd.conf)
}

// Kill sends SIGKILL to node i and waits (10 s at most) for it to end.
func (c *natsCluster) Kill(i int) {
	c.t.Helper()
	nd := c.nodes[i]
	if !nd.p.running() {
		c.t.Fatalf("nats %s: not running", nd.Name)
	}
	nd.p.kill(c.t)
}

// Restart starts node i again (same ports, same store) and waits until
// every running node is healthy.
func (c *natsCluster) Restart(i int, within time.Duration) {
	c.t.Helper()
	c.start(i)
	c.WaitReady(within)
}

// URL is the client URL list as --spool takes it.
func (c *natsCluster) URL() string { return c.lay.SpoolURL() }

func (c *natsCluster) clientURLs() string { return strings.Join(c.lay.ClientURLs(), ",") }

// WaitReady waits until every running node answers its /healthz 200
// (nats-server's health check: JetStream enabled, the meta group, its
// streams and consumers current) and JetStream answers a client (a meta
// leader exists). It fails the test after within.
func (c *natsCluster) WaitReady(within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	hc := &http.Client{Timeout: 2 * time.Second}
	var last string
	for {
		last = c.notReady(hc)
		if last == "" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("nats cluster not ready within %v: %s\n%s", within, last, c.logTails(3000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// notReady says why the cluster is not ready; "" when it is.
func (c *natsCluster) notReady(hc *http.Client) string {
	for _, nd := range c.nodes {
		if nd.p == nil {
			continue
		}
		if !nd.p.running() {
			return fmt.Sprintf("%s exited: %v", nd.Name, nd.p.err)
		}
		if code := get(hc, fmt.Sprintf("http://127.0.0.1:%d/healthz", nd.Monitor)); code != 200 {
			return fmt.Sprintf("%s: /healthz %d", nd.Name, code)
		}
	}
	nc, err := nats.Connect(c.clientURLs(), nats.Timeout(2*time.Second), nats.MaxReconnects(0))
	if err != nil {
		return fmt.Sprintf("connect: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		return fmt.Sprintf("jetstream account info: %v", err)
	}
	return ""
}

// StreamLeader returns the index of the node leading stream, -1 when the
// stream does not exist or has no leader.
func (c *natsCluster) StreamLeader(stream string) int {
	c.t.Helper()
	nc, err := nats.Connect(c.clientURLs(), nats.Timeout(2*time.Second), nats.MaxReconnects(0))
	if err != nil {
		return -1
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return -1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return -1
	}
	info := s.CachedInfo()
	if info.Cluster == nil {
		return -1
	}
	for i, nd := range c.nodes {
		if nd.Name == info.Cluster.Leader {
			return i
		}
	}
	return -1
}

func (c *natsCluster) logTails(n int) string {
	var b strings.Builder
	for _, nd := range c.nodes {
		data, _ := os.ReadFile(nd.log)
		if len(data) > n {
			data = data[len(data)-n:]
		}
		fmt.Fprintf(&b, "--- nats %s log tail:\n%s\n", nd.Name, data)
	}
	return b.String()
}

// TestNATSClusterKillRestart checks the harness itself: an R3 stream keeps
// every acknowledged message through a SIGKILL of its leader, takes
// publishes while that node is down, and the restarted node comes back
// healthy (caught up) on the same ports and store.
func TestNATSClusterKillRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server processes; skipped under -short")
	}
	t.Parallel()
	c := startCluster(t, binaries(t).natsBin, t.TempDir())
	js := natstest.Connect(t, c.clientURLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	// The whole test's bound: only how long a failing test takes to say
	// so (a quiet machine takes seconds; the restart alone may take
	// polltest.Max).
	ctx, cancel := context.WithTimeout(context.Background(), 3*polltest.Max)
	defer cancel()
	// Retried, each try bounded (as fleet.Open does): a JetStream API
	// request sent while a just-started cluster settles its meta leader can
	// go unanswered, and one unbounded try then waited out the whole bound
	// (once in four -race runs on a loaded machine).
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.CreateStream(cctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3, Storage: jetstream.FileStorage})
		ccancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("create stream: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	acked := 0
	publish := func(n int) {
		t.Helper()
		for i := 0; i < n; {
			// Retried while the cluster elects a new leader (bounded by ctx).
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := js.Publish(pctx, "t.x", fmt.Appendf(nil, "%d", acked), jetstream.WithMsgID(fmt.Sprint(acked)))
			pcancel()
			if err != nil {
				if ctx.Err() != nil {
					t.Fatalf("publish %d: %v", acked, err)
				}
				continue
			}
			acked++
			i++
		}
	}
	publish(50)
	leader := c.StreamLeader("T")
	if leader < 0 {
		t.Fatal("stream T has no leader")
	}
	c.Kill(leader)
	publish(50) // two of three nodes: still a quorum
	c.Restart(leader, polltest.Max)
	publish(10)
	s, err := js.Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(acked) {
		t.Fatalf("stream holds %d messages, %d were acknowledged", info.State.Msgs, acked)
	}
	// The restarted node serves the stream's data: read it through that node alone.
	js2 := natstest.Connect(t, c.lay.ClientURLs()[leader])
	s2, err := js2.Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	for {
		info2, err := s2.Info(ctx)
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatal(err)
		}
		if info2 != nil && info2.Cluster != nil && allCurrent(info2.Cluster) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("replicas never current after restart: %+v", info2)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("killed and restarted %s (stream leader); %d messages kept", c.nodes[leader].Name, acked)
}

func allCurrent(ci *jetstream.ClusterInfo) bool {
	if ci.Leader == "" || len(ci.Replicas) != 2 {
		return false
	}
	for _, r := range ci.Replicas {
		if !r.Current || r.Offline {
			return false
		}
	}
	return true
}
