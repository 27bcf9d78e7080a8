package backfill

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/throttle"
	"github.com/svcrelay/relay/internal/upstream"
	"go.uber.org/zap"
)

// Defaults of Config's zero values.
const (
	// DefaultMaxEPS is the smallest plan's documented project rate.
	DefaultMaxEPS = 1000
	// DefaultDeviceEPS is the document's per-device and per-user limit.
	DefaultDeviceEPS = throttle.DefaultEPS
	// paceShare is the share of DeviceEPS a device is sent at: under 1 so
	// that a request built at one instant and sent later (the project's
	// pacing, a busy machine) does not push the key over the limit of a
	// 10 s window (cap + 0.8*eps*(10+jitter) <= 10*eps for a jitter up to
	// 1.25 s).
	paceShare = 0.8
	// maxBacklog bounds the record bytes waiting in the spool: reading
	// waits above it, so a file of any size needs bounded disk.
	maxBacklog = 64 << 20
	// chunkEvents and chunkBytes bound one append (and one state write).
	chunkEvents = delivery.DefaultMaxBatchEvents
	chunkBytes  = 1 << 20
)

// Config configures a Run; its callers check the required fields and the
// rates (relay backfill's flags, the backfill route's query).
type Config struct {
	// IngestURL is the upstream base (/2/httpapi or /batch is appended).
	// Required.
	IngestURL string
	// APIKey is the project's api_key. Required.
	APIKey string
	// Dir holds the spool, the state file and the report. Required.
	Dir string
	// Files are the inputs. Required.
	Files []string
	// MaxEPS bounds the project's events/s: in any window of W seconds at
	// most MaxEPS*W events plus one request's worth are sent; zero means
	// DefaultMaxEPS.
	MaxEPS int
	// DeviceEPS is the upstream's per-device and per-user rate assumed
	// until a 429 names its own (eps_threshold); zero means
	// DefaultDeviceEPS.
	DeviceEPS int
	// Batch sends to /batch instead of /2/httpapi.
	Batch bool
	// Report is where the dead letters are written at the end; "" means
	// Dir/backfill-report.jsonl (ReportPath).
	Report string
	// NoSync: the spool and the state file are not fsynced (they survive a
	// crash of the process, not of the machine).
	NoSync bool
	// Live, when set, is the events/s the project's live traffic is sent
	// at now (a running relay's own lanes, when the backfill runs inside
	// it): the backfill takes only what MaxEPS leaves, so live traffic goes
	// first when the project's rate is the limit. nil: no live traffic.
	Live func() float64
	// Progress, when set, is called with the counts about every 500ms and
	// once at the end, from Run's goroutine.
	Progress func(Counts)
}

// ReportPath is where the dead letters are written: Report, or
// Dir/backfill-report.jsonl.
func (c Config) ReportPath() string {
	return cmp.Or(c.Report, filepath.Join(c.Dir, "backfill-report.jsonl"))
}

// Counts is a snapshot of a backfill.
type Counts struct {
	// Read is the events read from the inputs, in this run and the earlier
	// ones of the same Dir.
	Read int64
	// Waiting is the events in the spool not yet delivered nor dead.
	Waiting int64
	// Sent counts events in requests sent by this run (a resent event
	// counts again); Delivered those answered 200.
	Sent, Delivered int64
	// Dead is the dead letters of Dir (all runs).
	Dead int64
	// Requests and Throttled count this run's requests and their 429s.
	Requests, Throttled int64
	// BytesRead and BytesTotal are how far the inputs were read.
	BytesRead, BytesTotal int64
	// Dropped counts the exported fields ingestion does not take, by name
	// (this run).
	Dropped map[string]int64
	// Elapsed is this run's time.
	Elapsed time.Duration
	// ReadDone says every input was read to its end.
	ReadDone bool
}

// ErrInterrupted is returned by Run when its context ended first: running it
// again with the same Config resumes.
var ErrInterrupted = errors.New("interrupted")

