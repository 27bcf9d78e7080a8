package adminapi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/plan"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"go.uber.org/zap"
)

// Limits of the /relay/v1 routes.
const (
	// DefaultListLimit and MaxListLimit bound a dead-letter page.
	DefaultListLimit = 100
	MaxListLimit     = 1000
	// DefaultBulkLimit and MaxBulkLimit bound the dead letters one replay or
	// purge handles (the answer's "more" says whether some are left), and
	// MaxBulkLimit the ids one call names (ids mode ignores limit).
	DefaultBulkLimit = 10_000
	MaxBulkLimit     = 100_000
	// MaxAPIKeyLen bounds a replay's corrected api_key.
	MaxAPIKeyLen = 1024

	bulkPage         = 500     // dead letters read per ListDead during replay/purge
	replayChunkCount = 1000    // records per Append of a replay
	replayChunkBytes = 4 << 20 // record bytes per Append of a replay
	bulkCallTimeout  = 2 * time.Minute
)

// RelayConfig configures the relay's own API (dead letters and lanes).
type RelayConfig struct {
	// Lanes are the deliverers that report on and pause/resume lanes, by
	// the kind they deliver; a kind without one is listed with its spool
	// depth only, and pausing its lanes answers 409. Nil means none.
	Lanes map[storage.Kind]delivery.LaneControl

	// Store holds the dead letters the routes list, purge and replay, and
	// takes the replayed records: the local spool (spool.NewBackend) or, in
	// fleet mode, the fleet's store (every relay's dead letters, every
	// kind). Required.
	Store Store

	// Fleet says fleet mode: the events deliverer's lanes are its
	// runners (one per lane and owned partition), not the spool's lanes.
	Fleet bool
}

// Store is the store as the dead-letter routes use it. A store that also
// has DeadCount(ctx) (int64, error) gives the lists' total.
type Store interface {
	storage.DeadLetters
	storage.Appender
}

// Relay serves /relay/v1/: dead letters (list, replay, purge) and lanes
// (list, pause, resume). Every route is admintoken.ModeOwn. Answers name a
// lane by its Label (a hash of its key), never by its api_key.
type Relay struct {
	cfg RelayConfig
	sp  *spool.Spool
	log *zap.Logger

	replayed, purged prometheus.Counter

	// stopCtx ends when Close is called: bulk calls stop between two steps.
	stopCtx context.Context
	stop    context.CancelFunc

	// bulk serialises replay and purge, so that two calls never replay
	// the same dead letter twice.
	bulk sync.Mutex
}

// NewRelay returns the /relay/v1 API: dead letters in cfg.Store, lanes of
// the local spool sp (the seam does not list lanes). log and reg may be
// nil. It registers relay_admin_dead_letters_replayed_total and
// relay_admin_dead_letters_purged_total.
func NewRelay(cfg RelayConfig, sp *spool.Spool, log *zap.Logger, reg prometheus.Registerer) (*Relay, error) {
	if sp == nil || cfg.Store == nil {
		return nil, errors.New("adminapi: relay API needs a spool and a store")
	}
	log = cmp.Or(log, zap.NewNop())
	a := &Relay{cfg: cfg, sp: sp, log: log,
		replayed: prometheus.NewCounter(prometheus.CounterOpts{Name: "relay_admin_dead_letters_replayed_total",
			Help: "Dead letters replayed into their lanes through the admin API."}),
		purged: prometheus.NewCounter(prometheus.CounterOpts{Name: "relay_admin_dead_letters_purged_total",
			Help: "Dead letters purged through the admin API."}),
	}
	a.stopCtx, a.stop = context.WithCancel(context.Background())
	if reg != nil {
		for _, c := range []prometheus.Collector{a.replayed, a.purged} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("adminapi metrics: %w", err)
			}
		}
	}
	return a, nil
}

// Close makes replay and purge calls in progress stop after their current
// step (an appended batch still has its dead letters deleted) and answer
// with what they did; later calls answer at once. Call it before the admin
// listener's Shutdown so that a long replay does not hold the stop.
func (a *Relay) Close() { a.stop() }

