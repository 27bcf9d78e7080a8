package delivery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/upstream"
)

// Defaults of FormConfig's zero values.
const (
	DefaultMaxAge        = 6 * 24 * time.Hour
	DefaultRetryInitial  = 500 * time.Millisecond
	DefaultRetryMax      = 30 * time.Second
	DefaultMaxRetryAfter = 5 * time.Minute
	DefaultLinger        = 100 * time.Millisecond
	DefaultReadBytes     = 4 << 20
)

// Pacer paces requests; Acquire blocks until n records may be sent for the
// lane's api_key and returns a function to call when the answer arrived.
type Pacer interface {
	Acquire(ctx context.Context, apiKey string, n int) (release func(), err error)
}

// FormTiming is the part of a FormConfig a form kind's own Config
// (groupidentify.Config, usermap.Config) embeds and hands over as is.
type FormTiming struct {
	// MaxAge: a record still undelivered this long after acceptance goes to
	// dead letters ("expired"); zero means DefaultMaxAge.
	MaxAge time.Duration
	// RetryInitial and RetryMax bound the backoff; zero means the defaults.
	RetryInitial, RetryMax time.Duration
	// MaxRetryAfter clamps an upstream Retry-After; zero means DefaultMaxRetryAfter.
	MaxRetryAfter time.Duration
	// Linger is how long a lane waits for more records when its request is
	// not full; zero means DefaultLinger, negative means no wait.
	Linger time.Duration
	// Gzip sends bodies gzip-compressed.
	Gzip bool
}

// Validate reports a negative duration (Linger excepted: negative means no
// wait).
func (t FormTiming) Validate() error { return t.ValidateAs("delivery") }

// ValidateAs reports a negative duration of t (Linger excepted) or among
// more (the form kind's own), as "<name>: negative duration".
func (t FormTiming) ValidateAs(name string, more ...time.Duration) error {
	neg := t.MaxAge < 0 || t.RetryInitial < 0 || t.RetryMax < 0 || t.MaxRetryAfter < 0
	for _, d := range more {
		neg = neg || d < 0
	}
	if neg {
		return errors.New(name + ": negative duration")
	}
	return nil
}

// FormConfig configures a FormLanes.
type FormConfig struct {
	// Name prefixes metrics (relay_<Name>_...) and log messages. Required.
	Name string
	// Lanes is the lane kind delivered. Required (KindEvents is refused).
	Lanes storage.Kind
	// Kind packs records into requests and classifies the answers; a
	// *Form for group identify and user mappings. Required.
	Kind Kind
	// URL returns the full upstream URL for an api_key. Required.
	URL func(apiKey string) string
	// FormTiming: max age, retries, linger, gzip.
	FormTiming
	// ThrottleWait is the least wait after a 429 without Retry-After; zero
	// means the backoff's next interval.
	ThrottleWait time.Duration
	// ReadBytes bounds the chunk bytes read from the spool at once; zero
	// means DefaultReadBytes.
	ReadBytes int
	// Pacer, when not nil, paces every request.
	Pacer Pacer
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	// Store holds the records and takes the dead letters: spool.Backend
	// (the local spool), or in fleet mode the fleet's store restricted to
	// the kind Lanes (fleet.Backend.Only). Required. See FormLanes.Run.
	Store Store
}

// Store is the store as a form kind's delivery uses it.
type Store interface {
	storage.Owner
	storage.DeadWriter
}

// Validate reports a configuration error.
func (c FormConfig) Validate() error {
	switch {
	case c.Name == "":
		return errors.New("delivery: Name required")
	case c.Lanes == storage.KindEvents:
		return errors.New("delivery: Lanes must not be events")
	case c.Kind == nil:
		return errors.New("delivery: Kind required")
	case c.URL == nil:
		return errors.New("delivery: URL required")
	case c.Store == nil:
		return errors.New("delivery: Store required")
	case c.ThrottleWait < 0, c.ReadBytes < 0:
		return errors.New("delivery: negative limit or duration")
	}
	if f, ok := c.Kind.(*Form); ok {
		if err := f.Validate(); err != nil {
			return err
		}
	}
	return c.FormTiming.Validate()
}