// Run backfills cfg.Files into the project and returns when every event read
// was delivered or is a dead letter (nil), when ctx ends (ErrInterrupted),
// or when delivery cannot go on (the lane stopped: an invalid api_key or
// URL). Dead letters are written to the report file in every case.
func Run(ctx context.Context, cfg Config, log *zap.Logger) (Counts, error) {
	log = cmp.Or(log, zap.NewNop())
	cfg.MaxEPS = cmp.Or(cfg.MaxEPS, DefaultMaxEPS)
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return Counts{}, err
	}
	st, resumed, err := loadState(cfg)
	if err != nil {
		return Counts{}, err
	}
	sp, err := spool.Open(spool.Config{Dir: cfg.Dir, NoSync: cfg.NoSync, MinFreeBytes: spool.DefaultMinFreeBytes}, log.Named("spool"), nil)
	if err != nil {
		return Counts{}, fmt.Errorf("open spool: %w", err)
	}
	defer sp.Close()
	key := storage.LaneKey{Kind: storage.KindEvents, APIKey: cfg.APIKey}
	lane, err := sp.Lane(ctx, key)
	if err != nil {
		return Counts{}, fmt.Errorf("open spool lane: %w", err)
	}

	thr, err := throttle.New(throttle.Config{PaceAll: true, DefaultEPS: cfg.DeviceEPS, PaceShare: paceShare}, nil)
	if err != nil {
		return Counts{}, err
	}
	client, err := upstream.New(upstream.Config{}, nil)
	if err != nil {
		return Counts{}, err
	}
	perRequest := min(delivery.DefaultMaxBatchEvents, max(1, cfg.MaxEPS/10))
	snd := &sender{next: client, lim: newLimiter(float64(cfg.MaxEPS), float64(perRequest), cfg.Live)}
	if cfg.Batch {
		snd.url = cfg.IngestURL + "/batch"
	}
	p, err := delivery.New(delivery.Config{
		Live:              delivery.Live{IngestURL: cfg.IngestURL, MaxBatchEvents: perRequest},
		MaxReadAheadBytes: maxBacklog, MaxReadAheadTotalBytes: maxBacklog,
	}, spool.NewBackend(sp).Only(storage.KindEvents), snd, thr, log.Named("delivery"), nil)
	if err != nil {
		return Counts{}, err
	}

	r := &reader{cfg: cfg, st: st, sp: sp, lane: lane, key: key, dropped: map[string]int64{}, log: log}
	t0 := time.Now()
	counts := func() Counts {
		c := Counts{Elapsed: time.Since(t0), Waiting: lane.Stats().Records, Dead: sp.Stats().Dead,
			Sent: snd.sent.Load(), Delivered: snd.delivered.Load(), Requests: snd.requests.Load(),
			Throttled: snd.throttled.Load()}
		r.mu.Lock()
		c.Read, c.BytesRead, c.BytesTotal, c.ReadDone = r.st.read(), r.bytesRead, r.bytesTotal, r.done
		c.Dropped = maps.Clone(r.dropped)
		r.mu.Unlock()
		return c
	}

	dctx, stopDelivery := context.WithCancel(context.WithoutCancel(ctx))
	delivered := make(chan error, 1)
	go func() {
		// A resumed run waits until a device's bucket of the run that was
		// stopped would be full again, so that its first request does not
		// add to what that run sent within the upstream's window.
		if resumed {
			Sleep(dctx, time.Duration(float64(time.Second)/paceShare))
		}
		delivered <- p.Run(dctx)
	}()
	rctx, stopReading := context.WithCancel(ctx)
	readErr := make(chan error, 1)
	go func() { readErr <- r.run(rctx) }()

	err, readDone := wait(ctx, cfg, lane, p, readErr, counts)
	stopReading()
	if !readDone {
		<-readErr
	}
	stopDelivery()
	if e := <-delivered; e != nil && err == nil {
		err = fmt.Errorf("delivery: %w", e)
	}
	if rerr := writeReport(sp, cfg.ReportPath()); rerr != nil && err == nil {
		err = rerr
	}
	c := counts()
	if cfg.Progress != nil {
		cfg.Progress(c)
	}
	return c, err
}

// wait returns once everything read is delivered or dead (nil), or when ctx
// ends, reading fails or the lane stops; readDone says the reader's result
// was received.
func wait(ctx context.Context, cfg Config, lane *spool.Lane, p *delivery.Pipeline, readErr <-chan error, counts func() Counts) (err error, readDone bool) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return ErrInterrupted, readDone
		case e := <-readErr:
			if e != nil {
				if ctx.Err() != nil {
					return ErrInterrupted, true
				}
				return fmt.Errorf("read: %w", e), true
			}
			readDone, readErr = true, nil // read to the end
		case <-tick.C:
		}
		for _, s := range p.LaneStatus() {
			if s.Stopped {
				return fmt.Errorf("delivery stopped: %s (nothing was dropped: fix it and run the same command again)", s.StopReason), readDone
			}
		}
		if readDone && lane.Stats().Records == 0 {
			return nil, true
		}
		if cfg.Progress != nil && time.Since(last) >= 500*time.Millisecond {
			last = time.Now()
			cfg.Progress(counts())
		}
	}
}

