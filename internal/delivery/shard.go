package delivery

import (
	"container/heap"
	"context"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/throttle"
	"github.com/svcrelay/relay/internal/upstream"
)

// shard owns the events of the OrderKeys that hash to it and has at most one
// request in flight, so one key's events are sent in order.
type shard struct {
	lr  *laneRunner
	idx int

	mu      sync.Mutex
	in      []item // handed over by the reader
	wake    chan struct{}
	running bool // the shard's goroutine runs

	// owned by the shard goroutine
	ready     queue
	held      map[string]*held // nil until a key is held
	heap      heldHeap
	capEvents int // lowered by 413 and bisection, doubled back on success
	bo        *Retry
	body      []byte
	batch     []item
	dead      []deadItem
	keybuf    []byte
	spare     []item
	lastWarn  time.Time
	failures  int
	// lastAnswer is the last retryable answer since a 200, for the
	// expired dead letters.
	lastAnswer []byte
	pacedKeys  []string // of s.batch, for Throttle.Admitted on a 200
	gen        uint64   // the Throttle's pause generation when s.batch was built
}

type deadItem struct {
	it     item
	reason string
	answer []byte // nil: the request's answer
}

func newShard(lr *laneRunner, idx int) *shard {
	cfg := lr.p.cfg
	return &shard{lr: lr, idx: idx, wake: make(chan struct{}, 1), capEvents: lr.p.live.Load().MaxBatchEvents,
		bo: NewRetry(cfg.RetryInitial, cfg.RetryMax)}
}

// shardLinger is how long a shard's goroutine waits for records once it
// has nothing queued or held before it ends (the next hand-over starts it
// again): an idle lane keeps no goroutine, a busy one does not start one
// per request.
const shardLinger = time.Second

// give hands items over from the reader, starting the shard's goroutine
// if it is not running; it never blocks on the shard.
func (s *shard) give(its []item) {
	s.mu.Lock()
	s.in = append(s.in, its...)
	start := !s.running
	s.running = true
	s.mu.Unlock()
	if start {
		s.start()
	} else {
		poke(s.wake)
	}
}

// resume starts the shard's goroutine if an earlier Run left it records.
func (s *shard) resume() {
	s.mu.Lock()
	start := !s.running && (len(s.in) > 0 || s.ready.len() > 0 || len(s.heap) > 0)
	s.running = s.running || start
	s.mu.Unlock()
	if start {
		s.start()
	}
}

// start runs the shard's goroutine with its lane's Run contexts; s.running
// was set by the caller.
func (s *shard) start() {
	lr := s.lr
	ctx, drain := lr.sctx, lr.sdrain
	lr.swg.Add(1)
	go func() {
		defer lr.swg.Done()
		if !s.run(ctx, drain) {
			s.mu.Lock()
			s.running = false
			s.mu.Unlock()
		}
	}()
}

// exitIfIdle sets running false if the shard has nothing queued, held or
// handed over; its goroutine then returns.
func (s *shard) exitIfIdle() bool {
	if s.ready.len() > 0 || len(s.heap) > 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.in) > 0 {
		return false
	}
	s.running = false
	return true
}

func (s *shard) takeIn() {
	s.mu.Lock()
	in := s.in
	s.in = s.spare[:0]
	s.mu.Unlock()
	for _, it := range in {
		s.ready.push(it)
	}
	clear(in)
	s.spare = in[:0]
}

