package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/svcrelay/relay/internal/adminapi"
	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/forms"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/groupidentify"
	"github.com/svcrelay/relay/internal/ingest"
	"github.com/svcrelay/relay/internal/plan"
	"github.com/svcrelay/relay/internal/ratelimit"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/tap"
	"github.com/svcrelay/relay/internal/throttle"
	"github.com/svcrelay/relay/internal/tlsreload"
	"github.com/svcrelay/relay/internal/upstream"
	"github.com/svcrelay/relay/internal/usermap"
	"go.uber.org/zap"
)

// lifecycle records a stop function for everything serve starts, and runs
// them in reverse order of start. Every component has exactly one owner: the
// lifecycle that started it.
type lifecycle struct {
	log   *zap.Logger
	stops []namedStop
}

type namedStop struct {
	name string
	stop func(ctx context.Context) error
}

// onStop registers the stop of the component just started.
func (l *lifecycle) onStop(name string, stop func(ctx context.Context) error) {
	l.stops = append(l.stops, namedStop{name, stop})
}

// stopAll runs every stop, last started first, each bounded by ctx (a stop
// whose ctx has ended must still release what it holds, e.g. close a file).
func (l *lifecycle) stopAll(ctx context.Context) error {
	var errs []error
	for i := len(l.stops) - 1; i >= 0; i-- {
		s := l.stops[i]
		t0 := time.Now()
		if err := s.stop(ctx); err != nil {
			l.log.Error("stop failed", zap.String("component", s.name), errField(err))
			errs = append(errs, fmt.Errorf("stop %s: %w", s.name, err))
			continue
		}
		l.log.Info("stopped", zap.String("component", s.name), zap.Duration("took", time.Since(t0)))
	}
	l.stops = nil
	return errors.Join(errs...)
}

// goroutines runs the components' long-running calls (Serve, Run) and
// reports the first one that fails while it should still be running.
type goroutines struct {
	wg     sync.WaitGroup
	failed chan error // buffered 1: the first failure
}

func (g *goroutines) run(name string, f func() error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := f(); err != nil {
			select {
			case g.failed <- fmt.Errorf("%s: %w", name, err):
			default:
			}
		}
	}()
}

// component is a long-running part of delivery: internal/delivery's Pipeline,
// and the group identify and user mapping deliverers, have this shape.
type component interface {
	// Run delivers until ctx ends, then drains within its own time-out and
	// returns; it must return before the spool is closed.
	Run(ctx context.Context) error
	// Ready returns nil while Run is delivering.
	Ready() error
}

// namedComponent is a component with its name, for logs and /readyz.
type namedComponent struct {
	name string
	component
}

// backend is a store behind the seam: the spool's (spool.Backend) or the
// fleet's (fleet.Backend), each kind's delivery reading it, ingest, the
// form intakes and the dead-letter routes writing it.
type backend interface {
	forms.Store
	storage.DeadLetters
}

// deliveries is everything built on the spool and the upstream client: the
// event pipeline, group identify and user mapping (each a component with its
// admin routes), and the lane controls of the /relay/v1 API.
type deliveries struct {
	client     *upstream.Client // for /readyz's word on the upstream
	live       *liveMeter       // the events lanes' sender: the backfills yield to it
	components []namedComponent
	routes     []adminroute.Route
	lanes      map[storage.Kind]delivery.LaneControl
	// release drops buffers kept for reuse, before an idle process collects.
	release []func()
}