// reader reads the inputs into the spool and keeps the state file.
type reader struct {
	cfg     Config
	sp      *spool.Spool
	lane    *spool.Lane
	key     storage.LaneKey
	log     *zap.Logger
	ids     *event.IDGen
	req     event.Request
	one     event.Request
	body    []byte
	batch   storage.Batch
	pending [][]byte // events of the chunk being built
	size    int

	mu         sync.Mutex // guards what counts reads
	st         *state
	dropped    map[string]int64
	bytesRead  int64
	bytesTotal int64
	done       bool
}

func (r *reader) run(ctx context.Context) error {
	r.ids = event.NewIDGen()
	sizes := make([]int64, len(r.st.Files))
	var total int64
	for i, f := range r.st.Files {
		if fi, err := os.Stat(f.Path); err == nil {
			sizes[i] = fi.Size()
			total += sizes[i]
		}
	}
	r.mu.Lock()
	r.bytesTotal = total
	r.mu.Unlock()
	var before int64
	for i := range r.st.Files {
		f := &r.st.Files[i]
		if !f.Done {
			if err := r.file(ctx, f, before, sizes[i]); err != nil {
				return fmt.Errorf("%s: %w", f.Path, err)
			}
		}
		before += sizes[i]
	}
	r.mu.Lock()
	r.done, r.bytesRead = true, r.bytesTotal
	r.mu.Unlock()
	return nil
}

// file reads one input from its recorded position, a chunk at a time; the
// state is saved after each chunk is in the spool.
func (r *reader) file(ctx context.Context, f *fileState, before, fileSize int64) error {
	in, err := openInput(f.Path, f.Pos)
	if err != nil {
		return err
	}
	defer in.close()
	var dead []storage.DeadLetter
	var read int64
	at := f.Pos
	flush := func() error {
		if err := r.append(ctx, &dead); err != nil {
			return err
		}
		r.mu.Lock()
		f.Pos, f.Events = at, f.Events+read
		err := r.st.save(r.cfg)
		r.mu.Unlock()
		read = 0
		return err
	}
	for {
		l, err := in.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		r.mu.Lock()
		evs, perr := events(l, r.dropped)
		r.mu.Unlock()
		if perr != nil {
			dead = append(dead, r.deadLetter("unreadable", []byte(perr.Error()), l.text))
		}
		for _, ev := range evs {
			r.pending = append(r.pending, ev)
			r.size += len(ev)
		}
		read += int64(len(evs))
		at = l.next
		if len(r.pending) >= chunkEvents || r.size >= chunkBytes || len(dead) >= chunkEvents {
			if err := flush(); err != nil {
				return err
			}
			rd, size := in.progress()
			r.mu.Lock()
			r.bytesRead = before + int64(float64(rd)/float64(max(size, 1))*float64(fileSize))
			r.mu.Unlock()
		}
	}
	r.mu.Lock() // counts reads every file's state
	f.Done = true
	r.mu.Unlock()
	return flush()
}