// Routes returns the /relay/v1 routes, for Server.Register.
func (a *Relay) Routes() []adminroute.Route {
	return []adminroute.Route{
		own(http.MethodGet, "/relay/v1/deadletters", a.listDead),
		own(http.MethodPost, "/relay/v1/deadletters/replay", a.replayDead),
		own(http.MethodPost, "/relay/v1/deadletters/purge", a.purgeDead),
		own(http.MethodGet, "/relay/v1/lanes", a.listLanes),
		own(http.MethodGet, "/relay/v1/lanes/{label}", a.getLane),
		own(http.MethodPost, "/relay/v1/lanes/{label}/{action}", a.laneAction),
	}
}

// jsonError answers {"error": the formatted message}.
func jsonError(w http.ResponseWriter, status int, format string, args ...any) {
	adminroute.WriteJSON(w, status, map[string]string{"error": fmt.Sprintf(format, args...)})
}

// laneByLabel is the spool's lane with label, nil when none has it.
func (a *Relay) laneByLabel(label string) *spool.Lane {
	for _, l := range a.sp.Lanes() {
		if l.Key().Label() == label {
			return l
		}
	}
	return nil
}

type deadLetterJSON struct {
	ID       uint64          `json:"id"`
	Lane     string          `json:"lane"`
	Kind     string          `json:"kind"`
	Reason   string          `json:"reason"`
	Answer   string          `json:"answer"`
	Accepted time.Time       `json:"accepted"`
	Died     time.Time       `json:"died"`
	Data     json.RawMessage `json:"data"`
}

type deadListJSON struct {
	DeadLetters []deadLetterJSON `json:"dead_letters"`
	// NextAfter is the cursor for the next page: the id of the last dead
	// letter returned (the request's after when none).
	NextAfter uint64 `json:"next_after"`
	// More says whether dead letters after NextAfter match the filter.
	More bool `json:"more"`
	// Total is the number of dead letters in the store, filter or not (-1
	// when it cannot say).
	Total int64 `json:"total"`
}

func toJSON(d storage.DeadLetter) deadLetterJSON {
	data := json.RawMessage(d.Record.Data)
	if !json.Valid(d.Record.Data) {
		// Not JSON (should not happen: records are the upstream payload):
		// show it as a string rather than break the answer.
		data, _ = json.Marshal(string(d.Record.Data))
	}
	return deadLetterJSON{
		ID: d.ID, Lane: d.Lane.Label(), Kind: d.Lane.Kind.String(), Reason: d.Reason,
		Answer: string(d.Answer), Accepted: d.Accepted.UTC(), Died: d.Died.UTC(), Data: data,
	}
}

// filterJSON selects dead letters: by lane label and by reason; empty
// fields match everything.
type filterJSON struct {
	Lane   string `json:"lane"`
	Reason string `json:"reason"`
}

// spoolFilter turns a label filter into the spool's key filter; ok is false
// when no lane has the label, nor any dead letter (the lane may have been
// retired since: its dead letters keep their label).
func (a *Relay) spoolFilter(f filterJSON) (storage.DeadFilter, bool) {
	out := storage.DeadFilter{Reason: f.Reason}
	if f.Lane == "" {
		return out, true
	}
	if l := a.laneByLabel(f.Lane); l != nil {
		k := l.Key()
		out.Lane = &k
		return out, true
	}
	out.Label = f.Lane
	for _, err := range a.deadLetters(storage.DeadFilter{Label: f.Lane}, 0, math.MaxUint64, 1) {
		return out, err == nil
	}
	return out, false
}

func uintArg(q url.Values, name string, def, lo, hi uint64) (uint64, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s: want an integer from %d to %d", name, lo, hi)
	}
	return n, nil
}

// planFilter selects tracking-plan dead letters (reason plan) by the
// project, event type and violation kind of their answer (a
// plan.Quarantine); zero fields match everything.
type planFilter struct{ project, eventType, violation string }

func (pf planFilter) match(d storage.DeadLetter) bool {
	if pf == (planFilter{}) {
		return true
	}
	var q plan.Quarantine
	if d.Reason != plan.ReasonPlan || json.Unmarshal(d.Answer, &q) != nil ||
		pf.project != "" && q.Project != pf.project || pf.eventType != "" && q.EventType != pf.eventType {
		return false
	}
	if pf.violation == "" {
		return true
	}
	for _, v := range q.Violations {
		if v.Kind == pf.violation {
			return true
		}
	}
	return false
}