// buildDelivery builds the delivery side (not running yet: startDelivery).
func (s *server) buildDelivery() (*deliveries, error) {
	cfg, log, reg, creds := s.cfg, s.log, s.reg, s.creds
	client, err := upstream.New(upstream.Config{}, reg)
	if err != nil {
		return nil, fmt.Errorf("upstream client: %w", err)
	}
	thr, err := throttle.New(throttle.Config{}, reg)
	if err != nil {
		return nil, fmt.Errorf("throttle: %w", err)
	}
	bcfg := delivery.Config{Live: cfg.DeliveryLive(), DrainTimeout: cfg.DrainTimeout}
	bcfg.Check = s.tp.Check // the tracking plan, checked as events are packed
	bcfg.OnDead = s.taps.PublishDead
	var p *delivery.Pipeline
	live := &liveMeter{next: tappedSender{client, s.taps}, windows: map[string]*rateWindow{}}
	if s.fs != nil { // the events partitions this relay owns; pauses and lane stops are the fleet's
		p, err = delivery.NewFleet(bcfg, s.kind(storage.KindEvents), s.fs.f, s.fs.f, live, thr, log.Named("delivery"), reg)
	} else {
		p, err = delivery.New(bcfg, s.kind(storage.KindEvents), live, thr, log.Named("delivery"), reg)
	}
	if err != nil {
		return nil, fmt.Errorf("delivery: %w", err)
	}
	d := &deliveries{
		client:     client,
		live:       live,
		components: []namedComponent{{"delivery", p}},
		lanes:      map[storage.Kind]delivery.LaneControl{storage.KindEvents: p},
		release:    []func(){p.ReleaseMemory},
	}

	gi, err := groupidentify.New(groupidentify.Config{
		URL:      s.bases["ingest-url"],
		Spooling: forms.Spooling{FormTiming: cfg.FormTiming(), Store: s.kind(storage.KindGroupIdentify)},
	}, client, creds, log.Named("groupidentify"), reg)
	if err != nil {
		return nil, fmt.Errorf("group identify: %w", err)
	}
	s.onHUP.add(func(c config.Config) { p.SetLive(c.DeliveryLive()) })
	d.components = append(d.components, namedComponent{"groupidentify", gi})
	d.lanes[storage.KindGroupIdentify] = gi
	d.routes = append(d.routes, gi.Routes()...)

	if cfg.AliasURL == "" || cfg.AnalyticsURL == "" {
		// Without the alias and analytics bases there is nowhere to send
		// mappings: the routes say so, and mappings spooled by an earlier
		// run wait for a start with both flags.
		log.Warn("user mapping disabled: POST /usermap answers 503 until --alias-url and --analytics-url are set")
		off := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeJSONError(w, http.StatusServiceUnavailable, "user mapping is not configured on this relay (--alias-url and --analytics-url)")
		})
		d.routes = append(d.routes,
			adminroute.Route{Method: http.MethodPost, Path: "/usermap", Mode: admintoken.ModeOwn, Handler: off})
		return d, nil
	}
	um, err := usermap.New(usermap.Config{
		AliasURL:     s.bases["alias-url"],
		AnalyticsURL: s.bases["analytics-url"],
		Spooling:     forms.Spooling{FormTiming: cfg.FormTiming(), Store: s.kind(storage.KindUserMap)},
	}, client, creds, log.Named("usermap"), reg)
	if err != nil {
		return nil, fmt.Errorf("user mapping: %w", err)
	}
	d.components = append(d.components, namedComponent{"usermap", um})
	d.lanes[storage.KindUserMap] = um
	d.routes = append(d.routes, um.Routes()...)
	return d, nil
}

// memoryLimitField is the soft memory limit in force (GOMEMLIMIT, or
// DefaultMemoryLimit set by run), "none" when there is none.
func memoryLimitField() zap.Field {
	switch limit := debug.SetMemoryLimit(-1); { // -1 only reads it
	case limit == math.MaxInt64:
		return zap.String("memory_limit", "none")
	case limit%(1<<20) == 0:
		return zap.String("memory_limit", fmt.Sprintf("%d MiB", limit>>20))
	default:
		return zap.String("memory_limit", fmt.Sprintf("%d bytes", limit))
	}
}