// append validates the pending events as the ingest would, spools those
// the upstream can take as one chunk, and makes the others dead letters
// (with the unreadable lines in dead); then waits while the backlog is
// over maxBacklog.
func (r *reader) append(ctx context.Context, dead *[]storage.DeadLetter) error {
	now := time.Now()
	var nowBuf [20]byte
	nowText := strconv.AppendInt(nowBuf[:0], now.UnixMilli(), 10)
	r.batch.Reset()
	add := func(ev *event.Event) {
		okey := ev.OrderKey(nil)
		r.batch.AddFunc(okey, ev.UserID, len(ev.Raw)+64, func(dst []byte) []byte {
			return ev.AppendRewritten(dst, r.ids, nowText, nil)
		})
	}
	if len(r.pending) > 0 {
		r.body = envelope(r.body[:0], r.cfg.APIKey, r.pending...)
		if e := event.Parse(r.body, &r.req); e == nil {
			for i := range r.req.Events {
				add(&r.req.Events[i])
			}
		} else {
			// Find the bad ones: each alone.
			for _, raw := range r.pending {
				b := envelope(nil, r.cfg.APIKey, raw)
				if e := event.Parse(b, &r.one); e != nil {
					*dead = append(*dead, r.deadLetter(deadReason(e), e.AppendJSON(nil), raw))
					continue
				}
				add(&r.one.Events[0])
			}
		}
	}
	// Both before the state moves past them; the chunk first, so that a
	// crash between the two costs a chunk spooled twice (the same
	// insert_ids, which the upstream dedups), not dead letters listed twice.
	if len(r.batch.Records()) > 0 {
		if err := r.sp.Append(ctx, r.lane, &r.batch); err != nil {
			return fmt.Errorf("spool: %w", err)
		}
	}
	if len(*dead) > 0 {
		if err := r.sp.PutDead(context.WithoutCancel(ctx), *dead); err != nil {
			return fmt.Errorf("dead letters: %w", err)
		}
	}
	*dead = (*dead)[:0]
	r.pending, r.size = r.pending[:0], 0
	for r.lane.Stats().Bytes > maxBacklog {
		if err := Sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

func (r *reader) deadLetter(reason string, answer, data []byte) storage.DeadLetter {
	now := time.Now()
	return storage.DeadLetter{Lane: r.key, Reason: reason, Answer: answer, Accepted: now, Died: now,
		Record: storage.Record{Data: append([]byte(nil), data...)}}
}

// deadReason is the dead-letter reason of an event the ingest would refuse.
func deadReason(e *event.Error) string {
	if len(e.InvalidFields) > 0 {
		return "invalid_fields"
	}
	return "missing_fields"
}

// envelope appends {"api_key":key,"events":[evs...]} to dst.
func envelope(dst []byte, key string, evs ...[]byte) []byte {
	k, _ := json.Marshal(key)
	dst = append(append(append(dst, `{"api_key":`...), k...), `,"events":[`...)
	for i, ev := range evs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, ev...)
	}
	return append(dst, "]}"...)
}

// sender is the lane runner's Sender for a backfill: it holds each request
// until the project's pacing allows its events, sends /batch requests when
// asked, and counts what it sent and what came back.
type sender struct {
	next delivery.Sender
	lim  *limiter
	url  string // "" or the /batch URL

	reqs                                 sync.Pool // *event.Request, to count a body's events
	sent, delivered, requests, throttled atomic.Int64
}

func (s *sender) Do(ctx context.Context, req *upstream.Request) upstream.Result {
	_, n := RequestEvents(&s.reqs, req.Body)
	n = max(1, n)
	if err := s.lim.wait(ctx, n); err != nil {
		return upstream.Classify(0, nil, "", err)
	}
	if s.url != "" {
		r := *req
		r.URL = s.url
		req = &r
	}
	res := s.next.Do(ctx, req)
	s.requests.Add(1)
	s.sent.Add(int64(n))
	switch {
	case res.Kind == upstream.OK:
		s.delivered.Add(int64(n))
	case res.Status == 429:
		s.throttled.Add(1)
	}
	return res
}

// RequestEvents returns the api_key and the number of events of a request
// body the lane runner built; pool keeps the *event.Request that parses it.
func RequestEvents(pool *sync.Pool, body []byte) (apiKey string, n int) {
	r, _ := pool.Get().(*event.Request)
	if r == nil {
		r = new(event.Request)
	}
	event.Parse(body, r)
	apiKey, n = string(r.APIKey), len(r.Events)
	pool.Put(r)
	return apiKey, n
}

// limiter is a token bucket: rate events/s (less the live rate), at most
// burst at once. A caller takes its tokens at once (the bucket may go below
// zero) and waits until they were due, so callers are served in the order
// they came.
type limiter struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	live   func() float64 // nil: none
	tokens float64
	at     time.Time
}

func newLimiter(rate, burst float64, live func() float64) *limiter {
	return &limiter{rate: rate, burst: burst, live: live, tokens: burst, at: time.Now()}
}

// yieldWait is how long a caller waits before looking again while live
// traffic takes the whole rate.
const yieldWait = 100 * time.Millisecond

func (l *limiter) wait(ctx context.Context, n int) error {
	for {
		rate := l.rate
		if l.live != nil {
			rate -= l.live()
		}
		l.mu.Lock()
		now := time.Now()
		if rate > 0 {
			l.tokens = min(l.burst, l.tokens+now.Sub(l.at).Seconds()*rate)
		}
		l.at = now
		d := yieldWait
		if rate > 0 {
			l.tokens -= float64(n)
			d = 0
			if l.tokens < 0 {
				d = time.Duration(-l.tokens / rate * float64(time.Second))
			}
		}
		l.mu.Unlock()
		if d == 0 {
			return nil
		}
		if err := Sleep(ctx, d); err != nil || rate > 0 {
			return err
		}
	}
}

// Sleep waits d, or returns ctx's error when ctx ends first.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