// listDead: GET /relay/v1/deadletters?lane=&reason=&after=&limit=, and
// for the tracking plan's quarantine &project=&event_type=&violation=.
func (a *Relay) listDead(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		if !slices.Contains([]string{"lane", "reason", "after", "limit", "project", "event_type", "violation"}, k) {
			jsonError(w, http.StatusBadRequest, "unknown query parameter %q (lane, reason, after, limit, project, event_type, violation)", k)
			return
		}
	}
	after, err := uintArg(q, "after", 0, 0, math.MaxUint64)
	limit, lerr := uintArg(q, "limit", DefaultListLimit, 1, MaxListLimit)
	if err = cmp.Or(err, lerr); err != nil {
		jsonError(w, http.StatusBadRequest, "%v", err)
		return
	}
	f, ok := a.spoolFilter(filterJSON{Lane: q.Get("lane"), Reason: q.Get("reason")})
	if !ok {
		jsonError(w, http.StatusNotFound, "no lane has that label (GET /relay/v1/lanes lists them)")
		return
	}
	pf := planFilter{q.Get("project"), q.Get("event_type"), q.Get("violation")}
	out := deadListJSON{DeadLetters: []deadLetterJSON{}, NextAfter: after}
	// Reads limit+1 at a time: one read says whether more match, unless a
	// plan filter skips some.
	for d, err := range a.deadLetters(f, after, math.MaxUint64, int(limit)+1) {
		if err != nil {
			a.log.Error("list dead letters", errField(err))
			jsonError(w, http.StatusInternalServerError, "listing dead letters failed: %v", err)
			return
		}
		if !pf.match(d) {
			continue
		}
		if len(out.DeadLetters) == int(limit) {
			out.More = true
			break
		}
		out.DeadLetters = append(out.DeadLetters, toJSON(d))
		out.NextAfter = d.ID
	}
	out.Total = a.deadTotal()
	adminroute.WriteJSON(w, http.StatusOK, out)
}

// bulkJSON is the body of replay and purge: ids, or a filter (an empty
// filter {} selects every dead letter).
type bulkJSON struct {
	IDs    []uint64    `json:"ids"`
	Filter *filterJSON `json:"filter"`
	// Limit bounds the dead letters handled by this call; 0 means
	// DefaultBulkLimit.
	Limit int `json:"limit"`
	// APIKey (replay only) replays the records under this api_key instead
	// of their lane's. Never echoed or logged.
	APIKey string `json:"api_key"`
}

func decodeBulk(r *http.Request, replay bool) (bulkJSON, error) {
	var b bulkJSON
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		// The decoder's messages quote field names, never values.
		return b, fmt.Errorf("body: want a JSON object {\"ids\":[...]} or {\"filter\":{\"lane\":...,\"reason\":...}}: %s", describeJSONError(err))
	}
	if dec.More() {
		return b, errors.New("body: trailing data after the JSON object")
	}
	switch {
	case len(b.IDs) > 0 && b.Filter != nil:
		return b, errors.New("body: give ids or filter, not both")
	case len(b.IDs) == 0 && b.Filter == nil:
		return b, errors.New(`body: give "ids" (a non-empty list) or "filter" ({} selects every dead letter)`)
	case len(b.IDs) > MaxBulkLimit:
		return b, fmt.Errorf("body: at most %d ids per call", MaxBulkLimit)
	case b.Limit < 0 || b.Limit > MaxBulkLimit:
		return b, fmt.Errorf("limit: want 0 to %d", MaxBulkLimit)
	case !replay && b.APIKey != "":
		return b, errors.New("api_key: only replay takes one")
	case len(b.APIKey) > MaxAPIKeyLen || strings.TrimSpace(b.APIKey) != b.APIKey:
		return b, fmt.Errorf("api_key: want 1 to %d characters without surrounding white space", MaxAPIKeyLen)
	case strings.ContainsFunc(b.APIKey, func(c rune) bool { return c < 0x20 || c == 0x7f }):
		return b, errors.New("api_key: control characters are not allowed")
	}
	b.Limit = cmp.Or(b.Limit, DefaultBulkLimit)
	return b, nil
}

// describeJSONError describes a decoding error without quoting the input.
func describeJSONError(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("invalid JSON at byte %d", se.Offset)
	case errors.As(err, &te):
		return fmt.Sprintf("field %q: want %s", te.Field, te.Type)
	case errors.As(err, new(*http.MaxBytesError)):
		return err.Error()
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return err.Error()[len("json: "):]
	case errors.Is(err, io.EOF):
		return "empty body"
	}
	return "invalid JSON"
}