// serveHooks let a test reach into a serve it runs in its own process, and
// give serve what a reload needs.
type serveHooks struct {
	// load reads the configuration again for a reload (the same flags,
	// the environment, the files); nil: every reload is refused.
	load func() (config.Config, error)
	// level is the logger's level, which a reload sets; nil: kept.
	level *zap.AtomicLevel
	// format sets the logger's format (--log-format), which a reload
	// sets; nil: kept.
	format func(string) error

	// fleetOpened, when set, is given the NATS connection of fleet mode
	// (a test closes it to play a relay's sudden death).
	fleetOpened func(nc *nats.Conn)
}

// server is one serve's state, shared by its steps (serveWith).
type server struct {
	cfg      config.Config
	log      *zap.Logger
	hooks    serveHooks
	lc       *lifecycle
	g        *goroutines
	sd       notifier
	onHUP    *reloaders // every reloader, added by the step that builds what it reloads
	reload   *configReloader
	reg      *prometheus.Registry
	stopping atomic.Bool
	// listening is set once the ingest listener is bound: the admin
	// listener, and so /readyz, is up before it.
	listening atomic.Bool
	sandbox   *sim.Sim // sandbox mode's simulator; nil otherwise

	// openStore's.
	sp        *spool.Spool
	spoolOpen atomic.Bool
	// store is where every kind's records go: the spool behind the seam
	// (internal/storage), or fleet mode's; kind(k) is the store of kind
	// k's delivery (its lanes, or the fleet's partitions of k).
	store    backend
	kind     func(storage.Kind) backend
	fs       *fleetStore  // fleet mode's store; nil in local mode
	maxLanes atomic.Int64 // --max-lanes in force (a reload changes it), for /readyz

	// Shared by delivery, the admin listener and ingest.
	creds  *credentials.Ref // the credentials file in force (a reload swaps it)
	bases  upstreamBases
	taxLim *ratelimit.Limiter // the taxonomy API's: the plan's reads and the forwarded calls
	tp     *plan.Enforcer
	taps   *tap.Hub
}

// serveWith runs the relay until ctx ends (SIGTERM/SIGINT) or a component fails,
// then stops everything in reverse order of start. resetSignals restores the
// default signal handling once the stop begins, so a second signal kills.
//
// Start order: simulator (sandbox mode only), spool, delivery (built, not
// running), admin listener (with /relay/v1, /groupidentify, /usermap and the
// forwarding routes), delivery running (events, group identifies, user
// mappings), ingest listener. Stop order is the reverse: stop accepting
// events, drain the deliveries within --drain-timeout, stop the admin
// listener (no more group identifies or mappings accepted), close the
// spool, stop the simulator.
func serveWith(ctx context.Context, resetSignals func(), cfg config.Config, log *zap.Logger, hooks serveHooks) (err error) {
	s := &server{cfg: cfg, log: log, hooks: hooks, lc: &lifecycle{log: log}, g: &goroutines{failed: make(chan error, 1)},
		sd: notifier{addr: os.Getenv("NOTIFY_SOCKET")}, onHUP: &reloaders{}}
	defer func() { err = s.stop(err) }()
	if err := s.begin(); err != nil {
		return err
	}
	if err := s.openStore(); err != nil {
		return err
	}
	if err := s.openShared(); err != nil {
		return err
	}
	dl, err := s.buildDelivery()
	if err != nil {
		return err
	}
	admin, err := s.startAdmin(dl)
	if err != nil {
		return err
	}
	s.startDelivery(dl)
	if err := s.startIngest(admin); err != nil {
		return err
	}
	log.Info("relay serving")
	if err := s.sd.notify("READY=1\nSTATUS=serving"); err != nil {
		log.Warn("could not tell systemd the relay is ready", errField(err))
	}

	select {
	case <-ctx.Done():
		resetSignals()
		log.Info("signal received: stopping (a second signal kills)", zap.Duration("drain_timeout", s.cfg.DrainTimeout))
		return nil
	case err := <-s.g.failed:
		resetSignals()
		return err
	}
}

