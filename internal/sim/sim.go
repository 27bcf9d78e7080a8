package sim

import (
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Config configures a Sim. Zero values mean the upstream's documented rules.
type Config struct {
	// EPSThreshold is the per-device and per-user events/s limit; 0 means 30.
	EPSThreshold int
	// RateWindow is the window the rate is averaged over; 0 means 10s.
	RateWindow time.Duration
	// ThrottlePenalty is how long a device or user named in a 429 stays
	// throttled whatever its rate; 0 means 30s, negative means no penalty
	// (only the measured rate counts).
	ThrottlePenalty time.Duration
	// DedupWindow is how long an insert_id is remembered per device; 0 means 7 days.
	DedupWindow time.Duration
	// DedupMaxKeys bounds the remembered insert_ids; 0 means 4,194,304. The
	// oldest are forgotten first (see Stats.DedupEvicted).
	DedupMaxKeys int
	// MaxBodyBytes is the 413 limit: a body must be strictly shorter, as
	// sent and (when gzip-encoded) decoded; 0 means 1,000,000 (the relay's
	// reading of "under 1 MB"; 1<<20 plays the other).
	MaxBodyBytes int
	// MaxEvents is the event count limit: a request must hold strictly fewer;
	// 0 means 2000 ("under 2000 events"; 2001 plays the reading where 2000
	// is taken).
	MaxEvents int
	// APIKeys, when non-empty, are the only valid api_keys; others get 400
	// "Invalid API key". Empty means every non-empty key is valid.
	APIKeys []string
	// DailyQuota is the per-device limit of ingested events per UTC day;
	// 0 means none.
	DailyQuota int
	// Keep bounds the events kept in memory for read-out (oldest dropped
	// first; counts are always kept); 0 means 1,000,000, negative keeps none.
	Keep int
	// KeepRequests bounds the request log; 0 means 100,000, negative keeps none.
	KeepRequests int
	// CountOnly, when set, makes /2/httpapi and /batch answer 200 with the
	// events it counts in the body, validating and storing nothing (the
	// peak-rate benchmark sink; simtest.CountEvents is a cheap count).
	CountOnly func(body []byte) int
	// Now is the clock; nil means time.Now. Rate windows, penalties, dedup,
	// daily quotas and request times use it; injected latency uses real time.
	Now func() time.Time
	// Faults, when set, fails upstream requests on purpose and adds its
	// control routes (internal/simtest, tests only); nil in the product.
	Faults Faults

	// Readings of the document's ambiguous sentences (see the
	// package doc's Readings). The zero value of each is the strict reading.

	// LenientRate: only events already ingested count toward a key's
	// average (so one large request of a hot device is taken). False (the
	// strict reading): the request's own events count too, so a request
	// carrying more than EPSThreshold*RateWindow events of one key is
	// refused forever.
	LenientRate bool
	// RateAcrossKeys: the rate of a device or user is counted across every
	// api_key (projects), not per api_key.
	RateAcrossKeys bool
	// PartialThrottle: a 429 ingests the events it does not name in
	// throttled_events (the strict reading: nothing of a 429 is ingested).
	PartialThrottle bool
	// PartialSilence: a silenced 400 ingests the events it does not name
	// (silenced, over quota or throttled).
	PartialSilence bool
	// QuotaRolling: a device over its DailyQuota is refused for 24 hours
	// from its first refusal, not until the next UTC day.
	QuotaRolling bool
}

// Validate reports a configuration that cannot work.
func (c *Config) Validate() error {
	for _, f := range []struct {
		name     string
		negative bool
		v        any
	}{{"EPSThreshold", c.EPSThreshold < 0, c.EPSThreshold}, {"RateWindow", c.RateWindow < 0, c.RateWindow},
		{"DedupWindow", c.DedupWindow < 0, c.DedupWindow}, {"DedupMaxKeys", c.DedupMaxKeys < 0, c.DedupMaxKeys},
		{"MaxBodyBytes", c.MaxBodyBytes < 0, c.MaxBodyBytes}, {"MaxEvents", c.MaxEvents < 0, c.MaxEvents},
		{"DailyQuota", c.DailyQuota < 0, c.DailyQuota}} {
		if f.negative {
			return fmt.Errorf("sim: %s %v < 0", f.name, f.v)
		}
	}
	if slices.Contains(c.APIKeys, "") {
		return errors.New("sim: empty key in APIKeys")
	}
	return nil
}

// ErrClosed is returned by Serve after Close, and by Up after Close.
var ErrClosed = errors.New("sim: closed")

// Sim is a simulated upstream. Create it with New; serve it with Serve.
type Sim struct {
	cfg    Config
	log    *zap.Logger
	mux    *http.ServeMux
	ctlMux *http.ServeMux
	srv    *http.Server
	seed   maphash.Seed

	// mu guards everything below: the store, the knobs and every route
	// group's state (the groups reach theirs through closures).
	mu     sync.Mutex
	store  store
	knobs  Knobs
	mg     *mgmtState
	resets []func() // each route group's (onReset)

	counted     atomic.Int64 // CountOnly events
	connections atomic.Int64 // connections accepted by Serve listeners
}

// Knobs are the settings tests turn while a Sim runs, each a rule of the
// upstream that the product leaves at the documented value (New's, from
// Config). internal/simtest turns them through Sim.Knobs.
type Knobs struct {
	// DailyQuota is Config.DailyQuota.
	DailyQuota int
	// Silenced devices (of every api_key) get the silenced 400; Reset keeps them.
	Silenced map[string]bool
	// RefusedKeys are answered "Invalid API key" until the time given
	// (Config.Now), as an upstream may while a key is rotated: the reading
	// of ambiguity 10 where an invalid key is transient.
	RefusedKeys map[string]time.Time
	// ManagementKeys and SCIMTokens (token -> organization), when any, are
	// the only ones accepted (others 403); with none, any token is, as its
	// own organization. ProjectSecrets (api key -> secret key), when one is
	// set for a key, is the only secret the classifier and taxonomy routes
	// take with it.
	ManagementKeys map[string]bool
	SCIMTokens     map[string]string
	ProjectSecrets map[string]string
	// SCIMLimit requests per SCIMWindow per organization.
	SCIMLimit  int
	SCIMWindow time.Duration
	// Taxonomy limits per api key: cost in flight, cost per period; every
	// taxonomy request is held TaxonomyDelay in flight (so tests see
	// concurrency).
	TaxonomyMaxInFlight, TaxonomyPeriodCost int
	TaxonomyPeriod, TaxonomyDelay           time.Duration
	// UserMapLimit mapping calls per UserMapWindow per organization;
	// UserMapOrgs puts api keys in organizations (sharing the rate and the
	// mappings; a key in none is its own); UserMapSecrets (api key ->
	// secret) is the only secret GET /api/2/usermap takes for that key.
	UserMapLimit   int
	UserMapWindow  time.Duration
	UserMapOrgs    map[string]string
	UserMapSecrets map[string]string
	// A POST /usermap holding one of RejectedUserIDs, a /groupidentify
	// holding one of RejectedGroupValues, is answered 400 naming no index;
	// Reset forgets them.
	RejectedUserIDs, RejectedGroupValues map[string]bool
	// DSARPollsToDone is how many status polls a DSAR job takes; the next
	// DSARFailNext jobs end "failed"; a done job's urls last DSARURLTTL.
	DSARPollsToDone, DSARFailNext int
	DSARURLTTL                    time.Duration
	// ExportMaxBytes is the largest estimated export (larger: 400);
	// ExportSyntheticBytes adds that many bytes of synthetic records to
	// every hour of a range.
	ExportMaxBytes, ExportSyntheticBytes int64
}

// Knobs runs f on the knobs with the Sim locked (f must not call the Sim).
func (s *Sim) Knobs(f func(k *Knobs)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.knobs)
}