func (c FormConfig) withDefaults() FormConfig {
	if c.MaxAge == 0 {
		c.MaxAge = DefaultMaxAge
	}
	if c.RetryInitial == 0 {
		c.RetryInitial = DefaultRetryInitial
	}
	if c.RetryMax == 0 {
		c.RetryMax = DefaultRetryMax
	}
	if c.RetryMax < c.RetryInitial {
		c.RetryMax = c.RetryInitial
	}
	if c.MaxRetryAfter == 0 {
		c.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if c.Linger == 0 {
		c.Linger = DefaultLinger
	}
	if c.ReadBytes == 0 {
		c.ReadBytes = DefaultReadBytes
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

type metrics struct {
	delivered prometheus.Counter
	requests  *prometheus.CounterVec
	dead      *prometheus.CounterVec
	retries   prometheus.Counter
	lanes     prometheus.Gauge
}

// FormLanes delivers the records of one spool lane kind (group
// identifies, user mappings): one runner per lane, which packs records into
// requests and reads the answers through its Kind (FormConfig.Kind; a *Form,
// "api_key=K&<field>=[record,record,...]", for both kinds today).
//
// internal/groupidentify and internal/usermap give only their Form (field,
// limits, the weight of a record: group properties) and, for user
// mappings, a Pacer (paced per organization).
//
// Invariants:
//   - One goroutine per lane of FormConfig.Lanes, started for existing lanes
//     and for lanes created later (the Engine runs a laneRun). It has at most
//     one request in flight, so records reach the upstream in lane order,
//     except that a Split answer (400, 413) sends a request again in halves
//     one after the other, and a DeadSome answer sends the records it did not
//     name again (order is still kept).
//   - Records of many chunks (many callers) are merged into one request, as
//     many as the lane's Frame lets one request carry (Form: MaxItems
//     records, MaxWeight total weight, a form body strictly under
//     MaxBodyBytes; a record too large alone is sent alone).
//   - A chunk is acknowledged only when every record of it is done:
//     delivered (200) or stored as a dead letter (FlushDead returns after the
//     commit, so the dead letter precedes the ack).
//   - Answers are classified by the Kind (Form: Classify, with a silenced
//     answer as a 400). Wait answers (5xx, time-outs, broken connections)
//     are retried with jittered, capped exponential backoff (Retry), without
//     a count limit, until a record is Expired (FormConfig.MaxAge): it then
//     goes to dead letters ("expired", with the last answer). Retry-After is
//     honoured, clamped to FormConfig.MaxRetryAfter.
//   - Throttled (429): wait as for Wait (Retry.Wait), at least
//     FormConfig.ThrottleWait when the answer has no Retry-After, then resend.
//   - Split: a single record refused alone is a dead letter ("bad_request",
//     "too_large").
//   - Stop (invalid API key, or an answer that says the URL or credentials
//     are wrong): the lane stops (logged once, gauge
//     relay_<name>_lanes_stopped), its records stay in the spool; it is
//     never retried in a loop. ResumeLane (an operator) or a restart tries
//     again. StopLane stops a lane by hand before its next request (a
//     request in flight finishes). LaneStatus, StopLane and ResumeLane make
//     a FormLanes a LaneControl.
//   - When Run's context ends, lane goroutines return; unacknowledged
//     chunks stay in the spool and are read again after the next Open. A
//     chunk partly delivered when the process stops is delivered again
//     from its first record (at least once).
type FormLanes struct {
	cfg    FormConfig
	client *upstream.Client
	log    *zap.Logger
	m      metrics
	// eng runs the lanes: those the store hands one by one (the local
	// spool: by the spool lane's id, as /relay/v1/lanes names lanes, a
	// stopped lane pinned, a retired lane's runner forgotten) and, through
	// fleet, the lanes of the partitions it hands (runners per lane and
	// partition, with ids of their own, retired when idle).
	eng   *Engine[*laneRun]
	fleet formFleet
}

// NewFormLanes returns a FormLanes. log and reg may be nil.
func NewFormLanes(cfg FormConfig, client *upstream.Client, log *zap.Logger, reg prometheus.Registerer) (*FormLanes, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("delivery: client required")
	}
	if log == nil {
		log = zap.NewNop()
	}
	f := promauto.With(reg)
	p := "relay_" + cfg.Name + "_"
	d := &FormLanes{cfg: cfg.withDefaults(), client: client, log: log}
	d.fleet.d = d
	eng, err := NewEngine(EngineConfig[*laneRun]{Name: cfg.Name, Kind: cfg.Lanes, NewRunner: d.newLane, Partition: d.fleet.deliver}, cfg.Store)
	if err != nil {
		return nil, err
	}
	d.eng = eng
	d.m = metrics{
		delivered: f.NewCounter(prometheus.CounterOpts{Name: p + "delivered_total", Help: "Records delivered upstream (200)."}),
		requests:  f.NewCounterVec(prometheus.CounterOpts{Name: p + "requests_total", Help: "Upstream requests by answer class."}, []string{"result"}),
		dead:      f.NewCounterVec(prometheus.CounterOpts{Name: p + "dead_letters_total", Help: "Records stored as dead letters, by reason."}, []string{"reason"}),
		retries:   f.NewCounter(prometheus.CounterOpts{Name: p + "retries_total", Help: "Requests retried after a retryable answer or a 429."}),
		lanes:     f.NewGauge(prometheus.GaugeOpts{Name: p + "lanes", Help: "Lanes being delivered."}),
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: p + "lanes_stopped",
		Help: "Lanes stopped: the upstream refused the api_key (or the URL), or an operator stopped them."},
		func() float64 {
			n := 0
			for _, s := range d.LaneStatus() {
				if s.Stopped {
					n++
				}
			}
			return float64(n)
		})
	if reg != nil {
		// relay_lane_stopped{lane} for this kind's lanes, beside the event
		// pipeline's: one series per lane, so one alert covers
		// every kind.
		if err := reg.Register(NewStoppedCollector(d.LaneStatus, false)); err != nil {
			return nil, fmt.Errorf("%s: register relay_lane_stopped: %w", cfg.Name, err)
		}
	}
	return d, nil
}

// Ready reports an error while Run is not running ("<Name> delivery not
// running").
func (d *FormLanes) Ready() error {
	if !d.Running() {
		return fmt.Errorf("%s delivery not running", d.cfg.Name)
	}
	return nil
}

// ProjectURL returns a FormConfig.URL: base + path, where a project's own
// base of kind (credentials.KindIngest, ...) in the credentials file in
// force (read at every call, so a reload takes effect at once) overrides
// base for that project's api_key. creds may be nil. base is read at every
// call too (a reload may change it).
func ProjectURL(creds *credentials.Ref, kind string, base *baseurl.Ref, path string) func(apiKey string) string {
	return func(apiKey string) string {
		b := base.Load()
		if p, ok := creds.Load().ProjectByAPIKey(apiKey); ok {
			b = strings.TrimRight(p.URL(kind, b), "/")
		}
		return b + path
	}
}

// laneRun is one lane's runner (a Runner of the engine).
type laneRun struct {
	d     *FormLanes
	src   storage.Lane
	key   storage.LaneKey
	id    uint64
	label string
	frame Frame // the Kind's, for key
	bo    *Retry
	// readAhead is the bytes of the chunks being delivered.
	readAhead atomic.Int64
	// st pins the lane while stopped (not retired then).
	st StopSwitch
}

func (d *FormLanes) newLane(q storage.LaneQueue) *laneRun {
	return &laneRun{d: d, src: q.Lane(), key: q.Key(), id: q.LaneID(), label: q.Key().Label(), frame: d.cfg.Kind.Frame(q.Key()), st: StopSwitch{Lane: q},
		bo: NewRetry(d.cfg.RetryInitial, d.cfg.RetryMax)} // no count or time limit: MaxAge bounds it
}

// Run delivers the lane until ctx ends, the store retires it (empty and
// idle: storage.ErrRetired) or it is idle (storage.ErrIdle: the store
// hands it over again at its next record). drain is not used: a request
// in flight ends with ctx.
func (lr *laneRun) Run(ctx, _ context.Context) error {
	d := lr.d
	d.m.lanes.Inc()
	defer d.m.lanes.Dec()
	err := lr.loop(ctx)
	if err != nil && !errors.Is(err, storage.ErrRetired) && !errors.Is(err, storage.ErrIdle) && ctx.Err() == nil && !errors.Is(err, storage.ErrLost) {
		d.log.Error(d.cfg.Name+": lane delivery ended", zap.String("lane", lr.label), zap.Error(err))
	}
	return err
}

// Status is the lane's snapshot.
func (lr *laneRun) Status() LaneStatus {
	stopped, reason := lr.st.State()
	return LaneStatus{ID: lr.id, Label: lr.label, Stopped: stopped, StopReason: reason, ReadAheadBytes: lr.readAhead.Load()}
}

// Stop stops the lane before its next request.
func (lr *laneRun) Stop(reason string) { lr.st.Stop(reason) }

// Resume resumes the lane; a refused request is sent again at once.
func (lr *laneRun) Resume() { lr.st.Resume() }

// batch is the records of chunks read together, flattened, with each
// record's acceptance time and each chunk's last record.
type batch struct {
	chunks   []storage.Chunk
	recs     []storage.Record
	accepted []time.Time
	last     []int // index in recs of each chunk's last record
}

func (b *batch) add(cs []storage.Chunk) {
	for _, c := range cs {
		for _, r := range c.Records {
			b.recs = append(b.recs, r)
			b.accepted = append(b.accepted, c.Accepted)
		}
		b.last = append(b.last, len(b.recs)-1)
	}
	b.chunks = append(b.chunks, cs...)
}

// pack packs recs, from the first, into a body in dst's memory: all of
// them, or as many as one request may carry (at least one). It returns the
// body and how many records it holds.
func (lr *laneRun) pack(dst []byte, recs []storage.Record, all bool) ([]byte, int) {
	f := &lr.frame
	p := f.Open(dst)
	var buf []byte
	for _, r := range recs {
		rec, w := f.Record(buf, r.Data)
		if !all && !f.Fits(&p, rec, w) {
			break
		}
		f.Add(&p, rec, w)
		buf = rec
	}
	return f.Close(&p), p.N
}

func (lr *laneRun) loop(ctx context.Context) error {
	cfg := &lr.d.cfg
	// full reports whether the records read fill a request. It packs them
	// into a scratch body that is never sent, adding only the records read
	// since its last call: a linger's reads are packed once each.
	f := &lr.frame
	var (
		p       Packing
		packed  int
		scratch []byte // an escaped record
	)
	full := func(b *batch) bool {
		for ; packed < len(b.recs); packed++ {
			rec, w := f.Record(scratch, b.recs[packed].Data)
			if !f.Fits(&p, rec, w) {
				return true
			}
			f.Add(&p, rec, w)
			scratch = rec
		}
		return false
	}
	for {
		// An idle local lane ends its runner (storage.ErrIdle) once it has
		// had nothing to read for a second: the runner acknowledged what
		// it read before, so it holds nothing then.
		if err := lr.src.Wait(ctx, func() bool { return true }); err != nil {
			return err
		}
		chunks, err := lr.src.Next(ctx, cfg.ReadBytes)
		if err != nil {
			return err
		}
		var b batch
		b.add(chunks)
		p, packed = f.Open(p.Body), 0
		// Linger for more records while what was read fits one request.
		if cfg.Linger > 0 && !full(&b) {
			lctx, cancel := context.WithTimeout(ctx, cfg.Linger)
			for !full(&b) {
				more, err := lr.src.Next(lctx, cfg.ReadBytes)
				if err != nil {
					break
				}
				b.add(more)
			}
			cancel()
			p.Body, scratch = nil, nil // not kept while delivering or idle
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		if err := lr.deliver(ctx, &b); err != nil {
			return err
		}
	}
}

// deliver sends the records of b in order, packed into requests by the
// kind, and acknowledges each chunk once all its records are done.
func (lr *laneRun) deliver(ctx context.Context, b *batch) error {
	acked := 0
	readAhead := int64(0)
	for _, c := range b.chunks {
		readAhead += int64(c.Size)
	}
	lr.readAhead.Store(readAhead)
	ackUpTo := func(done int) { // recs[:done] are done
		for acked < len(b.chunks) && b.last[acked] < done {
			lr.src.Ack(b.chunks[acked].Seq)
			readAhead -= int64(b.chunks[acked].Size)
			acked++
		}
		lr.readAhead.Store(readAhead)
	}
	ackUpTo(0) // empty chunks
	for start := 0; start < len(b.recs); {
		body, n := lr.pack(nil, b.recs[start:], false)
		end := start + max(1, n)
		if err := lr.send(ctx, b.recs[start:end], b.accepted[start:end], body); err != nil {
			return err
		}
		start = end
		ackUpTo(start)
	}
	ackUpTo(len(b.recs))
	return nil
}

// send delivers recs (accepted at accepted: one request, its body packed
// or nil, split or thinned as the kind classifies the answers) until each
// is delivered or dead. It returns an error only when ctx ends, the spool
// closes or the lane stops.
func (lr *laneRun) send(ctx context.Context, recs []storage.Record, accepted []time.Time, body []byte) error {
	cfg := &lr.d.cfg
	m := &lr.d.m
	var lastAnswer []byte // of the last retryable answer, for expired dead letters
	for len(recs) > 0 {
		// Dead-letter records that are too old to keep trying.
		now := cfg.Now()
		if slices.ContainsFunc(accepted, func(a time.Time) bool { return Expired(now, a, cfg.MaxAge) }) {
			reasons := make(map[int]string)
			for i, a := range accepted {
				if Expired(now, a, cfg.MaxAge) {
					reasons[i] = ReasonExpired
				}
			}
			var err error
			if recs, accepted, err = lr.dropDead(ctx, recs, accepted, reasons, lastAnswer); err != nil {
				return err
			}
			body = nil
			continue
		}
		if err := lr.st.Wait(ctx); err != nil {
			return err
		}
		release := func() {}
		if cfg.Pacer != nil {
			r, err := cfg.Pacer.Acquire(ctx, lr.key.APIKey, len(recs))
			if err != nil {
				return err
			}
			release = r
		}
		if body == nil {
			body, _ = lr.pack(nil, recs, true)
		}
		for !storage.Leased(ctx) {
			// The partition's lease ran out: nothing is sent. Its
			// cancellation follows, unless a renewal in flight extends it.
			select {
			case <-ctx.Done():
				release()
				return ctx.Err()
			case <-time.After(storage.LeaseRecheck):
			}
		}
		res := lr.d.client.Do(ctx, &upstream.Request{
			URL:         cfg.URL(lr.key.APIKey),
			ContentType: lr.frame.ContentType,
			Body:        body,
			Gzip:        cfg.Gzip,
			Kind:        cfg.Name,
		})
		release()
		m.requests.WithLabelValues(res.Kind.String()).Inc()
		switch v := cfg.Kind.Classify(&res, len(recs)); v.Outcome {
		case Delivered:
			lr.bo.Reset()
			m.delivered.Add(float64(len(recs)))
			return nil
		case DeadSome:
			var err error
			if recs, accepted, err = lr.dropDead(ctx, recs, accepted, v.Dead, res.Answer); err != nil {
				return err
			}
			body = nil
		case Split:
			if len(recs) == 1 {
				_, _, err := lr.dropDead(ctx, recs, accepted, map[int]string{0: v.Reason}, res.Answer)
				return err
			}
			h := len(recs) / 2
			if err := lr.send(ctx, recs[:h], accepted[:h], nil); err != nil {
				return err
			}
			recs, accepted, body = recs[h:], accepted[h:], nil
		case Stop:
			if lr.st.Stop(v.Reason) {
				lr.d.log.Error(cfg.Name+": lane stopped until resumed or restarted; its records stay in the spool",
					zap.String("lane", lr.label), zap.Int("status", res.Status), zap.String("reason", v.Reason))
			}
			// The loop waits in Wait, then resends.
		default: // Wait, Throttled
			if ctx.Err() != nil {
				return ctx.Err()
			}
			wait := lr.bo.Wait(res.RetryAfter, cfg.MaxRetryAfter)
			if v.Outcome == Throttled && res.RetryAfter <= 0 {
				wait = max(wait, cfg.ThrottleWait)
			}
			m.retries.Inc()
			lastAnswer = res.Answer
			lr.d.log.Debug(cfg.Name+": retrying", zap.String("lane", lr.label), zap.Int("status", res.Status),
				zap.Duration("wait", wait))
			if !Sleep(ctx, wait) {
				return ctx.Err()
			}
		}
	}
	return nil
}

// dropDead commits the records named in reasons (by index) as dead letters
// with answer (FlushDead) and returns the others, in order.
func (lr *laneRun) dropDead(ctx context.Context, recs []storage.Record, accepted []time.Time, reasons map[int]string, answer []byte) ([]storage.Record, []time.Time, error) {
	now := lr.d.cfg.Now()
	dls := make([]storage.DeadLetter, 0, len(reasons))
	var liveRecs []storage.Record
	var liveAcc []time.Time
	for i := range recs {
		if r, ok := reasons[i]; ok {
			dls = append(dls, storage.DeadLetter{Lane: lr.key, Reason: r, Answer: answer, Accepted: accepted[i], Died: now, Record: recs[i]})
		} else {
			liveRecs, liveAcc = append(liveRecs, recs[i]), append(liveAcc, accepted[i])
		}
	}
	err := FlushDead(ctx, lr.d.cfg.Store, dls, func(err error) {
		lr.d.log.Error(lr.d.cfg.Name+": storing dead letters failed; retrying", zap.String("lane", lr.label), zap.Error(err))
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", lr.d.cfg.Name, err)
	}
	for _, dl := range dls {
		lr.d.m.dead.WithLabelValues(dl.Reason).Inc()
	}
	lr.d.log.Warn(lr.d.cfg.Name+": records dead-lettered", zap.String("lane", lr.label),
		zap.String("reason", dls[0].Reason), zap.Int("records", len(dls)))
	return liveRecs, liveAcc, nil
}

// formIdle is how long a fleet-mode form lane runner with nothing to send
// lives (as the batcher's).
const formIdle = time.Minute

// formFleet runs a FormLanes' lanes of fleet partitions.
type formFleet struct {
	d      *FormLanes
	nextID atomic.Uint64
	runs   Runners[*laneRun]
}

// Run delivers every lane of the kind until ctx ends; it then waits for the
// lane goroutines and returns nil. Unacknowledged work stays in the store.
func (d *FormLanes) Run(ctx context.Context) error { return d.eng.Run(ctx) }

// Running reports whether Run is running.
func (d *FormLanes) Running() bool { return d.eng.Running() }

// LaneStatus returns a snapshot of every lane Run has started, by lane id.
// PausedKeys and HeldEvents are always 0 (no per-key pauses here).
func (d *FormLanes) LaneStatus() []LaneStatus {
	out := d.eng.LaneStatus()
	for _, lr := range d.fleet.runs.All() {
		out = append(out, lr.Status())
	}
	slices.SortFunc(out, func(a, b LaneStatus) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// StopLane stops sending the lane's records before its next request (an
// operator's pause); they stay in the store. It fails, wrapping
// ErrUnknownLane, for a lane Run has not started.
func (d *FormLanes) StopLane(laneID uint64) error {
	if _, ok := d.eng.Lane(laneID); ok {
		return d.eng.StopLane(laneID)
	}
	return d.fleet.runs.Control(laneID, func(lr *laneRun) { lr.Stop("stopped by operator") })
}

// ResumeLane resumes a lane stopped by StopLane or by the upstream
// refusing its api_key; the refused request is sent again at once.
func (d *FormLanes) ResumeLane(laneID uint64) error {
	if _, ok := d.eng.Lane(laneID); ok {
		return d.eng.ResumeLane(laneID)
	}
	return d.fleet.runs.Control(laneID, (*laneRun).Resume)
}

// deliver delivers one partition the store handed (EngineConfig.Partition)
// with DeliverPartition, a laneRun per lane reading its Feed. When stop
// ends, requests in flight end with it (as with the spool) and what was
// not acknowledged is read again by the partition's next owner.
func (fl *formFleet) deliver(stop, owned context.Context, r storage.Reader) error {
	d := fl.d
	name := d.cfg.Name + "-q" + strconv.FormatUint(fl.nextID.Add(1), 10)
	if n, ok := r.(interface{ Name() string }); ok {
		name = n.Name()
	}
	return DeliverPartition(stop, owned, r, func() {}, PartitionConfig{
		Name:      name,
		Kind:      d.cfg.Lanes,
		MaxQueued: int64(d.cfg.ReadBytes),
		Idle:      formIdle,
		Log:       d.log,
		Start: func(f *Feed) FeedRunner {
			lr := &laneRun{d: d, src: f, key: f.Lane(), frame: d.cfg.Kind.Frame(f.Lane()), id: fl.nextID.Add(1),
				label: f.Lane().Label() + "-" + name, bo: NewRetry(d.cfg.RetryInitial, d.cfg.RetryMax)}
			fl.runs.Add(lr.id, lr)
			forget := func() { fl.runs.Remove(lr.id, lr) }
			return FeedRunner{Label: lr.label, Run: lr.Run, Pinned: lr.st.Stopped, Retired: forget, Abandoned: forget}
		},
	})
}