// run is the shard's loop: wait for a full batch, the flush interval or a
// pause's end; build a batch; send it; handle the answer. It returns false
// when ctx ends, true when the shard was idle for shardLinger (s.running is
// then false already: a hand-over may have started the next goroutine).
func (s *shard) run(ctx, drainCtx context.Context) bool {
	p := s.lr.p
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.takeIn()
		if ctx.Err() != nil {
			return false
		}
		if c := s.lr.stop.Resumed(); c != nil {
			s.shrink()
			if s.exitIfIdle() {
				return true // the lane is stopped and this shard holds nothing
			}
			select {
			case <-c:
			case <-ctx.Done():
				return false
			}
			continue
		}
		now := time.Now()
		s.releaseHeld(now)
		lv := p.live.Load()
		var wait time.Duration = -1
		if s.ready.len() > 0 {
			full := s.ready.len() >= min(s.capEvents, lv.MaxBatchEvents) || s.ready.bytes >= lv.MaxBatchBytes ||
				s.lr.readerWaits.Load() // the reader waits for this shard's answers
			due := s.ready.peek().enq.Add(lv.FlushInterval)
			if full || !now.Before(due) {
				wait = 0
			} else {
				wait = due.Sub(now)
			}
		}
		if len(s.heap) > 0 {
			if d := s.heap[0].until.Sub(now); wait < 0 || d < wait {
				wait = max(d, 0)
			}
		}
		if wait != 0 {
			idle := wait < 0
			if idle {
				s.shrink() // nothing queued or held: idle until the reader gives more
				wait = shardLinger
			}
			timer.Reset(wait)
			select {
			case <-s.wake:
			case <-lv.changed: // a reload: wait again on the new limits
			case <-timer.C:
				if idle && s.exitIfIdle() {
					return true
				}
			case <-ctx.Done():
				return false
			}
			timer.Stop() // (Go 1.23 timers: no stale tick after Stop)
			continue
		}
		s.gen = p.thr.Gen()
		body := s.build(now)
		if len(s.dead) > 0 && !s.flushDead(ctx, drainCtx, nil) {
			s.unbuild()
			return false
		}
		if len(s.batch) == 0 {
			s.putBody()
			continue
		}
		if p.afterBuild != nil {
			p.afterBuild(s)
		}
		if s.pausedSinceBuild() {
			// A 429 of another shard or lane paused a key of this batch
			// after it was built: checked again at send time, so that a
			// paused key gets nothing whichever shard holds it. Built
			// again, its events now held.
			s.unbuild()
			continue
		}
		if !storage.Leased(drainCtx) {
			// The partition's lease ran out: nothing is sent. Its
			// cancellation follows, unless a renewal in flight extends
			// it: then the batch is built again.
			s.unbuild()
			if !sleep(drainCtx, storage.LeaseRecheck) {
				return false
			}
			continue
		}
		sl := p.live.Load() // a reload during the wait may have changed the URL
		url := sl.url
		release := func() {}
		if f := p.form; f != nil {
			url = f.URL(s.lr.key.APIKey) // read at each request: a reload may change it
			if f.Pacer != nil {
				r, err := f.Pacer.Acquire(ctx, s.lr.key.APIKey, len(s.batch))
				if err != nil { // ctx ended
					s.unbuild()
					return false
				}
				release = r
			}
		}
		res := p.send.Do(drainCtx, &upstream.Request{URL: url, ContentType: s.lr.frame.ContentType, Body: body, Gzip: sl.Gzip, Kind: p.name})
		release()
		if p.m.requests != nil {
			p.m.requests.WithLabelValues(res.Kind.String()).Inc()
		}
		if drainCtx.Err() != nil {
			// Abandoned: the batch stays in the spool (and in this shard's
			// queue, should Run be called again). The request may still be
			// sending the body, which Do did not copy: drop it, never reuse.
			s.body = nil
			s.requeue(s.batch)
			return false
		}
		s.putBody() // sent
		ok := s.handle(ctx, drainCtx, res)
		// The batch's items are done or queued again: drop the references
		// (an idle shard's last batch would keep its chunks' buffers).
		clear(s.batch)
		s.batch = s.batch[:0]
		clear(s.pacedKeys)
		s.pacedKeys = s.pacedKeys[:0]
		if !ok {
			return false
		}
	}
}

// unbuild puts the batch built back in front of the queue, unsent.
func (s *shard) unbuild() {
	s.putBody()
	s.requeue(s.batch)
	clear(s.batch)
	s.batch = s.batch[:0]
}

// releaseHeld puts the events of every key whose hold ended back at the
// front of the ready queue (they are older than any queued one of the key).
func (s *shard) releaseHeld(now time.Time) {
	for len(s.heap) > 0 && !s.heap[0].until.After(now) {
		h := heap.Pop(&s.heap).(*held)
		delete(s.held, h.key)
		s.lr.heldKeys.Add(-1)
		s.lr.heldEvents.Add(-int64(len(h.items)))
		s.ready.pushFront(h.items)
	}
}

// hold puts it at the end of its key's held queue, started until until
// when the key has none. It is detached (see laneRunner.detach): from then
// on only its own copy may be read, as the chunk's buffer may be reused.
func (s *shard) hold(until time.Time, it item) {
	s.lr.detach(&it)
	s.lr.progress()
	s.lr.heldEvents.Add(1)
	if h := s.held[string(it.rec.OrderKey)]; h != nil {
		h.items = append(h.items, it)
		return
	}
	h := &held{key: string(it.rec.OrderKey), until: until, items: []item{it}}
	if s.held == nil {
		s.held = make(map[string]*held)
	}
	s.held[h.key] = h
	heap.Push(&s.heap, h)
	s.lr.heldKeys.Add(1)
}