// New returns a simulator. log may be nil. It panics if cfg is invalid
// (call cfg.Validate first to get an error instead).
func New(cfg Config, log *zap.Logger) *Sim {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	if log == nil {
		log = zap.NewNop()
	}
	cfg.EPSThreshold, cfg.RateWindow = cmp.Or(cfg.EPSThreshold, 30), cmp.Or(cfg.RateWindow, 10*time.Second)
	cfg.ThrottlePenalty, cfg.DedupWindow = cmp.Or(cfg.ThrottlePenalty, 30*time.Second), cmp.Or(cfg.DedupWindow, 7*24*time.Hour)
	cfg.DedupMaxKeys, cfg.MaxBodyBytes = cmp.Or(cfg.DedupMaxKeys, 1<<22), cmp.Or(cfg.MaxBodyBytes, 1_000_000)
	cfg.MaxEvents, cfg.Keep, cfg.KeepRequests = cmp.Or(cfg.MaxEvents, 2000), cmp.Or(cfg.Keep, 1_000_000), cmp.Or(cfg.KeepRequests, 100_000)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Sim{cfg: cfg, log: log, seed: maphash.MakeSeed()}
	s.store.init(&s.cfg, s.seed, &s.knobs)
	s.knobs = Knobs{DailyQuota: cfg.DailyQuota, Silenced: map[string]bool{}, RefusedKeys: map[string]time.Time{},
		ManagementKeys: map[string]bool{}, SCIMTokens: map[string]string{}, ProjectSecrets: map[string]string{},
		SCIMLimit: 100, SCIMWindow: time.Minute, TaxonomyMaxInFlight: 4, TaxonomyPeriodCost: 7200,
		TaxonomyPeriod: time.Hour, UserMapLimit: 1500, UserMapWindow: 30 * time.Second,
		UserMapOrgs: map[string]string{}, UserMapSecrets: map[string]string{},
		RejectedUserIDs: map[string]bool{}, RejectedGroupValues: map[string]bool{}, DSARPollsToDone: 3,
		DSARURLTTL: 48 * time.Hour, ExportMaxBytes: 4 << 30}
	s.mux = http.NewServeMux()
	s.ctlMux = http.NewServeMux()
	// The route groups of doc.go's table, a file each.
	for _, register := range []func(){s.registerHTTPAPI, s.registerControl, s.registerMgmt, s.registerGroupIdentify,
		s.registerUserMap, s.registerExperiments, s.registerSCIM, s.registerClassifiers, s.registerTaxonomy,
		s.registerFeedback, s.registerDSAR, s.registerDeletion, s.registerExport} {
		register()
	}
	if cfg.Faults != nil {
		cfg.Faults.Routes(s, s.ctlMux)
	}
	s.mux.Handle("/sim/", s.ctlMux)
	s.route("/", routeHandler{serve: func(http.ResponseWriter, *http.Request, *incoming) (int, any) { // unknown paths
		return codeError(http.StatusBadRequest, ErrTextInvalidPath)
	}})
	s.srv = &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: zap.NewStdLog(log),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				s.connections.Add(1)
			}
		}}
	return s
}

