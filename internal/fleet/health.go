package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
)

// Writable reports whether every events stream can take an append now: nil
// when each one's leader answers with a quorum of its replicas (itself
// included) current, ErrUnavailable otherwise (no leader, no answer before
// ctx ends, too few replicas). It is one request per stream; a readiness
// check should bound ctx tightly (an append without a quorum waits
// PublishTimeout for its error). It also updates the leaders-per-node
// gauge.
func (f *Fleet) Writable(ctx context.Context) error {
	infos := make([]*jetstream.StreamInfo, f.cfg.Streams)
	for g := range f.cfg.Streams {
		name := f.n.stream(storage.KindEvents, g)
		info, err := f.streamInfo(ctx, name)
		if err != nil {
			return fmt.Errorf("fleet: stream %s: %w: %w", name, ErrUnavailable, err)
		}
		infos[g] = info
	}
	f.m.setLeaders(leadersPerNode(infos))
	for _, info := range infos {
		if info == nil || info.Cluster == nil {
			continue // a single server: it answered
		}
		c := info.Cluster
		if c.Leader == "" {
			return fmt.Errorf("fleet: stream %s has no leader: %w", info.Config.Name, ErrUnavailable)
		}
		current, size := 1, 1+len(c.Replicas)
		for _, r := range c.Replicas {
			if r.Current && !r.Offline {
				current++
			}
		}
		if current < size/2+1 {
			return fmt.Errorf("fleet: stream %s: %d of %d replicas current, no quorum: %w", info.Config.Name, current, size, ErrUnavailable)
		}
	}
	return nil
}

// streamInfo reads a stream's info (see stream).
func (f *Fleet) streamInfo(ctx context.Context, name string) (*jetstream.StreamInfo, error) {
	s, err := f.stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return s.CachedInfo(), nil
}

// stream looks a stream up (its info), the request bounded and asked again
// while unanswered (see asked).
func (f *Fleet) stream(ctx context.Context, name string) (jetstream.Stream, error) {
	return asked(ctx, f, func(ctx context.Context) (jetstream.Stream, error) { return f.js.Stream(ctx, name) })
}

