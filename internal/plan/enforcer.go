package plan

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/ratelimit"
)

// ReasonPlan is the dead-letter reason of a quarantined event.
const ReasonPlan = "plan"

// Defaults of Config's zero values.
const (
	DefaultRefresh = 5 * time.Minute
	// DefaultShare is the part of the taxonomy API's period cost that the
	// plan's reads may take per project: the rest stays the operators'.
	DefaultShare = 0.5
	// sampleCount is how many violating events a project keeps to show.
	sampleCount = 10
)

// Config configures an Enforcer. Only cmd/relay fills it from flags.
type Config struct {
	// Default is the mode of the projects whose tracking_plan is empty.
	Default Mode
	// Refresh is how often each project's plan is read again; zero means
	// DefaultRefresh.
	Refresh time.Duration
	// Dir is where plans are kept between runs (the data dir); "" means
	// nowhere (tests).
	Dir string
	// AnalyticsURL is the taxonomy API's base (--analytics-url) of the
	// projects without their own, read at every fetch (a reload may change
	// it); nil means none.
	AnalyticsURL *baseurl.Ref
	// Share is the part of the limiter's Limit (per Window) the plan's
	// reads may spend per project; zero means DefaultShare.
	Share float64
}

// Enforcer keeps each project's plan (fetched, cached, persisted) and
// checks the events of its lanes. Its methods are safe for concurrent use.
type Enforcer struct {
	cfg   Config
	creds *credentials.Ref
	lim   *ratelimit.Limiter // the forwarded taxonomy API's: the cost is shared
	// budget counts the plan's reads per project against Config.Share of
	// lim's Limit per Window; it never waits (ErrBudget).
	budget *ratelimit.Limiter
	hc     Doer
	log    *zap.Logger
	wake   chan struct{}
	// live is cfg's Default and Refresh in force (SetLive); relive
	// (capacity 1) tells Run to read the plans again by them.
	live   atomic.Pointer[Live]
	relive chan struct{}
	// vets is Vet's index, made again when the credentials or live change.
	vets atomic.Pointer[vetIndex]

	// mu guards states; a state's own fields are atomics or under its mu.
	mu     sync.Mutex
	states map[string]*state // by project name, never removed (bounded by the credentials files' projects)

	violations  *prometheus.CounterVec
	quarantined prometheus.Counter
}

// state is one project's.
type state struct {
	name       string
	cur        atomic.Pointer[cached]
	violations []prometheus.Counter // by index in Kinds
	refresh    atomic.Bool          // a change went through the forwarded API

	fetchMu sync.Mutex // held across a fetch: one fetch per project at a time

	mu      sync.Mutex // guards below; never held across a call out
	lastErr string
	samples []Sample
}

type cached struct {
	plan    *Plan
	c       *compiled
	fetched time.Time
}

// Sample is a violating event kept to show.
type Sample struct {
	At         time.Time       `json:"at"`
	Mode       string          `json:"mode"`
	EventType  string          `json:"event_type"`
	Violations []Violation     `json:"violations"`
	Event      json.RawMessage `json:"event"`
}

// New returns an Enforcer reading plans with lim (the forwarded taxonomy
// API's limiter: the cost is shared) through hc.
func New(cfg Config, creds *credentials.Ref, lim *ratelimit.Limiter, hc Doer, log *zap.Logger, reg prometheus.Registerer) (*Enforcer, error) {
	switch {
	case cfg.Default > Block:
		return nil, fmt.Errorf("plan: mode %v", cfg.Default)
	case cfg.Refresh < 0:
		return nil, fmt.Errorf("plan: refresh %v < 0", cfg.Refresh)
	case cfg.Share < 0 || cfg.Share > 1:
		return nil, fmt.Errorf("plan: share %v: want 0 to 1", cfg.Share)
	}
	cfg.Refresh, cfg.Share = cmp.Or(cfg.Refresh, DefaultRefresh), cmp.Or(cfg.Share, DefaultShare)
	log = cmp.Or(log, zap.NewNop())
	c := lim.Config() // its Window defaulted; no Limit, no budget
	if c.Limit > 0 {
		c.Limit = max(1, int(float64(c.Limit)*cfg.Share))
	}
	budget, err := ratelimit.New(ratelimit.Config{Name: "plan", Limit: c.Limit, Window: c.Window, MaxWait: -1}, nil)
	if err != nil {
		return nil, err
	}
	e := &Enforcer{cfg: cfg, creds: creds, log: log, wake: make(chan struct{}, 1), relive: make(chan struct{}, 1), states: map[string]*state{},
		lim: lim, budget: budget, hc: hc,
		violations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "relay_plan_violations_total",
			Help: "Tracking-plan violations found at delivery, by project and kind (a resent event is checked and counted again)."}, []string{"project", "kind"}),
		quarantined: prometheus.NewCounter(prometheus.CounterOpts{Name: "relay_plan_quarantined_total",
			Help: "Events quarantined by the tracking plan (dead letters with reason plan; by project: GET /relay/v1/deadletters?reason=plan&project=)."}),
	}
	e.live.Store(&Live{Default: cfg.Default, Refresh: cfg.Refresh})
	if reg != nil {
		for _, c := range []prometheus.Collector{e.violations, e.quarantined, ageCollector{e}} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("plan metrics: %w", err)
			}
		}
	}
	return e, nil
}

