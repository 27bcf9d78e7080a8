package delivery

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/spool"
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
func (t FormTiming) Validate() error {
	if t.MaxAge < 0 || t.RetryInitial < 0 || t.RetryMax < 0 || t.MaxRetryAfter < 0 {
		return errors.New("delivery: negative duration")
	}
	return nil
}

// FormConfig configures a FormLanes.
type FormConfig struct {
	// Name prefixes metrics (relay_<Name>_...) and log messages. Required.
	Name string
	// Kind is the lane kind delivered. Required (KindEvents is refused).
	Kind spool.Kind
	// URL returns the full upstream URL for an api_key. Required.
	URL func(apiKey string) string
	// Field is the form field holding the JSON array of records. Required.
	Field string
	// MaxItems bounds the records of one request. Required (> 0).
	MaxItems int
	// MaxBodyBytes: a form body is strictly shorter. Required (> 0).
	MaxBodyBytes int
	// MaxWeight bounds the summed Weight of one request; zero means no bound.
	MaxWeight int
	// Weight is a record's weight (e.g. its group properties); nil means 0.
	Weight func(data []byte) int
	// FormTiming: max age, retries, linger, gzip.
	FormTiming
	// ThrottleWait is the wait after a 429 without Retry-After; zero means
	// the backoff's next interval.
	ThrottleWait time.Duration
	// ReadBytes bounds the chunk bytes read from the spool at once; zero
	// means DefaultReadBytes.
	ReadBytes int
	// Pacer, when not nil, paces every request.
	Pacer Pacer
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Validate reports a configuration error.
func (c FormConfig) Validate() error {
	switch {
	case c.Name == "":
		return errors.New("delivery: Name required")
	case c.Kind == spool.KindEvents:
		return errors.New("delivery: Kind must not be events")
	case c.URL == nil:
		return errors.New("delivery: URL required")
	case c.Field == "":
		return errors.New("delivery: Field required")
	case c.MaxItems <= 0:
		return fmt.Errorf("delivery: MaxItems %d <= 0", c.MaxItems)
	case c.MaxBodyBytes <= 0:
		return fmt.Errorf("delivery: MaxBodyBytes %d <= 0", c.MaxBodyBytes)
	case c.MaxWeight < 0, c.ThrottleWait < 0, c.ReadBytes < 0:
		return errors.New("delivery: negative limit or duration")
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
// identifies, user mappings) to an upstream form endpoint that takes
// "api_key=K&<field>=[record,record,...]".
//
// internal/groupidentify and internal/usermap are its kinds; they differ
// only in limits, the form field, the weight of a record (group properties)
// and pacing (user mappings are paced per organization).
//
// Invariants:
//   - One goroutine per lane of FormConfig.Kind, started for existing lanes and
//     for lanes created later (the Engine runs a laneRun). It has at most one
//     request in flight, so records reach the upstream in lane order, except
//     that a 400 or 413 splits a request into halves sent one after the
//     other (order is still kept).
//   - Records of many chunks (many callers) are merged into one request, up
//     to FormConfig.MaxItems records, FormConfig.MaxWeight total weight and a form
//     body strictly under FormConfig.MaxBodyBytes.
//   - A chunk is acknowledged only when every record of it is done:
//     delivered (200) or stored as a dead letter (PutDead returns after the
//     commit, so the dead letter precedes the ack).
//   - Retryable answers (5xx, time-outs, broken connections) are retried
//     with jittered, capped exponential backoff (backoff/v4), without a
//     count limit, until a record is older than FormConfig.MaxAge: it then goes
//     to dead letters ("expired"). Retry-After is honoured, clamped to
//     FormConfig.MaxRetryAfter.
//   - 429: wait Retry-After (clamped) or FormConfig.ThrottleWait, then resend.
//   - 400 (any kind): bisect; a single record refused alone is a dead letter
//     ("bad_request"). 413: split; a single record alone is a dead letter
//     ("too_large").
//   - Invalid API key, or an answer that says the URL or credentials are
//     wrong (upstream.Fatal): the lane stops (logged once, gauge
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
	sp     *spool.Spool
	client *upstream.Client
	log    *zap.Logger
	m      metrics
	eng    *Engine[*laneRun]
}

// NewFormLanes returns a FormLanes. log and reg may be nil.
func NewFormLanes(cfg FormConfig, sp *spool.Spool, client *upstream.Client, log *zap.Logger, reg prometheus.Registerer) (*FormLanes, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if sp == nil || client == nil {
		return nil, errors.New("delivery: spool and client required")
	}
	if log == nil {
		log = zap.NewNop()
	}
	f := promauto.With(reg)
	p := "relay_" + cfg.Name + "_"
	d := &FormLanes{cfg: cfg.withDefaults(), sp: sp, client: client, log: log}
	eng, err := NewEngine(EngineConfig[*laneRun]{Name: cfg.Name, Kind: cfg.Kind, NewRunner: d.newLane}, sp)
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
		// pipeline's (issue 24): one series per lane, so one alert covers
		// every kind.
		if err := reg.Register(eng.StoppedCollector(false)); err != nil {
			return nil, fmt.Errorf("%s: register relay_lane_stopped: %w", cfg.Name, err)
		}
	}
	return d, nil
}

// LaneStatus returns a snapshot of every lane Run has started, by lane id.
// PausedKeys and HeldEvents are always 0 (no per-key pauses here).
func (d *FormLanes) LaneStatus() []LaneStatus { return d.eng.LaneStatus() }

// StopLane stops sending the lane's records before its next request (an
// operator's pause); they stay in the spool. It fails, wrapping
// ErrUnknownLane, for a lane Run has not started.
func (d *FormLanes) StopLane(laneID uint64) error { return d.eng.StopLane(laneID) }

// ResumeLane resumes a lane stopped by StopLane or by the upstream refusing
// its api_key; the refused request is sent again at once.
func (d *FormLanes) ResumeLane(laneID uint64) error { return d.eng.ResumeLane(laneID) }

// Running reports whether Run is running.
func (d *FormLanes) Running() bool { return d.eng.Running() }

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
// base for that project's api_key. creds may be nil. base must not end in
// "/".
func ProjectURL(creds *credentials.Ref, kind, base, path string) func(apiKey string) string {
	return func(apiKey string) string {
		b := base
		if p, ok := creds.Load().ProjectByAPIKey(apiKey); ok {
			b = strings.TrimRight(p.URL(kind, base), "/")
		}
		return b + path
	}
}

// Run delivers every lane of the kind until ctx ends; it then waits for the
// lane goroutines and returns nil. Unacknowledged work stays in the spool.
func (d *FormLanes) Run(ctx context.Context) error { return d.eng.Run(ctx) }

// item is one record being delivered, with its chunk's index.
type item struct {
	rec      spool.Record
	chunk    int
	accepted time.Time
	esc      int // escaped length in the form body
	weight   int
}

// laneRun is one lane's runner (a Runner of the engine).
type laneRun struct {
	d      *FormLanes
	lane   *spool.Lane
	key    spool.LaneKey
	id     uint64
	label  string
	prefix []byte // "api_key=...&field="
	bo     *Retry
	// readAhead is the bytes of the chunks being delivered.
	readAhead atomic.Int64
	// st pins the lane while stopped (issue 19: not retired then).
	st StopSwitch
}

func (d *FormLanes) newLane(l *spool.Lane) *laneRun {
	key := l.Key()
	lr := &laneRun{d: d, lane: l, key: key, id: l.ID(), label: l.Label(), st: StopSwitch{Lane: l}}
	lr.prefix = append(lr.prefix, "api_key="...)
	lr.prefix = append(lr.prefix, url.QueryEscape(key.APIKey)...)
	lr.prefix = append(lr.prefix, '&')
	lr.prefix = append(lr.prefix, url.QueryEscape(d.cfg.Field)...)
	lr.prefix = append(lr.prefix, '=')
	lr.bo = NewRetry(d.cfg.RetryInitial, d.cfg.RetryMax) // no count or time limit: MaxAge bounds it
	return lr
}

// Run delivers the lane until ctx ends or the spool retires it (empty and
// idle, issue 19). drain is not used: a request in flight ends with ctx.
func (lr *laneRun) Run(ctx, _ context.Context) error {
	d := lr.d
	d.m.lanes.Inc()
	defer d.m.lanes.Dec()
	err := lr.loop(ctx)
	if err != nil && !errors.Is(err, spool.ErrRetired) && ctx.Err() == nil && !errors.Is(err, spool.ErrClosed) {
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

func (lr *laneRun) loop(ctx context.Context) error {
	cfg := &lr.d.cfg
	for {
		chunks, err := lr.lane.Next(ctx, cfg.ReadBytes)
		if err != nil {
			return err
		}
		// Linger for more records while the read is smaller than a request.
		if cfg.Linger > 0 && countRecords(chunks) < cfg.MaxItems {
			lctx, cancel := context.WithTimeout(ctx, cfg.Linger)
			for countRecords(chunks) < cfg.MaxItems {
				more, err := lr.lane.Next(lctx, cfg.ReadBytes)
				if err != nil {
					break
				}
				chunks = append(chunks, more...)
			}
			cancel()
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		if err := lr.deliverChunks(ctx, chunks); err != nil {
			return err
		}
	}
}

func countRecords(cs []spool.Chunk) int {
	n := 0
	for _, c := range cs {
		n += len(c.Records)
	}
	return n
}

// deliverChunks sends the records of chunks in order, packed into requests,
// and acknowledges each chunk once all its records are done.
func (lr *laneRun) deliverChunks(ctx context.Context, chunks []spool.Chunk) error {
	cfg := &lr.d.cfg
	var items []item
	last := make([]int, len(chunks)) // index of each chunk's last item
	for ci, c := range chunks {
		for _, r := range c.Records {
			it := item{rec: r, chunk: ci, accepted: c.Accepted, esc: escLen(r.Data)}
			if cfg.Weight != nil {
				it.weight = cfg.Weight(r.Data)
			}
			items = append(items, it)
		}
		last[ci] = len(items) - 1
	}
	acked := 0
	readAhead := int64(0)
	for _, c := range chunks {
		readAhead += int64(c.Size)
	}
	lr.readAhead.Store(readAhead)
	ackUpTo := func(done int) { // items[:done] are done
		for acked < len(chunks) && last[acked] < done {
			lr.d.sp.Ack(lr.lane, chunks[acked].Seq)
			readAhead -= int64(chunks[acked].Size)
			acked++
		}
		lr.readAhead.Store(readAhead)
	}
	ackUpTo(0) // empty chunks
	for start := 0; start < len(items); {
		end := lr.pack(items, start)
		if err := lr.send(ctx, items[start:end]); err != nil {
			return err
		}
		start = end
		ackUpTo(start)
	}
	ackUpTo(len(items))
	return nil
}

// pack returns the end of the request starting at items[start]: as many
// records as fit the limits (at least one).
func (lr *laneRun) pack(items []item, start int) int {
	cfg := &lr.d.cfg
	size := len(lr.prefix) + 6 // %5B ... %5D
	weight := 0
	i := start
	for ; i < len(items) && i-start < cfg.MaxItems; i++ {
		add := items[i].esc
		if i > start {
			add += 3 // %2C
		}
		if i > start && (size+add >= cfg.MaxBodyBytes || (cfg.MaxWeight > 0 && weight+items[i].weight > cfg.MaxWeight)) {
			break
		}
		size += add
		weight += items[i].weight
	}
	return i
}

// body builds the form body of items.
func (lr *laneRun) body(items []item) []byte {
	n := len(lr.prefix) + 6
	for _, it := range items {
		n += it.esc + 3
	}
	b := make([]byte, 0, n)
	b = append(b, lr.prefix...)
	b = append(b, "%5B"...)
	for i, it := range items {
		if i > 0 {
			b = append(b, "%2C"...)
		}
		b = appendEscaped(b, it.rec.Data)
	}
	return append(b, "%5D"...)
}

// send delivers items (one request, split on 400/413) until each is
// delivered or dead. It returns an error only when ctx ends, the spool
// closes or the lane stops.
func (lr *laneRun) send(ctx context.Context, items []item) error {
	cfg := &lr.d.cfg
	m := &lr.d.m
	var lastAnswer []byte // of the last retryable answer, for expired dead letters
	for len(items) > 0 {
		// Dead-letter records that are too old to keep trying.
		now := cfg.Now()
		var live []item
		var old []item
		for _, it := range items {
			if now.Sub(it.accepted) > cfg.MaxAge {
				old = append(old, it)
			} else {
				live = append(live, it)
			}
		}
		if len(old) > 0 {
			if err := lr.dead(ctx, old, "expired", lastAnswer); err != nil {
				return err
			}
			items = live
			continue
		}
		if err := lr.st.Wait(ctx); err != nil {
			return err
		}
		body := lr.body(items)
		release := func() {}
		if cfg.Pacer != nil {
			r, err := cfg.Pacer.Acquire(ctx, lr.key.APIKey, len(items))
			if err != nil {
				return err
			}
			release = r
		}
		res := lr.d.client.Do(ctx, &upstream.Request{
			URL:         cfg.URL(lr.key.APIKey),
			ContentType: "application/x-www-form-urlencoded",
			Body:        body,
			Gzip:        cfg.Gzip,
			Kind:        cfg.Name,
		})
		release()
		m.requests.WithLabelValues(res.Kind.String()).Inc()
		switch res.Kind {
		case upstream.OK:
			lr.bo.Reset()
			m.delivered.Add(float64(len(items)))
			return nil
		case upstream.TooLarge, upstream.BadRequest, upstream.Invalid, upstream.Silenced:
			reason := "bad_request"
			if res.Kind == upstream.TooLarge {
				reason = "too_large"
			}
			if len(items) == 1 {
				return lr.dead(ctx, items, reason, res.Answer)
			}
			h := len(items) / 2
			if err := lr.send(ctx, items[:h]); err != nil {
				return err
			}
			items = items[h:]
		case upstream.InvalidAPIKey, upstream.Fatal:
			reason := "upstream refused the api_key (Invalid API key)"
			if res.Kind == upstream.Fatal {
				reason = fmt.Sprintf("upstream answered %d: wrong URL or credentials", res.Status)
			}
			if lr.st.Stop(reason) {
				lr.d.log.Error(cfg.Name+": lane stopped until resumed or restarted; its records stay in the spool",
					zap.String("lane", lr.label), zap.Int("status", res.Status), zap.String("reason", reason))
			}
			// The loop waits in Wait, then resends.
		default: // Retryable, Throttled
			if ctx.Err() != nil {
				return ctx.Err()
			}
			wait := lr.bo.Honour(res.RetryAfter, cfg.MaxRetryAfter)
			if res.Kind == upstream.Throttled && cfg.ThrottleWait > 0 && res.RetryAfter <= 0 {
				wait = cfg.ThrottleWait
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

func (lr *laneRun) dead(ctx context.Context, items []item, reason string, answer []byte) error {
	now := lr.d.cfg.Now()
	dls := make([]spool.DeadLetter, len(items))
	for i, it := range items {
		dls[i] = spool.DeadLetter{Lane: lr.key, Reason: reason, Answer: answer, Accepted: it.accepted, Died: now, Record: it.rec}
	}
	// A failed commit (disk trouble) is retried: the records were read from
	// the lane and must be done before their chunk is acknowledged.
	bo := NewRetry(lr.d.cfg.RetryInitial, lr.d.cfg.RetryMax)
	for logged := false; ; {
		err := lr.d.sp.PutDead(ctx, dls)
		if err == nil {
			break
		}
		if ctx.Err() != nil || errors.Is(err, spool.ErrClosed) {
			return fmt.Errorf("%s: store dead letters: %w", lr.d.cfg.Name, err)
		}
		if !logged {
			lr.d.log.Error(lr.d.cfg.Name+": storing dead letters failed; retrying", zap.String("lane", lr.label), zap.Error(err))
			logged = true
		}
		if !Sleep(ctx, bo.Next()) {
			return ctx.Err()
		}
	}
	lr.d.m.dead.WithLabelValues(reason).Add(float64(len(items)))
	lr.d.log.Warn(lr.d.cfg.Name+": records dead-lettered", zap.String("lane", lr.label),
		zap.String("reason", reason), zap.Int("records", len(items)))
	return nil
}

// shouldEscape reports whether c is escaped by url.QueryEscape.
func shouldEscape(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return false
	case c == '-' || c == '_' || c == '.' || c == '~':
		return false
	}
	return true
}

// EscapedLen is the length of url.QueryEscape(string(b)).
func EscapedLen(b []byte) int { return escLen(b) }

func escLen(b []byte) int {
	n := 0
	for _, c := range b {
		if shouldEscape(c) && c != ' ' {
			n += 3
		} else {
			n++
		}
	}
	return n
}

func appendEscaped(dst, b []byte) []byte {
	const hex = "0123456789ABCDEF"
	for _, c := range b {
		switch {
		case c == ' ':
			dst = append(dst, '+')
		case shouldEscape(c):
			dst = append(dst, '%', hex[c>>4], hex[c&15])
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// BodyOverhead is the size of a form body holding one record besides the
// record's escaped bytes: "api_key=<escaped key>&<field>=%5B...%5D".
func BodyOverhead(apiKey, field string) int {
	return len("api_key=") + len(url.QueryEscape(apiKey)) + 1 + len(url.QueryEscape(field)) + 1 + 6
}
