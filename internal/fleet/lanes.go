package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
)

// Lane stops held by the fleet: an operator's stop of a lane (the admin
// API's pause) is a key of KV RELAY_LANES, written by the relay that was
// asked and watched by every relay, so that the lane stays stopped in
// every partition, on every relay, also after its partitions move, until
// a resume (on any relay) deletes it. The engine applies them (delivery:
// SharedLanes); this file keeps the bucket and calls the engine's watcher.

// laneStop is a stopped lane as the bucket stores it.
type laneStop struct {
	Kind    storage.Kind `json:"kind"`
	APIKey  string       `json:"api_key"`
	Options string       `json:"options"`
	Reason  string       `json:"reason"`
	By      string       `json:"by"` // the relay asked
}

// laneStopKey is lane's key in the bucket: the kind and a hash of the rest
// (an api_key and options are not KV key characters).
func laneStopKey(l storage.LaneKey) string {
	h := sha256.Sum256([]byte(l.APIKey + "\x00" + l.Options))
	return l.Kind.String() + "." + hex.EncodeToString(h[:16])
}

// laneWatcher is a WatchLanes function.
type laneWatcher func(lane storage.LaneKey, stopped bool, reason string)

// laneStops watches the bucket; its goroutine (watch) is started by
// startLaneStops and ended by stop. The goroutine owns the stopped lanes
// and the watchers: a watcher added (addc) is told the lanes stopped now
// in the same goroutine as every later change, so it sees them in order.
type laneStops struct {
	kv  jetstream.KeyValue
	log *zap.Logger

	addc   chan laneWatcher
	cancel context.CancelFunc
	done   chan struct{}
}

func (f *Fleet) startLaneStops(ctx context.Context) error {
	cfg := jetstream.KeyValueConfig{
		Bucket:   f.n.laneBucket(),
		History:  1,
		Storage:  jetstream.FileStorage,
		Replicas: f.cfg.Replicas,
	}
	kv, err := retrySetup(ctx, f.log, func(ctx context.Context) (jetstream.KeyValue, error) {
		if _, err := f.js.KeyValue(ctx, cfg.Bucket); errors.Is(err, jetstream.ErrBucketNotFound) {
			return f.js.CreateKeyValue(ctx, cfg)
		}
		return f.js.UpdateKeyValue(ctx, cfg)
	})
	if err != nil {
		return fmt.Errorf("fleet: lane bucket: %w", unavailable(err))
	}
	wctx, cancel := context.WithCancel(context.Background())
	// The watcher's consumer is created under the client's own request
	// timeout, which a loaded cluster can miss: retried as the bucket's.
	w, err := retrySetup(ctx, f.log, func(context.Context) (jetstream.KeyWatcher, error) { return kv.WatchAll(wctx) })
	if err != nil {
		cancel()
		return fmt.Errorf("fleet: watch lane stops: %w", unavailable(err))
	}
	ls := &laneStops{kv: kv, log: f.log, addc: make(chan laneWatcher), cancel: cancel, done: make(chan struct{})}
	ready := make(chan struct{})
	go ls.watch(wctx, w, ready)
	select {
	case <-ready:
	case <-ctx.Done():
		ls.stop()
		return fmt.Errorf("fleet: watch lane stops: %w", ctx.Err())
	}
	f.lanes = ls
	return nil
}

func (ls *laneStops) stop() {
	ls.cancel()
	<-ls.done
}

// watch applies the bucket's updates and tells the watchers. A nil entry
// marks the end of the initial values.
func (ls *laneStops) watch(ctx context.Context, w jetstream.KeyWatcher, ready chan struct{}) {
	defer close(ls.done)
	defer w.Stop()                     //nolint:errcheck // nothing to do
	lanes := make(map[string]laneStop) // by key
	var subs []laneWatcher
	for {
		select {
		case <-ctx.Done():
			return
		case fn := <-ls.addc:
			subs = append(subs, fn)
			for _, st := range lanes {
				fn(st.lane(), true, st.Reason)
			}
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				if ready != nil {
					close(ready)
					ready = nil
				}
				continue
			}
			var st laneStop
			put := e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &st) == nil
			if put {
				lanes[e.Key()] = st
			} else {
				var was bool
				if st, was = lanes[e.Key()]; !was {
					continue // a resume of a lane not stopped
				}
				delete(lanes, e.Key())
			}
			for _, fn := range subs {
				fn(st.lane(), put, st.Reason)
			}
		}
	}
}

func (st laneStop) lane() storage.LaneKey {
	return storage.LaneKey{Kind: st.Kind, APIKey: st.APIKey, Options: st.Options}
}

// StopLane stops lane on every relay of the fleet until ResumeLane: it
// returns once the stop is stored on a quorum; every relay (this one
// included) then hears of it through WatchLanes.
func (f *Fleet) StopLane(ctx context.Context, lane storage.LaneKey, reason string) error {
	v, _ := json.Marshal(laneStop{Kind: lane.Kind, APIKey: lane.APIKey, Options: lane.Options, Reason: reason, By: f.cfg.Name})
	if _, err := f.lanes.kv.Put(ctx, laneStopKey(lane), v); err != nil {
		return fmt.Errorf("fleet: stop lane: %w", unavailable(err))
	}
	return nil
}

// ResumeLane ends lane's stop on every relay (nothing when it is not
// stopped).
func (f *Fleet) ResumeLane(ctx context.Context, lane storage.LaneKey) error {
	if err := f.lanes.kv.Delete(ctx, laneStopKey(lane)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("fleet: resume lane: %w", unavailable(err))
	}
	return nil
}

// WatchLanes calls fn for every lane stopped now, then for every stop and
// resume from any relay, in order, from the bucket's watcher goroutine:
// fn must not block. It has no effect after Close.
func (f *Fleet) WatchLanes(fn func(lane storage.LaneKey, stopped bool, reason string)) {
	select {
	case f.lanes.addc <- fn:
	case <-f.lanes.done:
	}
}