// stop stops everything started and returns err with the stops' errors.
func (s *server) stop(err error) error {
	s.stopping.Store(true)
	_ = s.sd.notify("STOPPING=1")
	// Ingest gets at most --drain-timeout, delivery drains within its own
	// --drain-timeout after that; the rest is for closing the spool.
	sctx, cancel := context.WithTimeout(context.Background(), 2*s.cfg.DrainTimeout+5*time.Second)
	defer cancel()
	err = errors.Join(err, s.lc.stopAll(sctx))
	s.g.wg.Wait()
	if err == nil {
		s.log.Info("relay stopped")
	}
	return err
}

// begin sets up what every later step uses: the reloads (SIGHUP, POST
// /relay/v1/reload), sandbox mode's simulator, the start's log lines and
// the metrics registry.
func (s *server) begin() error {
	cfg, log, hooks := s.cfg, s.log, s.hooks
	// SIGHUP (sighup.go) and POST /relay/v1/reload (reload.go) read the
	// configuration again and run every reloader with it; SIGHUP no longer
	// kills, and its watch is stopped last.
	s.reload = newConfigReloader(cfg, hooks.load, s.onHUP, log)
	if hooks.level != nil {
		s.onHUP.add(func(c config.Config) {
			if lvl, err := zap.ParseAtomicLevel(c.LogLevel); err == nil && lvl.Level() != hooks.level.Level() {
				hooks.level.SetLevel(lvl.Level())
				log.Info("reload: log level set", zap.String("log_level", c.LogLevel))
			}
		})
	}
	if hooks.format != nil {
		format := cfg.LogFormat
		s.onHUP.add(func(c config.Config) {
			if c.LogFormat == format {
				return
			}
			if err := hooks.format(c.LogFormat); err != nil { // validated: cannot happen
				log.Error("reload: log format not set", errField(err))
				return
			}
			format = c.LogFormat // the reloads run one at a time
			log.Info("reload: log format set", zap.String("log_format", c.LogFormat))
		})
	}
	stopWatchHUP := watchSIGHUP(func() {
		log.Info("SIGHUP received: reloading")
		_ = s.sd.notify("RELOADING=1")
		s.reload.reload("SIGHUP")
		_ = s.sd.notify("READY=1")
	})
	s.lc.onStop("SIGHUP watch", func(context.Context) error { stopWatchHUP(); return nil })

	if cfg.Sandbox() {
		s.sandbox = sim.New(sim.Config{}, log.Named("sim"))
		s.lc.onStop("sim", func(context.Context) error { return s.sandbox.Close() })
		url, err := s.sandbox.Start("127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("sandbox simulator: %w", err)
		}
		for _, u := range s.cfg.UpstreamURLs() {
			if *u.URL == "" {
				*u.URL = url
			}
		}
		log.Info("sandbox mode: no --ingest-url given, so events go to the built-in simulated upstream (nothing leaves this machine); read what it received at http://"+cfg.AdminListen+"/sim/events",
			zap.Bool("sandbox", true), zap.String("upstream", url))
	} else {
		log.Info("relay starting", zap.Bool("sandbox", false), zap.String("upstream", cfg.IngestURL))
	}
	for _, w := range cfg.Warnings {
		log.Warn(w)
	}
	log.Info("configuration",
		zap.String("listen", cfg.Listen), zap.String("admin_listen", cfg.AdminListen),
		zap.String("data_dir", cfg.DataDir), zap.String("sync", cfg.Sync),
		zap.Int64("spool_max_bytes", cfg.SpoolMaxBytes), zap.Int64("spool_min_free_bytes", cfg.SpoolMinFreeBytes),
		zap.Int64("max_request_bytes", cfg.MaxRequestBytes), zap.Int("max_batch_events", cfg.MaxBatchEvents),
		zap.Int64("max_batch_bytes", cfg.MaxBatchBytes), zap.Duration("flush_interval", cfg.FlushInterval),
		zap.Duration("drain_timeout", cfg.DrainTimeout), zap.Bool("admin_token", cfg.Token != nil),
		zap.Bool("credentials", cfg.Creds != nil),
		memoryLimitField(), zap.Int("gomaxprocs", runtime.GOMAXPROCS(0)),
		zap.String("version", versionString()))
	if cfg.Creds != nil {
		// Names only: a Store never logs a secret.
		log.Info("credentials loaded", zap.String("file", cfg.Credentials), zap.Object("credentials", cfg.Creds))
	}

	// The relay's own metrics, on a new registry: their names cannot clash.
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo(), s.reload.ok, s.reload.at,
	)
	return nil
}

