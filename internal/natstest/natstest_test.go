package natstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/svcrelay/relay/internal/poll"
)

// TestClusterSurvivesNodeRestart starts a cluster, stores R3 messages, kills
// the stream leader, stores more, restarts it, and reads everything back.
func TestClusterSurvivesNodeRestart(t *testing.T) {
	c := Start(t, Config{})
	js := Connect(t, c.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	publish := func(n int) {
		t.Helper()
		for i := range n {
			for attempt := 0; ; attempt++ {
				actx, acancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := js.Publish(actx, "t.x", []byte{byte(i)})
				acancel()
				if err == nil {
					break
				}
				if attempt == 50 {
					t.Fatalf("publish: %v", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
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
	poll.Until(t, "the stream to hold the 20 messages after the restart", func() bool {
		s, err := js.Stream(ctx, "T")
		return err == nil && s.CachedInfo().State.Msgs == 20
	})
}
