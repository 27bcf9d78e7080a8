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
// map. Its goroutine (watch) is started by startPauses and ended by stop.
type pauses struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	stream jetstream.Stream // the bucket's stream
	pre    string           // the bucket's subject prefix, "$KV.<bucket>."
	log    *zap.Logger

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
	stream, err := js.Stream(ctx, "KV_"+strings.TrimSuffix(strings.TrimPrefix(pre, "$KV."), "."))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("fleet: pause bucket: %w", unavailable(err))
	}
	p := &pauses{js: js, kv: kv, stream: stream, pre: pre, log: log, until: make(map[string]time.Time),
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

// Pause holds key (an order key such as "d:<device>" or "u:<user>") until
// until, on every relay of the fleet: it is stored with a per-key TTL of until-now, so it disappears by
// itself. A pause never shortens a longer one: the stored pause is read and
// replaced only if it ends earlier, by a compare-and-swap on its revision
// (a concurrent writer makes it read again). It returns once the pause is
// stored on a quorum.
func (f *Fleet) Pause(ctx context.Context, key []byte, until time.Time) error {
	if time.Until(until) <= 0 {
		return nil
	}
	k := pauseKey(key)
	if cur, ok := f.pause.get(k); ok && !cur.Before(until) {
		return nil
	}
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(until.UnixMilli()))
	subj := f.pause.pre + k
	ctx, cancel := context.WithTimeout(ctx, f.cfg.PublishTimeout)
	defer cancel()
	for {
		err := f.tryPause(ctx, k, subj, v[:], until)
		if err == nil {
			return nil
		}
		var apiErr *jetstream.APIError
		conflict := errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
		if !conflict && (!retryable(err) || ctx.Err() != nil) {
			return fmt.Errorf("fleet: pause: %w", unavailable(err))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fleet: pause: %w", unavailable(errors.Join(err, ctx.Err())))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// tryPause is one read and compare-and-swap of a pause.
func (f *Fleet) tryPause(ctx context.Context, k, subj string, v []byte, until time.Time) error {
	var expect uint64
	last, err := f.pause.stream.GetLastMsgForSubject(ctx, subj)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return err
	default:
		expect = last.Sequence
		if len(last.Data) == 8 && last.Header.Get("KV-Operation") == "" {
			cur := time.UnixMilli(int64(binary.BigEndian.Uint64(last.Data)))
			if !cur.Before(until) {
				f.pause.set(k, cur)
				return nil
			}
		}
	}
	ttl := max(time.Until(until).Round(time.Second), time.Second) // the server's smallest TTL
	_, err = f.js.PublishMsg(ctx, &nats.Msg{Subject: subj, Data: v},
		jetstream.WithMsgTTL(ttl), jetstream.WithExpectLastSequencePerSubject(expect))
	if err != nil {
		return err
	}
	f.pause.set(k, until)
	return nil
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