// openStore opens the spool in --data-dir and, in fleet mode, the fleet's
// store, and passes the spool's upstream guard.
func (s *server) openStore() error {
	cfg, log := s.cfg, s.log
	upstreamID := upstreamIdentity(cfg.IngestURL)
	if s.sandbox != nil { // cfg.IngestURL is the simulator's, new at every start
		upstreamID = sandboxUpstream
	}
	sp, err := spool.Open(spool.Config{Dir: cfg.DataDir, NoSync: cfg.Sync == "none", MaxBytes: cfg.SpoolMaxBytes,
		MinFreeBytes: cfg.SpoolMinFreeBytes, MaxLanes: cfg.MaxLanes, MaxLanesPerKey: cfg.MaxLanesPerKey,
		RetireIdle: cfg.LaneRetireAfter}, log.Named("spool"), s.reg)
	if err != nil {
		return fmt.Errorf("open spool in %s: %w%s", cfg.DataDir, err, spoolHint(cfg.DataDir, err))
	}
	s.sp = sp
	s.spoolOpen.Store(true)
	s.lc.onStop("spool", func(context.Context) error {
		s.spoolOpen.Store(false)
		return sp.Close()
	})
	// Open may have replayed tens of MB of the spool's write-ahead log:
	// give that memory back before serving, or a relay restarted on a
	// backlog keeps it as RSS until its first collection.
	debug.FreeOSMemory()
	local := spool.NewBackend(sp)
	s.store, s.kind = local, func(k storage.Kind) backend { return local.Only(k) }
	// Fleet mode's store, stopped after delivery gave its
	// partitions up (stops run in reverse).
	if cfg.SpoolNATS != nil {
		if s.fs, err = openFleet(cfg, log, s.reg); err != nil {
			return err
		}
		s.store, s.kind = s.fs.b, func(k storage.Kind) backend { return s.fs.b.Only(k) }
		s.lc.onStop("fleet", s.fs.close)
		if s.hooks.fleetOpened != nil {
			s.hooks.fleetOpened(s.fs.nc)
		}
		for _, l := range sp.Lanes() {
			if l.Stats().Records > 0 { // every kind is the fleet's
				log.Warn("records spooled in --data-dir by an earlier run without --spool nats:// are not delivered in fleet mode: run the relay once with --spool local to deliver them",
					zap.String("lane", l.Key().Label()), zap.Int64("records", l.Stats().Records))
			}
		}
	}
	st := sp.Stats()
	log.Info("spool open", zap.String("dir", cfg.DataDir), zap.Int("lanes", st.Lanes),
		zap.Int64("live_bytes", st.LiveBytes), zap.Int64("file_bytes", st.FileBytes), zap.Int64("dead", st.Dead))
	if err := guardSpoolUpstream(sp, upstreamID, cfg.SpoolUpstreamChange == "allow", log); err != nil {
		return err
	}
	s.reload.setGuard(reloadUpstreamGuard(sp, log))
	s.maxLanes.Store(int64(cfg.MaxLanes))
	s.onHUP.add(func(c config.Config) {
		sp.SetLaneLimits(c.MaxLanes, c.MaxLanesPerKey, c.LaneRetireAfter)
		s.maxLanes.Store(int64(c.MaxLanes))
	})
	return nil
}

