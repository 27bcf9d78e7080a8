package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/backfill"
	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/upstream"
	"go.uber.org/zap"
)

// maxBackfillBody bounds one POST /relay/v1/backfill body (it is kept on
// disk until the backfill is done).
const maxBackfillBody = 4 << 30

// copyBody copies a backfill's input to f. The admin listener's read
// timeout bounds a whole request; an input of gigabytes may take longer,
// so the deadline is renewed while bytes keep coming, and only a sender
// that stalls for bodyIdle is cut off.
func copyBody(w http.ResponseWriter, f io.Writer, body io.Reader) error {
	const bodyIdle = 30 * time.Second
	rc := http.NewResponseController(w)
	for {
		if err := rc.SetReadDeadline(time.Now().Add(bodyIdle)); err != nil {
			return err
		}
		if _, err := io.CopyN(f, body, 1<<20); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// liveMeter is the Sender of the relay's own events lanes: it passes every
// request on and, while a backfill runs inside the relay, counts the events
// sent per api_key, so that the backfill takes only what its --max-eps
// leaves (backfill.Config.Live).
type liveMeter struct {
	next    delivery.Sender
	active  atomic.Int32 // backfills running
	reqs    sync.Pool    // *event.Request
	mu      sync.Mutex
	windows map[string]*rateWindow // by api_key; cleared when no backfill runs
}

// meterWarmUp is how long a backfill waits, once the meter counts, before
// its first request: a window of the live traffic.
const meterWarmUp = 1100 * time.Millisecond

// rateWindow estimates events/s over the last second from two one-second
// buckets.
type rateWindow struct {
	start     time.Time
	cur, prev float64
}

func (w *rateWindow) roll(now time.Time) {
	switch el := now.Sub(w.start); {
	case el >= 2*time.Second:
		w.start, w.prev, w.cur = now, 0, 0
	case el >= time.Second:
		w.start, w.prev, w.cur = w.start.Add(time.Second), w.cur, 0
	}
}

func (m *liveMeter) Do(ctx context.Context, req *upstream.Request) upstream.Result {
	res := m.next.Do(ctx, req)
	if m.active.Load() == 0 {
		return res
	}
	key, n := backfill.RequestEvents(&m.reqs, req.Body)
	now := time.Now()
	m.mu.Lock()
	w := m.windows[key]
	if w == nil {
		w = &rateWindow{start: now}
		m.windows[key] = w
	}
	w.roll(now)
	w.cur += float64(n)
	m.mu.Unlock()
	return res
}

// rate is apiKey's live events/s.
func (m *liveMeter) rate(apiKey string) float64 {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.windows[apiKey]
	if w == nil {
		return 0
	}
	w.roll(now)
	return w.prev*(1-now.Sub(w.start).Seconds()) + w.cur
}

func (m *liveMeter) end() {
	if m.active.Add(-1) == 0 {
		m.mu.Lock()
		clear(m.windows)
		m.mu.Unlock()
	}
}

// backfills runs the backfills POSTed to /relay/v1/backfill, each in
// DATA-DIR/backfills/ID with its own spool, lane and pipeline (internal/
// backfill), paced to what --max-eps leaves of the project's live traffic.
// One a restart interrupted is resumed at the next start. It owns one
// goroutine per running backfill; stop ends them.
type backfills struct {
	dir    string
	meter  *liveMeter
	log    *zap.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// ingest is --ingest-url in force: a reload changes it for the
	// backfills started (or resumed) after it; a running one keeps its own.
	ingest *baseurl.Ref

	mu   sync.Mutex
	jobs map[string]*bfJob
}

// bfJob is one backfill; its spec is DIR/job.json.
type bfJob struct {
	ID     string `json:"id"`
	APIKey string `json:"api_key"`
	MaxEPS int    `json:"max_eps"`
	Batch  bool   `json:"batch"`
	// Status is running, done or failed (Error says why); a running one
	// found at start is resumed.
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`

	counts backfill.Counts // guarded by backfills.mu
}

func newBackfills(dataDir string, ingest *baseurl.Ref, meter *liveMeter, log *zap.Logger) (*backfills, error) {
	ctx, cancel := context.WithCancel(context.Background())
	b := &backfills{dir: filepath.Join(dataDir, "backfills"), ingest: ingest, meter: meter, log: log,
		ctx: ctx, cancel: cancel, jobs: map[string]*bfJob{}}
	ents, err := os.ReadDir(b.dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		cancel()
		return nil, err
	}
	for _, e := range ents {
		raw, err := os.ReadFile(filepath.Join(b.dir, e.Name(), "job.json"))
		if err != nil {
			continue // a POST that died before its job was written
		}
		j := &bfJob{}
		if err := json.Unmarshal(raw, j); err != nil {
			log.Error("backfill: damaged job file, left alone", zap.String("dir", filepath.Join(b.dir, e.Name())), errField(err))
			continue
		}
		b.jobs[j.ID] = j
		if j.Status == "running" {
			log.Info("backfill: resuming", zap.String("id", j.ID))
			b.start(j)
		}
	}
	return b, nil
}

func (b *backfills) stop(context.Context) error {
	b.cancel()
	b.wg.Wait()
	return nil
}

func (b *backfills) start(j *bfJob) {
	b.meter.active.Add(1)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer b.meter.end()
		// The meter counts only while a backfill runs: give it a whole
		// window of the live traffic before the first request.
		if backfill.Sleep(b.ctx, meterWarmUp) != nil {
			return
		}
		dir := filepath.Join(b.dir, j.ID)
		key := j.APIKey
		c, err := backfill.Run(b.ctx, backfill.Config{
			IngestURL: b.ingest.Load(), APIKey: key, Dir: dir, Files: []string{filepath.Join(dir, "input")},
			MaxEPS: j.MaxEPS, Batch: j.Batch, Live: func() float64 { return b.meter.rate(key) },
			Progress: func(c backfill.Counts) {
				b.mu.Lock()
				j.counts = c
				b.mu.Unlock()
			},
		}, b.log.With(zap.String("backfill", j.ID)))
		if errors.Is(err, backfill.ErrInterrupted) {
			return // still running on disk: resumed at the next start
		}
		b.mu.Lock()
		j.counts = c
		j.Status = "done"
		if err != nil {
			j.Status, j.Error = "failed", err.Error()
		}
		b.mu.Unlock()
		if err := b.save(j); err != nil {
			b.log.Error("backfill: job file not saved", zap.String("id", j.ID), errField(err))
		}
		b.log.Info("backfill finished", zap.String("id", j.ID), zap.String("status", j.Status), zap.Int64("read", c.Read),
			zap.Int64("delivered", c.Delivered), zap.Int64("dead", c.Dead), zap.Int64("throttled", c.Throttled))
	}()
}

func (b *backfills) save(j *bfJob) error {
	b.mu.Lock()
	raw, _ := json.Marshal(j)
	b.mu.Unlock()
	return backfill.WriteFile(filepath.Join(b.dir, j.ID, "job.json"), 0o600, false, func(f *os.File) error {
		_, err := f.Write(raw)
		return err
	})
}

func (b *backfills) routes() []adminroute.Route {
	return []adminroute.Route{
		{Method: http.MethodPost, Path: "/relay/v1/backfill", Mode: admintoken.ModeOwn, Handler: http.HandlerFunc(b.post), MaxBody: maxBackfillBody},
		{Method: http.MethodGet, Path: "/relay/v1/backfill", Mode: admintoken.ModeOwn, Handler: http.HandlerFunc(b.list)},
	}
}

// post takes a backfill: ?api_key=K[&max_eps=N][&batch=true], the body
// being one input file (JSON lines, gzipped or not, or a zip). It answers
// 202 once the body is on disk.
func (b *backfills) post(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	j := &bfJob{APIKey: q.Get("api_key"), MaxEPS: backfill.DefaultMaxEPS, Status: "running"}
	if j.APIKey == "" {
		writeJSONError(w, http.StatusBadRequest, "api_key is required")
		return
	}
	if v := q.Get("max_eps"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeJSONError(w, http.StatusBadRequest, "max_eps must be a positive integer")
			return
		}
		j.MaxEPS = n
	}
	j.Batch = q.Get("batch") == "true"
	var id [8]byte
	rand.Read(id[:])
	j.ID = time.Now().UTC().Format("20060102T150405") + "-" + hex.EncodeToString(id[:])
	dir := filepath.Join(b.dir, j.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		writeJSONError(w, http.StatusInternalServerError, err.Error())
		return
	}
	err := backfill.WriteFile(filepath.Join(dir, "input"), 0o666, false, func(f *os.File) error { return copyBody(w, f, r.Body) })
	if err == nil {
		err = b.save(j)
	}
	if err != nil {
		os.RemoveAll(dir)
		code := http.StatusInternalServerError
		if errors.As(err, new(*http.MaxBytesError)) {
			code = http.StatusRequestEntityTooLarge
		}
		writeJSONError(w, code, fmt.Sprintf("backfill input not stored: %v", err))
		return
	}
	b.mu.Lock()
	b.jobs[j.ID] = j
	b.mu.Unlock()
	b.start(j)
	adminroute.WriteJSON(w, http.StatusAccepted, map[string]string{"id": j.ID, "status": "running"})
}

// bfView is a backfill as GET /relay/v1/backfill lists it (never its
// api_key: its lane label instead).
type bfView struct {
	ID        string `json:"id"`
	Project   string `json:"project"`
	Status    string `json:"status"`
	Error     string `json:"error,omitempty"`
	MaxEPS    int    `json:"max_eps"`
	Read      int64  `json:"read"`
	Waiting   int64  `json:"waiting"`
	Delivered int64  `json:"delivered"`
	Dead      int64  `json:"dead"`
	Throttled int64  `json:"throttled"`
	Report    string `json:"report,omitempty"`
}

func (b *backfills) list(w http.ResponseWriter, _ *http.Request) {
	b.mu.Lock()
	out := make([]bfView, 0, len(b.jobs))
	for _, j := range b.jobs {
		v := bfView{ID: j.ID, Project: storage.LaneKey{Kind: storage.KindEvents, APIKey: j.APIKey}.Label(), Status: j.Status,
			Error: j.Error, MaxEPS: j.MaxEPS, Read: j.counts.Read, Waiting: j.counts.Waiting,
			Delivered: j.counts.Delivered, Dead: j.counts.Dead, Throttled: j.counts.Throttled}
		if j.counts.Dead > 0 {
			v.Report = backfill.Config{Dir: filepath.Join(b.dir, j.ID)}.ReportPath()
		}
		out = append(out, v)
	}
	b.mu.Unlock()
	sort.Slice(out, func(i, k int) bool { return out[i].ID < out[k].ID })
	adminroute.WriteJSON(w, http.StatusOK, map[string]any{"backfills": out})
}

func writeJSONError(w http.ResponseWriter, code int, msg string) {
	adminroute.WriteJSON(w, code, map[string]any{"code": code, "error": msg})
}