// selected walks the dead letters a bulk request selects (f: its filter's,
// zero in ids mode), in id order, and calls visit with them, at most bulkPage at a time. In filter mode it
// handles at most b.Limit and stops at the newest matching dead letter of
// its start, so that records it replays and that die again (new, higher
// ids) are left for another call; more reports whether matching dead
// letters were left. In ids mode it returns the ids not found.
func (a *Relay) selected(b bulkJSON, f storage.DeadFilter, visit func([]storage.DeadLetter) error) (notFound []uint64, more bool, err error) {
	var want map[uint64]bool
	var after, last uint64
	limit := b.Limit
	if b.Filter != nil {
		for d, err := range a.deadLetters(f, 0, math.MaxUint64, bulkPage) {
			if err != nil {
				return nil, false, fmt.Errorf("list dead letters: %w", err)
			}
			last = d.ID
		}
	} else {
		want = make(map[uint64]bool, len(b.IDs))
		for _, id := range b.IDs {
			want[id] = true
		}
		if lo := slices.Min(b.IDs); lo > 0 {
			after = lo - 1
		}
		last, limit = slices.Max(b.IDs), len(b.IDs)
	}
	var sel []storage.DeadLetter
	flush := func() error {
		if len(sel) == 0 {
			return nil
		}
		err := visit(sel)
		sel = nil
		return err
	}
	done := 0
	for d, err := range a.deadLetters(f, after, last, bulkPage) {
		if err != nil {
			return nil, false, fmt.Errorf("list dead letters: %w", err)
		}
		if want != nil && !want[d.ID] {
			continue
		}
		if done == limit {
			more = true
			break
		}
		delete(want, d.ID)
		sel, done = append(sel, d), done+1
		if len(sel) == bulkPage {
			if err := flush(); err != nil {
				return nil, false, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, false, err
	}
	for id := range want {
		notFound = append(notFound, id)
	}
	slices.Sort(notFound)
	return notFound, more, nil
}

type laneCount struct {
	Lane    string `json:"lane"`
	Kind    string `json:"kind"`
	Records int    `json:"records"`
}

// bulkAnswer is what replay and purge answer beside their counts.
type bulkAnswer struct {
	NotFound []uint64 `json:"not_found"`
	More     bool     `json:"more"`
	Error    string   `json:"error,omitempty"`
}

// bulkCall decodes a replay's (replay) or a purge's body and, one bulk call
// at a time, hands visit the pages of dead letters it selects (selected),
// within bulkCallTimeout and until Close; it fills ans's not_found and
// more. It answers a bad body and an unknown filter lane itself (answered);
// otherwise the caller answers, with visit's error.
func (a *Relay) bulkCall(w http.ResponseWriter, r *http.Request, replay bool, ans *bulkAnswer,
	visit func(ctx context.Context, b bulkJSON, page []storage.DeadLetter) error) (b bulkJSON, answered bool, err error) {
	if b, err = decodeBulk(r, replay); err != nil {
		jsonError(w, http.StatusBadRequest, "%v", err)
		return b, true, nil
	}
	a.bulk.Lock()
	defer a.bulk.Unlock()
	f, ok := a.spoolFilter(*cmp.Or(b.Filter, &filterJSON{})) // ids mode: no filter
	if !ok {
		jsonError(w, http.StatusNotFound, "filter.lane: no lane has that label (GET /relay/v1/lanes lists them)")
		return b, true, nil
	}
	ctx, cancel := context.WithTimeout(a.stopCtx, bulkCallTimeout)
	defer cancel()
	ans.NotFound, ans.More, err = a.selected(b, f, func(page []storage.DeadLetter) error { return visit(ctx, b, page) })
	if ans.NotFound == nil {
		ans.NotFound = []uint64{}
	}
	return b, false, err
}

type replayJSON struct {
	Replayed int         `json:"replayed"`
	Lanes    []laneCount `json:"lanes"`
	bulkAnswer
}

// replayDead: POST /relay/v1/deadletters/replay
//
// Every selected dead letter's record is appended (durably) to the tail of
// the lane of its kind and options, under its own api_key or the request's
// api_key, and only then is the dead letter deleted.
func (a *Relay) replayDead(w http.ResponseWriter, r *http.Request) {
	out := replayJSON{Lanes: []laneCount{}}
	counts := map[string]*laneCount{}
	b, answered, err := a.bulkCall(w, r, true, &out.bulkAnswer, func(ctx context.Context, b bulkJSON, page []storage.DeadLetter) error {
		// Group the page by target lane, keeping id order within a lane.
		byKey := map[storage.LaneKey][]storage.DeadLetter{}
		var keys []storage.LaneKey
		for _, d := range page {
			k := d.Lane
			if b.APIKey != "" {
				k.APIKey = b.APIKey
			}
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], d)
		}
		for _, k := range keys {
			if err := a.replayLane(ctx, k, byKey[k], counts, &out); err != nil {
				return err
			}
		}
		return nil
	})
	if answered {
		return
	}
	for _, c := range counts {
		out.Lanes = append(out.Lanes, *c)
	}
	slices.SortFunc(out.Lanes, func(x, y laneCount) int { return strings.Compare(x.Lane, y.Lane) })
	fields := []zap.Field{zap.Int("replayed", out.Replayed), zap.Bool("corrected_api_key", b.APIKey != "")}
	for _, c := range out.Lanes {
		fields = append(fields, zap.Int("lane "+c.Lane, c.Records))
	}
	if err != nil {
		a.log.Error("replaying dead letters failed part way", append(fields, errField(err))...)
		out.Error = "replay stopped: " + err.Error()
		status := http.StatusInternalServerError
		// The spool's and the fleet's refusals for space match storage.ErrFull.
		if errors.Is(err, storage.ErrFull) || errors.Is(err, storage.ErrUnavailable) || errors.Is(err, spool.ErrTooManyLanes) {
			status = http.StatusServiceUnavailable
			w.Header().Set("Retry-After", "30")
		}
		adminroute.WriteJSON(w, status, out)
		return
	}
	a.log.Info("dead letters replayed", fields...)
	adminroute.WriteJSON(w, http.StatusOK, out)
}