// Live are the settings of Config a running Enforcer can change (a
// configuration reload).
type Live struct {
	Default Mode          // Config.Default
	Refresh time.Duration // Config.Refresh; zero means DefaultRefresh
}

// SetLive puts l (valid as New checks Config) in force: the mode at
// once for every event checked after it, the backlog's too; the plans are
// read again now (a project the new mode checks may have none yet), then
// every l.Refresh.
func (e *Enforcer) SetLive(l Live) {
	l.Refresh = cmp.Or(l.Refresh, DefaultRefresh)
	e.live.Store(&l)
	select {
	case e.relive <- struct{}{}:
	default:
	}
}

// state returns the project's state, made on first use (with its plan
// from Dir when one was kept).
func (e *Enforcer) state(name string) *state {
	e.mu.Lock()
	st := e.states[name]
	e.mu.Unlock()
	if st != nil {
		return st
	}
	st = &state{name: name}
	for _, k := range Kinds {
		st.violations = append(st.violations, e.violations.WithLabelValues(name, k))
	}
	if p, at, err := load(e.cfg.Dir, name); err == nil {
		if c, err := compile(p); err == nil {
			st.cur.Store(&cached{plan: p, c: c, fetched: at})
		}
	} else if !errors.Is(err, errNone) {
		e.log.Error("kept tracking plan unreadable; observing until it is read again", zap.String("project", name), zap.Error(err))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if have := e.states[name]; have != nil {
		return have
	}
	e.states[name] = st
	return st
}

// mode is the project's mode in force: its own, else the default.
func (e *Enforcer) mode(p *credentials.Project) Mode {
	if m, err := ParseMode(p.TrackingPlan); err == nil && p.TrackingPlan != "" {
		return m
	}
	return e.live.Load().Default
}

// Check returns the check of the events of api key's lanes, for
// delivery.Frame.Check. The project (by the key) and its mode are looked
// up at every call, and its plan loaded: a reload or a new plan takes
// effect at once, on the backlog too. A record whose verdict (Vet) is of
// the plan and mode in force is delivered as it is, unchecked.
func (e *Enforcer) Check(apiKey string) func(data []byte, verdict uint64) ([]byte, string, []byte) {
	// The lane's target in Vet's index, looked up again only when the
	// index changed (a lookup hashes the key; the lane's shards call this
	// at once).
	type lookup struct {
		ix *vetIndex
		t  vetTarget
	}
	var last atomic.Pointer[lookup]
	return func(data []byte, verdict uint64) ([]byte, string, []byte) {
		ix, l := e.index(), last.Load()
		if l == nil || l.ix != ix {
			l = &lookup{ix: ix, t: ix.by[apiKey]}
			last.Store(l)
		}
		st, m := l.t.st, l.t.m
		if st == nil { // no project has the key, or its mode is off
			return data, "", nil
		}
		cur := st.cur.Load()
		if cur == nil || verdict != 0 && verdict == verdictOf(cur.c.tag, m) {
			// Never read (observing, with nothing to observe against),
			// or found clean against this plan and mode at ingest.
			return data, "", nil
		}
		v, vs := cur.c.check(data, m, nil) // allocates only for a violation
		if len(vs) == 0 {
			return data, "", nil
		}
		for _, x := range vs {
			st.violations[slices.Index(Kinds, x.Kind)].Inc()
		}
		st.sample(m, v.eventType, vs, data)
		if v.quarantine {
			e.quarantined.Inc()
			ans, _ := json.Marshal(Quarantine{Project: st.name, Mode: m.String(), EventType: v.eventType, Violations: vs})
			return data, ReasonPlan, ans
		}
		if v.out != nil {
			return v.out, "", nil
		}
		return data, "", nil
	}
}

// Quarantine is the answer of a dead letter with reason plan.
type Quarantine struct {
	Project    string      `json:"project"`
	Mode       string      `json:"mode"`
	EventType  string      `json:"event_type"`
	Violations []Violation `json:"violations"`
}

func (st *state) sample(m Mode, et string, vs []Violation, data []byte) {
	s := Sample{At: time.Now().UTC(), Mode: m.String(), EventType: et, Violations: slices.Clone(vs),
		Event: json.RawMessage(slices.Clone(data))}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.samples) >= sampleCount {
		st.samples = append(st.samples[:0], st.samples[1:]...)
	}
	st.samples = append(st.samples, s)
}