// openShared builds what delivery, the admin listener and ingest share: the
// credentials file and the upstream bases in force, the tracking plan and
// the live taps.
func (s *server) openShared() error {
	cfg, log := s.cfg, s.log
	// Every reader of the credentials file loads it at each use, so a
	// reload can swap it (creds.Swap) without a restart.
	s.creds = credentials.NewRef(cfg.Creds)
	// The forwarded APIs, the user mappings, the tracking plan and the
	// backfills read the bases at every use.
	s.bases = upstreamBases{}
	s.bases.store(cfg)
	s.onHUP.add(func(c config.Config) {
		if !c.Sandbox() { // sandbox mode's simulator URLs are kept (config.LiveFrom)
			s.bases.store(c)
		}
	})
	var err error
	if s.taxLim, err = ratelimit.New(forward.TaxonomyLimit(forward.APIConfig{}), s.reg); err != nil {
		return err
	}
	s.tp, err = plan.New(cfg.Plan(s.bases["analytics-url"]), s.creds, s.taxLim, &http.Client{Timeout: time.Minute}, log.Named("plan"), s.reg)
	if err != nil {
		return err
	}
	planCtx, stopPlan := context.WithCancel(context.Background())
	s.lc.onStop("tracking plan", func(context.Context) error { stopPlan(); return nil })
	s.g.run("tracking plan", func() error { return s.tp.Run(planCtx) })
	s.onHUP.add(func(c config.Config) { s.tp.SetLive(c.PlanLive()) })
	// Live taps (relay tap): offered what ingest accepts, what the
	// upstream takes and the dead letters (tap.go).
	s.taps, err = tap.New(tap.Config{}, s.reg)
	return err
}