type purgeJSON struct {
	Purged int `json:"purged"`
	bulkAnswer
}

// purgeDead: POST /relay/v1/deadletters/purge
func (a *Relay) purgeDead(w http.ResponseWriter, r *http.Request) {
	var out purgeJSON
	_, answered, err := a.bulkCall(w, r, false, &out.bulkAnswer, func(ctx context.Context, _ bulkJSON, page []storage.DeadLetter) error {
		ids := make([]uint64, len(page))
		for i, d := range page {
			ids[i] = d.ID
		}
		if err := a.cfg.Store.DeleteDead(ctx, ids); err != nil {
			return fmt.Errorf("delete dead letters: %w", err)
		}
		out.Purged += len(ids)
		a.purged.Add(float64(len(ids)))
		return nil
	})
	switch {
	case answered:
	case err != nil:
		a.log.Error("purging dead letters failed part way", zap.Int("purged", out.Purged), errField(err))
		out.Error = "purge stopped: " + err.Error()
		adminroute.WriteJSON(w, http.StatusInternalServerError, out)
	default:
		a.log.Info("dead letters purged", zap.Int("purged", out.Purged))
		adminroute.WriteJSON(w, http.StatusOK, out)
	}
}

type laneJSON struct {
	Label   string `json:"label"`
	Kind    string `json:"kind"`
	Records int64  `json:"records"`
	Chunks  int64  `json:"chunks"`
	Bytes   int64  `json:"bytes"`
	// Oldest is when the oldest waiting record was accepted (null when the
	// lane is empty); OldestAgeSeconds is its age now.
	Oldest           *time.Time `json:"oldest"`
	OldestAgeSeconds float64    `json:"oldest_age_seconds"`
	// Controllable says whether a deliverer reports on this lane and can
	// pause it; the fields below are zero when it is false.
	Controllable   bool   `json:"controllable"`
	Running        bool   `json:"running"`
	Stopped        bool   `json:"stopped"`
	StopReason     string `json:"stop_reason"`
	PausedKeys     int64  `json:"paused_keys"`
	HeldEvents     int64  `json:"held_events"`
	ReadAheadBytes int64  `json:"read_ahead_bytes"`
}

func (a *Relay) statuses() map[uint64]delivery.LaneStatus {
	out := map[uint64]delivery.LaneStatus{}
	for k, c := range a.cfg.Lanes {
		if a.cfg.Fleet && k == storage.KindEvents {
			continue // the fleet's runners are not spool lanes: fleetLanes
		}
		for _, st := range c.LaneStatus() {
			out[st.ID] = st
		}
	}
	return out
}

