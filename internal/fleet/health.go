package fleet

import (
	"context"
	"encoding/json"
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
		s, err := f.js.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("fleet: stream %s: %w: %w", name, ErrUnavailable, err)
		}
		infos[g] = s.CachedInfo()
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

// Placement is where the leaders of a lane kind's streams are.
type Placement struct {
	Leaders map[string]string // by stream: its leader's server name ("" none)
	PerNode map[string]int    // by server name: streams it leads
	// Offline: server names that hold a replica of some stream and are
	// offline (no leadership is moved to them). A replica's "current" flag
	// is no guide: it stays false on a stream with no write since its
	// leader was elected.
	Offline map[string]bool
}

// Placement reads the leaders of kind k's streams.
func (f *Fleet) Placement(ctx context.Context, k storage.Kind) (Placement, error) {
	pl := Placement{Leaders: make(map[string]string), Offline: make(map[string]bool)}
	infos := make([]*jetstream.StreamInfo, f.cfg.Streams)
	for g := range f.cfg.Streams {
		s, err := f.js.Stream(ctx, f.n.stream(k, g))
		if err != nil {
			return pl, fmt.Errorf("fleet: placement: %w", unavailable(err))
		}
		infos[g] = s.CachedInfo()
		if c := infos[g].Cluster; c != nil {
			pl.Leaders[infos[g].Config.Name] = c.Leader
			for _, r := range c.Replicas {
				if r.Offline {
					pl.Offline[r.Name] = true
				}
			}
		}
	}
	pl.PerNode = leadersPerNode(infos)
	return pl, nil
}

// balance spreads the leaders of each kind's streams over the nodes that
// hold them: when one node leads more than its share (ceil(streams /
// nodes)), each stream led by an over-loaded node is asked to step down in
// favour of a node that leads less (a JetStream leader step-down with a
// preferred server). The target of stream g is the nodes' sorted list at
// (g + the kind's index), so that relays opening at once ask the same
// moves (the second ask finds the move done, or is refused, harmlessly).
// An offline node is no target.
// It logs the placement it leaves when it moved a leader, and warns when
// one node still leads every stream of a kind. Best effort: errors are
// logged.
func (f *Fleet) balance(ctx context.Context) {
	if f.cfg.Replicas == 1 || f.cfg.Streams == 1 {
		return
	}
	for ki, k := range kinds {
		pl, err := f.Placement(ctx, k)
		if err != nil {
			f.log.Warn("stream leaders: cannot read the placement", zap.Error(err))
			return
		}
		nodes := make([]string, 0, len(pl.PerNode))
		for n := range pl.PerNode {
			if !pl.Offline[n] {
				nodes = append(nodes, n)
			}
		}
		slices.Sort(nodes)
		if len(nodes) < 2 {
			continue
		}
		share := (f.cfg.Streams + len(nodes) - 1) / len(nodes)
		load := pl.PerNode
		moved := 0
		for g := range f.cfg.Streams {
			name := f.n.stream(k, g)
			cur := pl.Leaders[name]
			if cur == "" || load[cur] <= share {
				continue
			}
			target := nodes[(g+ki)%len(nodes)]
			if target == cur || load[target] >= share {
				// The deterministic target is taken: the least loaded.
				target = slices.MinFunc(nodes, func(a, b string) int { return load[a] - load[b] })
			}
			if target == cur {
				continue
			}
			if err := f.stepDown(ctx, name, target); err != nil {
				f.log.Info("stream leader step-down refused", zap.String("stream", name), zap.String("to", target), zap.Error(err))
				continue
			}
			load[cur]--
			load[target]++
			moved++
			f.log.Info("stream leader moved to spread the writes", zap.String("stream", name), zap.String("from", cur), zap.String("to", target))
		}
		if k == storage.KindEvents {
			f.m.setLeaders(load)
		}
		var lines []string
		for _, n := range nodes {
			lines = append(lines, fmt.Sprintf("%s=%d", n, load[n]))
		}
		if slices.Max(slices.Collect(maps.Values(load))) == f.cfg.Streams {
			f.log.Warn("one node leads every stream of a lane kind: its writes do not spread", zap.String("kind", k.String()), zap.String("leaders", strings.Join(lines, " ")))
		} else if moved > 0 {
			f.log.Info("stream leaders", zap.String("kind", k.String()), zap.String("leaders", strings.Join(lines, " ")))
		}
	}
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