// Handler returns the simulator's routes, including its read-outs under
// /sim/ (and Config.Faults' routes when set). Faults of kind "drop" need a
// hijackable ResponseWriter.
func (s *Sim) Handler() http.Handler { return s.mux }

// ControlHandler returns only the /sim/ routes: the read-outs (what was
// ingested, the request log, counters) and Config.Faults' routes when set.
func (s *Sim) ControlHandler() http.Handler { return s.ctlMux }

// Serve serves on ln until Close.
func (s *Sim) Serve(ln net.Listener) error {
	err := s.srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return ErrClosed
	}
	return err
}

// Close stops serving: listeners are closed and connections dropped.
func (s *Sim) Close() error { return s.srv.Close() }

// Start listens on addr (e.g. "127.0.0.1:0") and serves in a new goroutine.
// It returns the base URL ("http://127.0.0.1:PORT"). Errors of Serve after
// the start are logged.
func (s *Sim) Start(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("sim: listen: %w", err)
	}
	go func() {
		if err := s.Serve(ln); err != nil && !errors.Is(err, ErrClosed) {
			s.log.Error("sim serve", zap.Error(err))
		}
	}()
	return "http://" + ln.Addr().String(), nil
}

func locked[T any](mu *sync.Mutex, f func() T) T {
	mu.Lock()
	defer mu.Unlock()
	return f()
}

// entry returns m[k], adding mk() first when there is none.
func entry[K comparable, V any](m map[K]V, k K, mk func() V) V {
	v, ok := m[k]
	if !ok {
		v = mk()
		m[k] = v
	}
	return v
}

// onReset runs reset, which makes a route group's state, now and on every
// Reset.
func (s *Sim) onReset(reset func()) {
	reset()
	s.resets = append(s.resets, reset)
}

// validKey reports whether apiKey is acceptable: non-empty, one of
// Config.APIKeys when those are set, and not refused (Knobs.RefusedKeys).
// The caller must not hold s.mu.
func (s *Sim) validKey(apiKey string) bool {
	if apiKey == "" || (len(s.cfg.APIKeys) > 0 && !slices.Contains(s.cfg.APIKeys, apiKey)) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.knobs.RefusedKeys[apiKey]
	if ok && !s.cfg.Now().Before(u) {
		delete(s.knobs.RefusedKeys, apiKey)
		return true
	}
	return !ok
}