// pausedSinceBuild reports whether a pause recorded after s.batch was built
// (the Throttle's generation moved) covers one of its events.
func (s *shard) pausedSinceBuild() bool {
	if s.lr.p.thr.Gen() == s.gen {
		return false
	}
	for i := range s.batch {
		if !s.pausedUntil(&s.batch[i].rec).IsZero() {
			return true
		}
	}
	return false
}

// pausedUntil is when the record's device (OrderKey) and user pauses end,
// zero when neither is paused; in fleet mode the fleet's shared pauses
// count too.
func (s *shard) pausedUntil(r *storage.Record) time.Time {
	p := s.lr.p
	fleet := p.fl != nil && p.fl.pauses != nil && p.fl.pauses.AnyPaused()
	if !fleet && !p.thr.AnyPaused() { // the common case: no key to build, no lookups
		return time.Time{}
	}
	u := p.pausedUntil(r.OrderKey, fleet)
	if uk := s.userKey(r); uk != nil {
		if uu := p.pausedUntil(uk, fleet); uu.After(u) {
			u = uu
		}
	}
	if fleet && !u.After(time.Now()) {
		return time.Time{}
	}
	return u
}

// build takes the next batch from the ready queue into s.batch and returns
// its body; events of held or paused keys are moved to their held queue,
// expired and oversized events to s.dead.
func (s *shard) build(now time.Time) []byte {
	thr := s.lr.p.thr
	lv := s.lr.p.live.Load()
	// The lane's frame with the limits in force (a reload may change them).
	fr := s.lr.frame
	fr.MaxRecords, fr.MaxBytes = lv.MaxBatchEvents, lv.MaxBatchBytes
	f := &fr
	capE := min(s.capEvents, lv.MaxBatchEvents)
	maxAge := lv.MaxEventAge
	s.batch = s.batch[:0]
	clear(s.pacedKeys)
	s.pacedKeys = s.pacedKeys[:0]
	if s.body == nil {
		// Room for what is ready (a body is never larger than
		// MaxBatchBytes): a shard retrying a few events during an
		// outage then holds a small buffer, not MaxBatchBytes.
		s.body = s.lr.p.bodies.get(min(len(f.Prefix)+len(f.Suffix)+s.ready.bytes+s.ready.len(), lv.MaxBatchBytes))
	}
	pk := f.Open(s.body)
	for s.ready.len() > 0 && len(s.batch) < capE {
		it := s.ready.peek() // valid until the next pop
		if now.Sub(it.ck.accepted) >= maxAge {
			s.dead = append(s.dead, deadItem{s.ready.pop(), reasonExpired, nil})
			continue
		}
		if s.held[string(it.rec.OrderKey)] != nil {
			s.hold(time.Time{}, s.ready.pop())
			continue
		}
		if u := s.pausedUntil(&it.rec); !u.IsZero() {
			s.hold(u, s.ready.pop())
			continue
		}
		rec, w := f.Record(nil, it.rec.Data) // the events kind writes data as it is
		if f.TooLarge(rec) {
			s.dead = append(s.dead, deadItem{s.ready.pop(), reasonTooLarge, nil})
			continue
		}
		if !f.Fits(&pk, rec, w) {
			break
		}
		if f.Check != nil { // after Fits: a record left for the next batch is checked once (a rewrite only shrinks it)
			var reason string
			var ans []byte
			if rec, reason, ans = f.Check(rec, it.rec.Verdict); reason != "" {
				s.dead = append(s.dead, deadItem{s.ready.pop(), reason, ans})
				continue
			}
		}
		x := s.ready.pop()
		if thr.AnyPaced() {
			ukey := s.userKey(&x.rec)
			ok, at, paced := thr.Take(x.rec.OrderKey, ukey)
			if !ok {
				// Until the key's bucket holds a request's worth (never
				// now: a refused Take's time is in the future).
				s.hold(at, x)
				continue
			}
			if paced {
				s.notePaced(x.rec.OrderKey, ukey)
			}
		}
		f.Add(&pk, rec, w)
		s.batch = append(s.batch, x)
	}
	s.body = f.Close(&pk)
	return s.body
}

