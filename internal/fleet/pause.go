package fleet

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// pauses is the fleet-wide pause table: KV RELAY_PAUSES, watched into a
// map. Its goroutine (watch) is started by startPauses and ended by stop.
type pauses struct {
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	pre string // the bucket's subject prefix, "$KV.<bucket>."
	log *zap.Logger

	mu    sync.Mutex
	until map[string]time.Time // by KV key
	ready bool                 // the watcher has delivered the initial values

	cancel context.CancelFunc
	done   chan struct{}
	readyc chan struct{}
}

func startPauses(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, pre string, log *zap.Logger) (*pauses, error) {
	wctx, cancel := context.WithCancel(context.Background())
	w, err := kv.WatchAll(wctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("fleet: watch pauses: %w", unavailable(err))
	}
	p := &pauses{js: js, kv: kv, pre: pre, log: log, until: make(map[string]time.Time),
		cancel: cancel, done: make(chan struct{}), readyc: make(chan struct{})}
	go p.watch(wctx, w)
	select {
	case <-p.readyc:
	case <-ctx.Done():
		p.stop()
		return nil, fmt.Errorf("fleet: watch pauses: %w", ctx.Err())
	}
	return p, nil
}

func (p *pauses) stop() {
	p.cancel()
	<-p.done
}

// watch applies the bucket's updates to the map. A nil entry marks the end
// of the initial values.
func (p *pauses) watch(ctx context.Context, w jetstream.KeyWatcher) {
	defer close(p.done)
	defer w.Stop() //nolint:errcheck // nothing to do
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				p.mu.Lock()
				first := !p.ready
				p.ready = true
				p.mu.Unlock()
				if first {
					close(p.readyc)
				}
				continue
			}
			k, put, v := e.Key(), e.Operation() == jetstream.KeyValuePut, e.Value()
			p.mu.Lock()
			if put && len(v) == 8 {
				t := time.UnixMilli(int64(binary.BigEndian.Uint64(v)))
				if t.After(p.until[k]) {
					p.until[k] = t
				}
			} else {
				delete(p.until, k)
			}
			p.mu.Unlock()
		}
	}
}

func pauseKey(key []byte) string { return base64.RawURLEncoding.EncodeToString(key) }

// Pause holds key (an order key such as "d:<device>", "u:<user>", or a
// pacing slot "pace:<organization>") until until, on every relay of the
// fleet: it is stored with a per-key TTL of until-now, so it disappears by
// itself. A pause never shortens a longer one known here. It returns once
// the pause is stored on a quorum.
func (f *Fleet) Pause(ctx context.Context, key []byte, until time.Time) error {
	ttl := time.Until(until).Round(time.Second)
	if ttl < time.Second {
		if time.Until(until) <= 0 {
			return nil
		}
		ttl = time.Second // the server's smallest TTL
	}
	k := pauseKey(key)
	if cur, ok := f.pause.get(k); ok && !cur.Before(until) {
		return nil
	}
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(until.UnixMilli()))
	msg := &nats.Msg{Subject: f.pause.pre + k, Data: v[:]}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	defer cancel()
	for {
		_, err := f.js.PublishMsg(ctx, msg, jetstream.WithMsgTTL(ttl))
		if err == nil {
			f.pause.set(k, until)
			return nil
		}
		if !retryable(err) || ctx.Err() != nil {
			return fmt.Errorf("fleet: pause: %w", unavailable(err))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fleet: pause: %w", unavailable(errors.Join(err, ctx.Err())))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// PausedUntil returns the end of key's pause as known to this relay (a
// pause set by another relay arrives through the bucket's watch, within a
// round trip), and whether it is paused now. It does not block.
func (f *Fleet) PausedUntil(key []byte) (time.Time, bool) {
	t, ok := f.pause.get(pauseKey(key))
	if !ok || !time.Now().Before(t) {
		return time.Time{}, false
	}
	return t, true
}

func (p *pauses) get(k string) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.until[k]
	if ok && !time.Now().Before(t) {
		delete(p.until, k)
		return time.Time{}, false
	}
	return t, ok
}

func (p *pauses) set(k string, t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t.After(p.until[k]) {
		p.until[k] = t
	}
}