// ready is nil while the relay is ready (/readyz and relay_ready): not while
// stopping, before the ingest listener is bound, while ingest would refuse,
// or while a delivery is not running.
func (s *server) ready(dl *deliveries) error {
	switch {
	case s.stopping.Load():
		return errors.New("shutting down (draining): ingest refuses new requests")
	case !s.spoolOpen.Load():
		return errors.New("spool closed")
	case !s.listening.Load():
		return errors.New("ingest listener not open yet")
	}
	if err := s.sp.Stats().Refusing; err != nil { // a full disk at start, failing checkpoints
		return err
	}
	if err := s.fs.ready(); err != nil {
		return err
	}
	if err := ingestRefusal(s.sp.Stats().LiveBytes, s.cfg.SpoolMaxBytes, s.cfg.DataDir, s.cfg.SpoolMinFreeBytes); err != nil {
		return err
	}
	for _, c := range dl.components {
		if err := c.Ready(); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	// Ingest refuses new lanes (the contract's "lane limit").
	if m := int(s.maxLanes.Load()); m > 0 && s.sp.Stats().Lanes >= m {
		return fmt.Errorf("lane limit reached (--max-lanes %d): new api_keys are refused", m)
	}
	return nil
}

// startAdmin builds the admin listener with every route and starts it.
func (s *server) startAdmin(dl *deliveries) (*adminapi.Server, error) {
	cfg, log := s.cfg, s.log
	// Give the heap's free pages back once the relay goes quiet after a burst.
	idleCtx, stopIdle := context.WithCancel(context.Background())
	s.lc.onStop("idle memory return", func(context.Context) error { stopIdle(); return nil })
	s.g.run("idle memory return", func() error {
		returnIdleMemory(idleCtx, idleCheckEvery, idleQuietBytes, idleMinAlloc, dl.release...)
		return nil
	})
	relayAPI, err := adminapi.NewRelay(adminapi.RelayConfig{Lanes: dl.lanes, Store: s.store, Fleet: s.fs != nil}, s.sp, log.Named("admin"), s.reg)
	if err != nil {
		return nil, err
	}
	ready := func() error { return s.ready(dl) }
	registerOpsMetrics(s.reg, cfg.SpoolMaxBytes, cfg.SpoolMinFreeBytes, cfg.DataDir, ready)
	// The token in force can be swapped at run time (a reload: SetToken).
	admin, err := adminapi.New(adminapi.Config{
		Gatherer:  s.reg,
		Token:     cfg.Token,
		ReadyInfo: func() string { return upstreamInfo(dl.client, time.Now()) + s.tp.ReadyInfo() },
		Ready:     ready,
	}, log.Named("admin"), s.reg)
	if err != nil {
		return nil, err
	}
	if s.sandbox != nil {
		// The simulator's read-outs (GET /sim/...), on the admin listener's
		// fixed address, so a newcomer can see where events went. Its fault
		// and test knobs (POST /sim/...) are not mounted in the product:
		// they are `relay sim`'s and the tests'.
		admin.Register(adminroute.Route{Method: http.MethodGet, Path: "/sim/", Mode: admintoken.ModeOwn, Handler: s.sandbox.ControlHandler()})
	}
	// ADMIN ROUTES: every route but /healthz, /readyz and /metrics is
	// registered with its admintoken.Mode (adminapi.Server.Register); a
	// forwarded API is a table in cmd/relay/forwarding.go.
	admin.Register(relayAPI.Routes()...)
	admin.Register(dl.routes...)
	bf, err := newBackfills(cfg.DataDir, s.bases["ingest-url"], dl.live, log.Named("backfill"))
	if err != nil {
		return nil, fmt.Errorf("backfills: %w", err)
	}
	s.lc.onStop("backfills", bf.stop)
	admin.Register(bf.routes()...)
	admin.Register(s.tp.Routes()...)
	fwdRoutes, fwd, err := forwardingRoutes(s.bases, s.creds, s.taxLim, log, s.reg)
	if err != nil {
		return nil, err
	}
	// A change of a project's taxonomy made through the relay is read at once.
	admin.Register(s.tp.Watch(fwdRoutes)...)
	admin.Register(tapRoute(s.taps, s.creds))
	admin.Register(s.reload.routes()...)
	adminTLS, err := s.loadTLS("admin", cfg.AdminTLSCert, cfg.AdminTLSKey, "admin-tls-cert", "admin-tls-key")
	if err != nil {
		return nil, err
	}
	adminLn, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		return nil, fmt.Errorf("admin listener: %w", err)
	}
	if adminTLS != nil {
		adminLn = tls.NewListener(adminLn, adminTLS.TLSConfig())
	}
	s.g.run("admin listener", func() error { return admin.Serve(adminLn) })
	s.lc.onStop("admin listener", func(ctx context.Context) error {
		relayAPI.Close() // a long replay or purge stops after its current step
		s.taps.Close()   // a tap streams until its end: end it now
		err := admin.Shutdown(ctx)
		fwd.Close()
		return err
	})
	log.Info("admin listening", zap.String("addr", adminLn.Addr().String()), zap.Bool("tls", adminTLS != nil))
	return admin, nil
}

// loadTLS loads a listener's certificate (nil when cert and key are unset:
// config.Validate refuses one without the other) and reloads it on every
// reload. Connections already open keep their certificate; new ones get
// the new pair; a pair that does not load keeps the old one, and the log
// says why. certName and keyName are the settings, named in the error with
// where they came from, as config's errors do.
func (s *server) loadTLS(listener, cert, key, certName, keyName string) (*tlsreload.Reloader, error) {
	if cert == "" && key == "" {
		return nil, nil
	}
	r, err := tlsreload.New(tlsreload.Config{CertFile: cert, KeyFile: key})
	if err != nil {
		return nil, fmt.Errorf("%s listener: %w (%s from %s; %s from %s)", listener, err,
			certName, s.cfg.Source(certName), keyName, s.cfg.Source(keyName))
	}
	logCert(s.log, listener, r, "tls certificate loaded")
	s.onHUP.add(func(config.Config) {
		if err := r.Reload(); err != nil {
			s.log.Error("tls certificate reload failed: keeping the previous certificate",
				zap.String("listener", listener), errField(err))
			return
		}
		logCert(s.log, listener, r, "tls certificate reloaded")
	})
	return r, nil
}

