package fleet

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// pauses is the fleet-wide pause table: KV RELAY_PAUSES, watched into a
// map, and this relay's pauses not stored yet. Its goroutines (watch and
// rewrite) are started by startPauses and ended by stop.
type pauses struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	stream jetstream.Stream // the bucket's stream
	pre    string           // the bucket's subject prefix, "$KV.<bucket>."
	log    *zap.Logger

	mu      sync.Mutex
	until   map[string]time.Time // by KV key
	unsaved map[string]time.Time // this relay's pauses the bucket has not taken yet, by KV key
	ready   bool                 // the watcher has delivered the initial values

	kick   chan struct{} // wakes rewrite: a pause was added to unsaved
	cancel context.CancelFunc
	wg     sync.WaitGroup
	readyc chan struct{}
}

func startPauses(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, pre string, log *zap.Logger) (*pauses, error) {
	wctx, cancel := context.WithCancel(context.Background())
	// The watcher's consumer is created under the client's own request
	// timeout, which a loaded cluster can miss: retried as a create is.
	w, err := retrySetup(ctx, log, func(context.Context) (jetstream.KeyWatcher, error) { return kv.WatchAll(wctx) })
	if err != nil {
		cancel()
		return nil, fmt.Errorf("fleet: watch pauses: %w", unavailable(err))
	}
	// Bounded and asked again: a request that arrives while the bucket's
	// leadership moves is answered by no server.
	name := "KV_" + strings.TrimSuffix(strings.TrimPrefix(pre, "$KV."), ".")
	stream, err := retrySetup(ctx, log, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, name) })
	if err != nil {
		cancel()
		return nil, fmt.Errorf("fleet: pause bucket: %w", unavailable(err))
	}
	p := &pauses{js: js, kv: kv, stream: stream, pre: pre, log: log,
		until: make(map[string]time.Time), unsaved: make(map[string]time.Time),
		kick: make(chan struct{}, 1), cancel: cancel, readyc: make(chan struct{})}
	p.wg.Go(func() { p.watch(wctx, w) })
	p.wg.Go(func() { p.rewrite(wctx) })
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
	p.wg.Wait()
}

// watch applies the bucket's updates to the map. A nil entry marks the end
// of the initial values.
func (p *pauses) watch(ctx context.Context, w jetstream.KeyWatcher) {
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

// Pause holds key (an order key such as "d:<device>" or "u:<user>") until
// until, on every relay of the fleet: it is stored with a per-key TTL of
// until-now, so it disappears by itself. A pause never shortens a longer
// one: the stored pause is read and replaced only if it ends earlier, by a
// compare-and-swap on its revision (a concurrent writer makes it read
// again). It returns once the pause is stored on a quorum. When it cannot
// (ctx or PublishTimeout ends first), the pause holds on this relay at
// once and is written again in the background until the bucket takes it
// or it ends; meanwhile this relay gives no partition up (see Ownership).
func (f *Fleet) Pause(ctx context.Context, key []byte, until time.Time) error {
	if time.Until(until) <= 0 {
		return nil
	}
	k := pauseKey(key)
	if cur, ok := f.pause.get(k); ok && !cur.Before(until) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	defer cancel()
	if err := f.pause.write(ctx, k, until, false); err != nil {
		f.pause.keep(k, until)
		return fmt.Errorf("fleet: pause not stored yet, written again until it is or it ends: %w", unavailable(err))
	}
	return nil
}

// write stores k's pause until until, retrying a conflict, and a failure
// that may pass (any when again is set, the background rewrite's), until
// ctx ends.
func (p *pauses) write(ctx context.Context, k string, until time.Time, again bool) error {
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(until.UnixMilli()))
	subj := p.pre + k
	for {
		err := p.tryWrite(ctx, k, subj, v[:], until)
		if err == nil {
			return nil
		}
		var apiErr *jetstream.APIError
		conflict := errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
		if !conflict && !again && (!retryable(err) || ctx.Err() != nil) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// tryWrite is one read and compare-and-swap of a pause.
func (p *pauses) tryWrite(ctx context.Context, k, subj string, v []byte, until time.Time) error {
	var expect uint64
	last, err := p.stream.GetLastMsgForSubject(ctx, subj)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return err
	default:
		expect = last.Sequence
		if len(last.Data) == 8 && last.Header.Get("KV-Operation") == "" {
			cur := time.UnixMilli(int64(binary.BigEndian.Uint64(last.Data)))
			if !cur.Before(until) {
				p.set(k, cur)
				return nil
			}
		}
	}
	ttl := max(time.Until(until).Round(time.Second), time.Second) // the server's smallest TTL
	_, err = p.js.PublishMsg(ctx, &nats.Msg{Subject: subj, Data: v},
		jetstream.WithMsgTTL(ttl), jetstream.WithExpectLastSequencePerSubject(expect))
	if err != nil {
		return err
	}
	p.set(k, until)
	return nil
}

// keep holds k's pause on this relay and hands it to rewrite.
func (p *pauses) keep(k string, until time.Time) {
	p.set(k, until)
	p.mu.Lock()
	if until.After(p.unsaved[k]) {
		p.unsaved[k] = until
	}
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// rewrite writes the pauses Pause could not store until the bucket takes
// each or it ends: a pause known to one relay only is lost to the relay
// that takes its partition over.
func (p *pauses) rewrite(ctx context.Context) {
	const every = 250 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		for {
			p.mu.Lock()
			todo := make(map[string]time.Time, len(p.unsaved))
			for k, u := range p.unsaved {
				if time.Now().Before(u) {
					todo[k] = u
				} else {
					delete(p.unsaved, k)
				}
			}
			p.mu.Unlock()
			if len(todo) == 0 {
				break
			}
			for k, u := range todo {
				wctx, cancel := context.WithDeadline(ctx, u)
				err := p.write(wctx, k, u, true)
				cancel()
				if err == nil || !time.Now().Before(u) {
					p.mu.Lock()
					if !p.unsaved[k].After(u) {
						delete(p.unsaved, k)
					}
					p.mu.Unlock()
				}
				if ctx.Err() != nil {
					return
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(every):
			}
		}
	}
}

// unwritten reports whether this relay holds a pause the bucket has not
// taken yet (and that has not ended).
func (p *pauses) unwritten() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, u := range p.unsaved {
		if time.Now().Before(u) {
			return true
		}
		delete(p.unsaved, k)
	}
	return false
}

// load reads every pause stored now into the map, not through the
// watcher: a relay taking a partition over must know its keys' pauses
// before it sends, and the watcher may lag (its consumer lost with a node
// and not yet made again) by seconds.
func (p *pauses) load(ctx context.Context) error {
	w, err := p.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer w.Stop() //nolint:errcheck // nothing to do
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("pause watch closed")
			}
			if e == nil {
				return nil
			}
			if v := e.Value(); e.Operation() == jetstream.KeyValuePut && len(v) == 8 {
				p.set(e.Key(), time.UnixMilli(int64(binary.BigEndian.Uint64(v))))
			}
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

// AnyPaused reports whether some key may be paused (a pause is known to
// this relay, expired or not): when false, PausedUntil is zero for every
// key, and the caller may skip building keys.
func (f *Fleet) AnyPaused() bool {
	f.pause.mu.Lock()
	defer f.pause.mu.Unlock()
	return len(f.pause.until) > 0
}