// shrink drops what a shard about to wait (idle, backing off, its lane
// stopped) does not need: its body buffer and the capacity of its empty
// slices, which would otherwise each keep the size of their largest burst.
func (s *shard) shrink() {
	s.putBody()
	if len(s.batch) == 0 {
		s.batch = nil
	}
	s.spare = nil
	if s.ready.len() == 0 {
		s.ready = queue{}
	}
	s.mu.Lock()
	if len(s.in) == 0 {
		s.in = nil
	}
	s.mu.Unlock()
}

// putBody gives the request body buffer back to the pipeline's pool, so
// that waiting shards share a few buffers instead of holding one each.
func (s *shard) putBody() {
	if s.body == nil {
		return
	}
	s.lr.p.bodies.put(s.body)
	s.body = nil
}

// notePaced remembers the keys of a paced event of s.batch (once each) for
// Throttle.Admitted.
func (s *shard) notePaced(keys ...[]byte) {
	for _, k := range keys {
		if len(k) > 0 && !slices.Contains(s.pacedKeys, string(k)) {
			s.pacedKeys = append(s.pacedKeys, string(k))
		}
	}
}

// handle acts on what the answer means for the batch (decide; pauses are
// recorded whatever the outcome); false: the shard must exit.
func (s *shard) handle(ctx, drainCtx context.Context, res upstream.Result) bool {
	p := s.lr.p
	n := len(s.batch)
	v := p.decide(&res, s.batch)
	if len(v.quota) > 0 {
		p.sharePauses(ctx, v.quota, p.thr.PauseUntilNextDay(v.quota))
	}
	if len(v.pause) > 0 {
		// Paused, then paced (the share tells the pacing how many of the
		// key's events the refused request carried).
		until := time.Now().Add(p.live.Load().ThrottlePause)
		p.thr.Refused(s.shares(v.pause), until, res.EPSThreshold)
		p.sharePauses(ctx, v.pause, until)
	}
	switch v.outcome {
	case delivered:
		s.lastAnswer = nil
		s.lr.done(s.batch)
		p.m.delivered.Add(float64(n))
		s.bo.Reset()
		if s.failures > 0 {
			s.failures = 0
			s.lr.failing.Add(-1)
		}
		s.lr.progress()
		s.capEvents = min(s.capEvents*2, p.live.Load().MaxBatchEvents)
		p.thr.Admitted(s.pacedKeys)
		return true
	case resend:
		return s.dropAndResend(ctx, drainCtx, v.dead, res)
	case split:
		return s.split(ctx, drainCtx, res, v.reason)
	case stop:
		s.requeue(s.batch)
		s.lr.setStop(true, v.reason)
		return true
	default: // wait
		return s.retryLater(ctx, res, v.wait)
	}
}

// split handles a 413 or a 400 that names no event: a single event is
// dead-lettered with reason, a larger batch is resent in halves (capEvents
// halves; the next batches bisect further while the answer repeats).
func (s *shard) split(ctx, drainCtx context.Context, res upstream.Result, reason string) bool {
	if len(s.batch) == 1 {
		s.dead = append(s.dead, deadItem{s.batch[0], reason, nil})
		return s.flushDead(ctx, drainCtx, res.Answer)
	}
	s.capEvents = max(1, len(s.batch)/2)
	s.lr.p.m.retried.Add(float64(len(s.batch)))
	s.requeue(s.batch)
	return true
}

// dropAndResend dead-letters the batch events named in reasons (by index)
// and puts the rest back at the front, to be sent at once (events of paused
// keys are held by the next build).
func (s *shard) dropAndResend(ctx, drainCtx context.Context, reasons map[int]string, res upstream.Result) bool {
	rest := make([]item, 0, len(s.batch)-len(reasons))
	for i := range s.batch {
		if r, ok := reasons[i]; ok {
			s.dead = append(s.dead, deadItem{s.batch[i], r, nil})
		} else {
			rest = append(rest, s.batch[i])
		}
	}
	s.lr.p.m.retried.Add(float64(len(rest)))
	s.requeue(rest) // before flushDead, which puts the dead back in front on failure
	return s.flushDead(ctx, drainCtx, res.Answer)
}

// requeue puts items taken by build back, in order, before everything
// queued. An item whose key got held by the same build (a later event of
// the key was paused, e.g. for its user) goes to the front of that key's
// held queue instead: it is older than every held event of the key.
func (s *shard) requeue(its []item) {
	var front []item
	var heldFront map[*held][]item
	for _, it := range its {
		if h := s.held[string(it.rec.OrderKey)]; h != nil {
			if heldFront == nil {
				heldFront = map[*held][]item{}
			}
			s.lr.detach(&it)
			heldFront[h] = append(heldFront[h], it)
			continue
		}
		front = append(front, it)
	}
	for h, older := range heldFront {
		h.items = append(older, h.items...)
		s.lr.heldEvents.Add(int64(len(older)))
	}
	s.ready.pushFront(front)
}