func (a *Relay) laneJSON(l *spool.Lane, sts map[uint64]delivery.LaneStatus, now time.Time) laneJSON {
	st := l.Stats()
	j := laneJSON{Label: l.Key().Label(), Kind: l.Key().Kind.String(), Records: st.Records, Chunks: st.Chunks, Bytes: st.Bytes}
	if !st.Oldest.IsZero() {
		t := st.Oldest.UTC()
		j.Oldest = &t
		j.OldestAgeSeconds = max(0, now.Sub(st.Oldest).Seconds())
	}
	if a.cfg.Lanes[l.Key().Kind] != nil {
		j.Controllable = true
		if s, ok := sts[l.ID()]; ok {
			j.Running, j.Stopped, j.StopReason = true, s.Stopped, s.StopReason
			j.PausedKeys, j.HeldEvents, j.ReadAheadBytes = s.PausedKeys, s.HeldEvents, s.ReadAheadBytes
		}
	}
	return j
}

// listLanes: GET /relay/v1/lanes
func (a *Relay) listLanes(w http.ResponseWriter, r *http.Request) {
	sts, now := a.statuses(), time.Now()
	lanes := []laneJSON{}
	for _, l := range a.sp.Lanes() {
		lanes = append(lanes, a.laneJSON(l, sts, now))
	}
	for _, st := range a.fleetLanes() {
		lanes = append(lanes, fleetLaneJSON(st))
	}
	adminroute.WriteJSON(w, http.StatusOK, map[string][]laneJSON{"lanes": lanes})
}

// laneOf finds the lane label names: a spool lane or, in fleet mode, one of
// this relay's events runners. view is its answer now; c and id pause and
// resume it (c nil: its kind has no deliverer that can); gone is why c
// could not.
func (a *Relay) laneOf(label string) (view func() laneJSON, c delivery.LaneControl, id uint64, gone string, ok bool) {
	if l := a.laneByLabel(label); l != nil {
		view = func() laneJSON { return a.laneJSON(l, a.statuses(), time.Now()) }
		// A lane created a moment ago may not run yet.
		return view, a.cfg.Lanes[l.Key().Kind], l.ID(), "the lane's deliverer does not run it yet (retry in a second)", true
	}
	st, ok := a.fleetLane(label)
	view = func() laneJSON {
		if now, ok := a.fleetLane(label); ok {
			st = now
		}
		return fleetLaneJSON(st)
	}
	return view, a.cfg.Lanes[storage.KindEvents], st.ID, "the lane is no longer delivered by this relay", ok
}

// getLane: GET /relay/v1/lanes/{label}
func (a *Relay) getLane(w http.ResponseWriter, r *http.Request) {
	view, _, _, _, ok := a.laneOf(r.PathValue("label"))
	if !ok {
		jsonError(w, http.StatusNotFound, "no lane has that label (GET /relay/v1/lanes lists them)")
		return
	}
	adminroute.WriteJSON(w, http.StatusOK, view())
}

// laneAction: POST /relay/v1/lanes/{label}/pause and .../resume
func (a *Relay) laneAction(w http.ResponseWriter, r *http.Request) {
	label, action := r.PathValue("label"), r.PathValue("action")
	if action != "pause" && action != "resume" {
		jsonError(w, http.StatusNotFound, "not found (POST /relay/v1/lanes/{label}/pause or /resume)")
		return
	}
	view, c, id, gone, ok := a.laneOf(label)
	switch {
	case !ok:
		jsonError(w, http.StatusNotFound, "no lane has that label (GET /relay/v1/lanes lists them)")
		return
	case c == nil:
		jsonError(w, http.StatusConflict, "lanes of kind %s cannot be paused or resumed", view().Kind)
		return
	}
	do := c.ResumeLane
	if action == "pause" {
		do = c.StopLane
	}
	if err := do(id); err != nil {
		jsonError(w, http.StatusConflict, "%s: %s", action, gone)
		return
	}
	a.log.Info("lane "+action+"d by operator", zap.String("lane", label))
	adminroute.WriteJSON(w, http.StatusOK, view())
}

// errField logs an error as its message only.
func errField(err error) zap.Field { return zap.String("error", err.Error()) }