// logCert logs the certificate r serves on listener, as a warning once it
// has expired.
func logCert(log *zap.Logger, listener string, r *tlsreload.Reloader, msg string) {
	leaf := r.Leaf()
	fields := []zap.Field{zap.String("listener", listener), zap.String("subject", leaf.Subject.String()),
		zap.Strings("dns_names", leaf.DNSNames), zap.Time("not_after", leaf.NotAfter)}
	if time.Now().After(leaf.NotAfter) {
		log.Warn(msg+": the certificate has expired", fields...)
		return
	}
	log.Info(msg, fields...)
}

// startDelivery runs the deliveries: events, group identifies, user
// mappings. They share one stop (their drains run side by side within
// --drain-timeout).
func (s *server) startDelivery(dl *deliveries) {
	dctx, dcancel := context.WithCancel(context.Background())
	var dwg sync.WaitGroup
	for _, c := range dl.components {
		dwg.Add(1)
		s.g.run(c.name, func() error {
			defer dwg.Done()
			if err := c.Run(dctx); err != nil {
				return err
			}
			if dctx.Err() == nil {
				return errors.New("stopped by itself")
			}
			return nil
		})
	}
	ddone := make(chan struct{})
	go func() { dwg.Wait(); close(ddone) }()
	s.lc.onStop("delivery", func(ctx context.Context) error {
		dcancel()
		select {
		case <-ddone:
			return nil
		case <-ctx.Done():
			// The spool must not be closed under a running delivery: give up
			// the stop here; the process exits and the spool's last commit
			// stands (nothing acknowledged is lost).
			return fmt.Errorf("delivery did not stop in time: %w", ctx.Err())
		}
	})
}

// startIngest builds the ingest listener and starts it; admin is the admin
// listener, whose token a reload sets.
func (s *server) startIngest(admin *adminapi.Server) error {
	cfg, log := s.cfg, s.log
	icfg := cfg.Ingest(cfg.Creds)
	ingTLS, err := s.loadTLS("ingest", cfg.TLSCert, cfg.TLSKey, "tls-cert", "tls-key")
	if err != nil {
		return err
	}
	if ingTLS != nil {
		icfg.TLS = ingTLS.TLSConfig()
	}
	ing, err := ingest.New(icfg, tappedAppender{s.store, s.taps}, event.NewIDGen(), log.Named("ingest"), s.reg)
	if err != nil {
		return err
	}
	if s.fs == nil {
		// Events found clean against their plan as they are spooled are
		// not checked again at delivery; the fleet's messages do not
		// carry the verdict, so there every event is checked at delivery.
		ing.SetPlan(s.tp)
	}
	logOpen(log, cfg, cfg.Creds)
	// A reload: the token and credentials files, once everything that
	// holds them is built (the admin listener, the credentials Ref), then
	// the ingest access settings (the allow-list may be the credentials').
	s.onHUP.add(func(c config.Config) {
		reloadFiles(c, log, admin.SetToken, func(n *credentials.Store) { s.creds.Swap(n) })
		reloadOpen(ing, c, s.creds.Load(), log)
		ing.SetMaxBatchBytes(int(c.MaxBatchBytes)) // events that could not fit alone in a request are refused
	})
	ingLn, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("ingest listener: %w", err)
	}
	s.listening.Store(true)
	s.g.run("ingest listener", func() error { return ing.Serve(ingLn) })
	s.lc.onStop("ingest listener", func(ctx context.Context) error {
		// In-flight requests wait only for spool commits; they get the
		// drain time-out, the rest of the budget is delivery's.
		ictx, cancel := context.WithTimeout(ctx, cfg.DrainTimeout)
		defer cancel()
		return ing.Shutdown(ictx)
	})
	log.Info("ingest listening", zap.String("addr", ingLn.Addr().String()), zap.Bool("tls", ingTLS != nil),
		zap.Int("max_connections", cfg.MaxConnections), zap.Int("max_connections_per_client", cfg.MaxConnectionsPerClient))
	return nil
}