// retryLater puts the batch back and waits the backoff, at least least.
func (s *shard) retryLater(ctx context.Context, res upstream.Result, least time.Duration) bool {
	p := s.lr.p
	s.requeue(s.batch)
	p.m.retried.Add(float64(len(s.batch)))
	d := max(s.bo.Next(), least)
	if p.m.retries != nil {
		p.m.retries.Inc()
	}
	s.lastAnswer = res.Answer
	// When every shard of the lane fails (the upstream is down), the window
	// closes, so that the lane stops reading what it cannot send; progress
	// reopens it.
	if s.failures == 0 && int(s.lr.failing.Add(1)) >= len(s.lr.shards) {
		s.lr.window.Store(1)
	}
	s.failures++
	now := time.Now()
	if now.Sub(s.lastWarn) >= 10*time.Second {
		s.lastWarn = now
		p.log.Warn("upstream request failed; retrying with backoff",
			zap.String("lane", s.lr.label), zap.Int("shard", s.idx), zap.String("class", res.Kind.String()),
			zap.ByteString("answer", res.Answer), zap.Int("failures", s.failures), zap.Duration("wait", d))
	}
	s.batch = nil // requeued above
	s.shrink()
	return sleep(ctx, d)
}

// flushDead commits s.dead to the dead-letter store (FlushDead), then marks
// them done (so their chunks may be acked); false when it could not (the
// shard exits, nothing acked).
func (s *shard) flushDead(ctx, drainCtx context.Context, answer []byte) bool {
	p := s.lr.p
	now := time.Now()
	dls := make([]storage.DeadLetter, len(s.dead))
	its := make([]item, len(s.dead))
	for i, d := range s.dead {
		ans := answer
		if d.answer != nil {
			ans = d.answer
		}
		switch d.reason {
		case reasonExpired:
			ans = []byte("relay: not delivered within max-event-age")
			if s.lastAnswer != nil {
				ans = append(append(ans, "; last answer: "...), s.lastAnswer...)
			}
		case reasonTooLarge:
			if ans == nil {
				ans = []byte("relay: event larger than max-batch-bytes")
			}
		}
		dls[i] = storage.DeadLetter{Lane: s.lr.key, Reason: d.reason, Answer: ans, Accepted: d.it.ck.accepted, Died: now, Record: d.it.rec}
		its[i] = d.it
	}
	clear(s.dead)
	s.dead = s.dead[:0]
	err := FlushDead(drainCtx, p.st, dls, func(err error) {
		p.log.Error("store dead letters failed; retrying", zap.String("lane", s.lr.label), zap.Error(err))
	})
	if err != nil {
		p.log.Error("dead letters not stored; the events stay in the spool", zap.String("lane", s.lr.label), zap.Error(err))
		s.requeue(its)
		return false
	}
	if p.cfg.OnDead != nil {
		p.cfg.OnDead(dls)
	}
	for _, d := range dls {
		p.m.dead.WithLabelValues(d.Reason).Inc()
	}
	s.lr.done(its)
	s.lr.progress()
	return true
}

// userKey is r's user key ("u:"+UserID, in s.keybuf until the next call),
// nil when r has no user.
func (s *shard) userKey(r *storage.Record) []byte {
	if len(r.UserID) == 0 {
		return nil
	}
	s.keybuf = append(append(s.keybuf[:0], userPrefix...), r.UserID...)
	return s.keybuf
}

// shares counts the events of s.batch of each key (an event counts for its
// OrderKey and its user).
func (s *shard) shares(keys []string) []throttle.Share {
	count := make(map[string]int, len(keys))
	for _, k := range keys {
		count[k] = 0
	}
	for i := range s.batch {
		r := &s.batch[i].rec
		if _, ok := count[string(r.OrderKey)]; ok {
			count[string(r.OrderKey)]++
		}
		if uk := s.userKey(r); uk != nil && string(uk) != string(r.OrderKey) {
			if _, ok := count[string(uk)]; ok {
				count[string(uk)]++
			}
		}
	}
	out := make([]throttle.Share, 0, len(count))
	for k, n := range count {
		out = append(out, throttle.Share{Key: k, Share: n})
	}
	return out
}