// asked calls req with a context bounded by attemptCtx, again while it
// fails retryably (no answer among others), until ctx ends. For requests
// that only a stream's leader answers (its info: nats-server's
// jsStreamInfoRequest, the other replicas stay silent unless they see the
// group leaderless; a message get): one that arrives while the leadership
// changes hands, as after a step-down, can be answered by no server, and
// bounded only by a long ctx it waits all of it (minutes in the tests),
// although the next one is answered at once. A connection closed for good
// answers nothing again: asking on would hold a stopping owner (its
// partition's last removal) for all of ctx.
func asked[T any](ctx context.Context, f *Fleet, req func(context.Context) (T, error)) (T, error) {
	for {
		actx, cancel := f.attemptCtx(ctx)
		v, err := req(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !retryable(err) || f.nc.IsClosed() {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// leadersPerNode counts the streams each node leads (every node that
// holds a replica is listed, with 0 when it leads none).
func leadersPerNode(infos []*jetstream.StreamInfo) map[string]int {
	n := make(map[string]int)
	for _, info := range infos {
		if info == nil || info.Cluster == nil {
			continue
		}
		if info.Cluster.Leader != "" {
			n[info.Cluster.Leader]++
		}
		for _, r := range info.Cluster.Replicas {
			if _, ok := n[r.Name]; !ok {
				n[r.Name] = 0
			}
		}
	}
	return n
}

// liveWindow is how recently a stream's leader must have heard from a
// replica for leadership to be moved to it: three of the server's 1 s Raft
// heartbeats, the window in which nats-server itself takes a preferred
// server as healthy.
const liveWindow = 3 * time.Second

// Placement is where the leaders of a lane kind's streams are.
type Placement struct {
	Leaders map[string]string // by stream: its leader's server name ("" none)
	PerNode map[string]int    // by server name: streams it leads
	// Offline: server names that hold a replica of some stream and are
	// offline.
	Offline map[string]bool
	// Live, by stream: the followers its leader heard from within
	// liveWindow and does not count offline, the only servers its
	// leadership is moved to. A replica's "current" flag is no guide: it
	// stays false on a stream with no write since its leader was elected.
	Live map[string][]string
}

// Placement reads the leaders of kind k's streams.
func (f *Fleet) Placement(ctx context.Context, k storage.Kind) (Placement, error) {
	pl := Placement{Leaders: make(map[string]string), Offline: make(map[string]bool), Live: make(map[string][]string)}
	infos := make([]*jetstream.StreamInfo, f.cfg.Streams)
	for g := range f.cfg.Streams {
		info, err := f.streamInfo(ctx, f.n.stream(k, g))
		if err != nil {
			return pl, fmt.Errorf("fleet: placement: %w", unavailable(err))
		}
		infos[g] = info
		if c := info.Cluster; c != nil {
			pl.Leaders[info.Config.Name] = c.Leader
			for _, r := range c.Replicas {
				if r.Offline {
					pl.Offline[r.Name] = true
				} else if c.Leader != "" && r.Active <= liveWindow {
					pl.Live[info.Config.Name] = append(pl.Live[info.Config.Name], r.Name)
				}
			}
		}
	}
	pl.PerNode = leadersPerNode(infos)
	return pl, nil
}

// balance spreads the leaders of each kind's streams over the nodes that
// hold them: while one node leads more than its share (ceil(streams /
// nodes)), one stream it leads is asked to step down in favour of a node
// that leads less than its share (a JetStream leader step-down with a
// preferred server), and balance waits until the stream has a new leader
// before it reads the placement again and moves the next: a relay never
// has more than one of its streams without a leader, and a cluster too
// slow to elect one stops the round (stepWait). The target of stream g is
// the nodes' sorted list at (g + the kind's index), so that relays opening
// at once ask the same moves (the second ask finds the move done, or is
// refused, harmlessly); it must be one of the stream's live followers
// (Placement.Live). It logs the placement it leaves when it moved a
// leader, and warns when one node still leads every stream of a kind. Best
// effort: errors are logged.
func (f *Fleet) balance(ctx context.Context) {
	if f.cfg.Replicas == 1 || f.cfg.Streams == 1 {
		return
	}
	for ki, k := range kinds {
		var pl Placement
		var nodes []string
		moved := 0
		for {
			var err error
			if pl, err = f.Placement(ctx, k); err != nil {
				if errors.Is(ctx.Err(), context.Canceled) {
					return // closing
				}
				f.log.Warn("stream leaders: cannot read the placement", zap.Error(err))
				return
			}
			nodes = nodes[:0]
			for n := range pl.PerNode {
				if !pl.Offline[n] {
					nodes = append(nodes, n)
				}
			}
			slices.Sort(nodes)
			if moved == f.cfg.Streams { // each stream moved once at most
				break
			}
			name, from, to := f.nextMove(pl, nodes, k, ki)
			if name == "" {
				break
			}
			if err := f.stepDown(ctx, name, to); err != nil {
				f.log.Info("stream leader step-down refused", zap.String("stream", name), zap.String("to", to), zap.Error(err))
				break
			}
			leader, err := f.waitLeader(ctx, name, from)
			if err != nil {
				if errors.Is(ctx.Err(), context.Canceled) {
					return // closing
				}
				f.log.Warn("stream leader: no new leader after a step-down; moving no more leaders until the next check",
					zap.String("stream", name), zap.String("from", from), zap.Error(err))
				return
			}
			moved++
			f.log.Info("stream leader moved to spread the writes", zap.String("stream", name), zap.String("from", from), zap.String("to", leader))
		}
		if k == storage.KindEvents {
			f.m.setLeaders(pl.PerNode)
		}
		if len(nodes) < 2 {
			continue
		}
		var lines []string
		for _, n := range nodes {
			lines = append(lines, fmt.Sprintf("%s=%d", n, pl.PerNode[n]))
		}
		if slices.Max(slices.Collect(maps.Values(pl.PerNode))) == f.cfg.Streams {
			f.log.Warn("one node leads every stream of a lane kind: its writes do not spread", zap.String("kind", k.String()), zap.String("leaders", strings.Join(lines, " ")))
		} else if moved > 0 {
			f.log.Info("stream leaders", zap.String("kind", k.String()), zap.String("leaders", strings.Join(lines, " ")))
		}
	}
}

// nextMove picks the first stream of kind k (ki its index in kinds) led by
// a node above its share and the node to hand it to (see balance); name is
// "" when there is none.
func (f *Fleet) nextMove(pl Placement, nodes []string, k storage.Kind, ki int) (name, from, to string) {
	if len(nodes) < 2 {
		return "", "", ""
	}
	share := (f.cfg.Streams + len(nodes) - 1) / len(nodes)
	load := pl.PerNode
	for g := range f.cfg.Streams {
		name := f.n.stream(k, g)
		cur := pl.Leaders[name]
		if cur == "" || load[cur] <= share {
			continue
		}
		var targets []string // sorted, as nodes
		for _, n := range nodes {
			if load[n] < share && slices.Contains(pl.Live[name], n) {
				targets = append(targets, n)
			}
		}
		if len(targets) == 0 {
			continue
		}
		to := nodes[(g+ki)%len(nodes)]
		if !slices.Contains(targets, to) {
			// The deterministic target is taken: the least loaded.
			to = slices.MinFunc(targets, func(a, b string) int { return load[a] - load[b] })
		}
		return name, cur, to
	}
	return "", "", ""
}

// startRebalance runs balance every interval until Close (with one stream
// per kind there is nothing to spread). Each run is bounded; a failed one
// is logged by balance and tried again at the next tick.
func (f *Fleet) startRebalance(every time.Duration) {
	if f.cfg.Replicas == 1 || f.cfg.Streams == 1 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.rebalanceStop, f.rebalanceDone = cancel, make(chan struct{})
	go func() {
		defer close(f.rebalanceDone)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			f.balance(bctx)
			cancel()
		}
	}()
}

// stepWait bounds balance's wait for a stream's new leader after a
// step-down: the preferred server is elected within a second on a sound
// cluster, and otherwise another one after the server's election time-out
// (4 to 9 s).
const stepWait = 30 * time.Second

// waitLeader waits until stream has a leader other than from (the one
// that stepped down) and returns its name; an error when stepWait or ctx
// ends first.
func (f *Fleet) waitLeader(ctx context.Context, stream, from string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, stepWait)
	defer cancel()
	for {
		info, err := f.streamInfo(ctx, stream)
		if err == nil && info.Cluster != nil && info.Cluster.Leader != "" && info.Cluster.Leader != from {
			return info.Cluster.Leader, nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return "", err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stepDown asks stream's leader to hand over to the server named to.
func (f *Fleet) stepDown(ctx context.Context, stream, to string) error {
	body, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": to}})
	actx, cancel := f.attemptCtx(ctx)
	defer cancel()
	resp, err := f.nc.RequestWithContext(actx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, body)
	if err != nil {
		return err
	}
	var a struct {
		Success bool `json:"success"`
		Error   *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &a); err != nil {
		return err
	}
	if a.Error != nil {
		return fmt.Errorf("jetstream: %s", a.Error.Description)
	}
	return nil
}
