package natstest

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/porttest"
)

// TestClusterSurvivesNodeRestart starts a cluster, stores R3 messages, kills
// the stream leader, stores more, restarts it, and reads everything back.
func TestClusterSurvivesNodeRestart(t *testing.T) {
	c := Start(t, Config{})
	js := Connect(t, c.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	// The whole test's bound: only how long a failing test takes to say so.
	ctx, cancel := context.WithTimeout(context.Background(), 3*polltest.Max)
	defer cancel()
	// retry calls try until it succeeds, each call bounded by a few
	// seconds: a JetStream API request sent while the cluster settles its
	// meta or stream leader can go unanswered, and is sent again.
	retry := func(what string, try func(context.Context) error) {
		t.Helper()
		for {
			actx, acancel := context.WithTimeout(ctx, 5*time.Second)
			err := try(actx)
			acancel()
			if err == nil {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	retry("create stream", func(ctx context.Context) error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3})
		return err
	})
	sent := 0
	publish := func(n int) {
		t.Helper()
		for range n {
			// Deduplicated by its id: a message stored but answered too
			// late for its try is not stored twice by the next.
			retry("publish", func(ctx context.Context) error {
				_, err := js.Publish(ctx, "t.x", []byte{byte(sent)}, jetstream.WithMsgID(strconv.Itoa(sent)))
				return err
			})
			sent++
		}
	}
	publish(10)
	l := c.StreamLeader("T")
	if l < 0 {
		t.Fatal("no stream leader")
	}
	c.Kill(l)
	if c.Server(l) != nil {
		t.Fatal("killed node still listed")
	}
	publish(10)
	c.Restart(l)
	polltest.Until(t, "the stream to hold the 20 messages after the restart", func() bool {
		s, err := js.Stream(ctx, "T")
		return err == nil && s.CachedInfo().State.Msgs == 20
	})
}

// TestTakenPortFailsStart: a node whose port another listener took fails
// its start with the listen error (which Start lays the cluster out again
// for), not after waiting ReadyTimeout.
func TestTakenPortFailsStart(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	route, err := porttest.Free(1)
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{
		cfg:   Config{ReadyTimeout: polltest.Max},
		lay:   Layout{Nodes: []NodeAddr{{Name: "n1", Port: taken.Addr().(*net.TCPAddr).Port, Route: route[0]}}},
		nodes: []*node{{name: "n1", dir: t.TempDir()}},
	}
	defer c.Close()
	if err := c.start(0); !errors.Is(err, errListen) {
		t.Fatalf("start on a taken port: %v, want the listen error", err)
	}
}
