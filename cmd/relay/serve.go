package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
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
	"github.com/svcrelay/relay/internal/batcher"
	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/event"
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

// stopBudget is the longest a whole stop may take: the ingest listener's
// drain, delivery's drain, and a few seconds to close the spool.
func stopBudget(drain time.Duration) time.Duration { return 2*drain + 5*time.Second }

// component is a long-running part of delivery: internal/batcher's Pipeline,
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
	// events is the events pipeline, gi the group identifies' delivery
	// (for a reload's settings).
	events *batcher.Pipeline
	gi     *groupidentify.GroupIdentify
}

// newDeliveries builds the delivery side from cfg; creds is the credentials
// file in force.
func newDeliveries(cfg config.Config, bases upstreamBases, sp *spool.Spool, fs *fleetStore, local *spool.Backend, creds *credentials.Ref, tp *plan.Enforcer, taps *tap.Hub, log *zap.Logger, reg prometheus.Registerer) (*deliveries, error) {
	client, err := upstream.New(upstream.Config{}, log.Named("upstream"), reg)
	if err != nil {
		return nil, fmt.Errorf("upstream client: %w", err)
	}
	thr, err := throttle.New(throttle.Config{}, reg)
	if err != nil {
		return nil, fmt.Errorf("throttle: %w", err)
	}
	bcfg := batcher.Config{
		IngestURL:      cfg.IngestURL,
		MaxBatchEvents: cfg.MaxBatchEvents,
		MaxBatchBytes:  int(cfg.MaxBatchBytes),
		FlushInterval:  cfg.FlushInterval,
		ThrottlePause:  cfg.ThrottlePause,
		MaxEventAge:    cfg.MaxEventAge,
		Gzip:           cfg.UpstreamGzip,
		DrainTimeout:   cfg.DrainTimeout,
		Check:          tp.Check, // the tracking plan, checked as events are packed
		OnDead:         taps.PublishDead,
	}
	var p *batcher.Pipeline
	live := &liveMeter{next: tappedSender{client, taps}, windows: map[string]*rateWindow{}}
	if fs != nil { // the events partitions this relay owns
		p, err = batcher.NewFleet(bcfg, fs.b.Only(storage.KindEvents), fs.f, fs.f, live, thr, log.Named("delivery"), reg)
	} else {
		p, err = batcher.New(bcfg, local.Only(storage.KindEvents), live, thr, log.Named("delivery"), reg)
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
		events:     p,
	}

	gi, err := groupidentify.New(groupidentify.Config{
		URL:      cfg.IngestURL,
		Spooling: fs.spooling(cfg, storage.KindGroupIdentify, local),
	}, client, creds, log.Named("groupidentify"), reg)
	if err != nil {
		return nil, fmt.Errorf("group identify: %w", err)
	}
	d.gi = gi
	d.components = append(d.components, namedComponent{"groupidentify", gi})
	d.lanes[storage.KindGroupIdentify] = gi
	d.routes = append(d.routes, gi.Routes()...)

	if cfg.AliasURL == "" || cfg.AnalyticsURL == "" {
		// Without the alias and analytics bases there is nowhere to send
		// mappings: the routes say so, and mappings spooled by an earlier
		// run wait for a start with both flags.
		log.Warn("user mapping disabled: POST /usermap answers 503 until --alias-url and --analytics-url are set")
		off := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"code":503,"error":"user mapping is not configured on this relay (--alias-url and --analytics-url)"}`+"\n")
		})
		d.routes = append(d.routes,
			adminroute.Route{Method: http.MethodPost, Path: "/usermap", Mode: admintoken.ModeOwn, Handler: off})
		return d, nil
	}
	um, err := usermap.New(usermap.Config{
		AliasURL:     bases.alias,
		AnalyticsURL: bases.analytics,
		Spooling:     fs.spooling(cfg, storage.KindUserMap, local),
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

// serveWith runs the relay until ctx ends (SIGTERM/SIGINT) or a component fails,
// then stops everything in reverse order of start. resetSignals restores the
// default signal handling once the stop begins, so a second signal kills.
//
// Start order: simulator (sandbox mode only), spool, admin listener (with
// /relay/v1, /groupidentify, /usermap and the forwarding routes), delivery
// (events, group identifies, user mappings), ingest listener. Stop order is
// the reverse: stop accepting events, drain the deliveries within
// --drain-timeout, stop the admin listener (no more group identifies or
// mappings accepted), close the spool, stop the simulator.

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

func serveWith(ctx context.Context, resetSignals func(), cfg config.Config, log *zap.Logger, hooks serveHooks) (err error) {
	lc := &lifecycle{log: log}
	g := &goroutines{failed: make(chan error, 1)}
	var stopping atomic.Bool
	sd := newNotifier() // systemd's Type=notify (sdnotify.go)
	defer func() {
		stopping.Store(true)
		_ = sd.notify("STOPPING=1")
		// Ingest gets at most --drain-timeout, delivery drains within its own
		// --drain-timeout after that; the rest is for closing.
		sctx, cancel := context.WithTimeout(context.Background(), stopBudget(cfg.DrainTimeout))
		defer cancel()
		err = errors.Join(err, lc.stopAll(sctx))
		g.wg.Wait()
		if err == nil {
			log.Info("relay stopped")
		}
	}()

	// SIGHUP (sighup.go) and POST /relay/v1/reload (reload.go) read the
	// configuration again and run every reloader with it; SIGHUP no longer
	// kills, and its watch is stopped last. Each component that reloads
	// something (the TLS files, the token and credentials files, the
	// ingest access settings, the log level) adds its own with onHUP.add
	// once it is built.
	onHUP := &reloaders{}
	cfgReload := newConfigReloader(cfg, hooks.load, onHUP, log)
	if hooks.level != nil {
		onHUP.add(func(c config.Config) {
			if lvl, err := zap.ParseAtomicLevel(c.LogLevel); err == nil && lvl.Level() != hooks.level.Level() {
				hooks.level.SetLevel(lvl.Level())
				log.Info("reload: log level set", zap.String("log_level", c.LogLevel))
			}
		})
	}
	if hooks.format != nil {
		format := cfg.LogFormat
		onHUP.add(func(c config.Config) {
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
		_ = sd.notify("RELOADING=1")
		cfgReload.reload("SIGHUP")
		_ = sd.notify("READY=1")
	})
	lc.onStop("SIGHUP watch", func(context.Context) error { stopWatchHUP(); return nil })

	upstreamID := upstreamIdentity(cfg.IngestURL) // before sandbox mode fills it in
	var sandbox *sim.Sim
	if cfg.Sandbox() {
		sandbox = sim.New(sim.Config{}, log.Named("sim"))
		lc.onStop("sim", func(context.Context) error { return sandbox.Close() })
		url, err := sandbox.Start("127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("sandbox simulator: %w", err)
		}
		for _, p := range []*string{&cfg.IngestURL, &cfg.AliasURL, &cfg.AnalyticsURL, &cfg.ExperimentURL, &cfg.ScimURL, &cfg.FeedbackURL} {
			if *p == "" {
				*p = url
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

	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	if err := registerBuildInfo(reg); err != nil {
		return err
	}
	if err := cfgReload.register(reg); err != nil {
		return err
	}

	// Spool.
	sp, err := spool.Open(spool.Config{Dir: cfg.DataDir, NoSync: cfg.Sync == "none", MaxBytes: cfg.SpoolMaxBytes,
		MinFreeBytes: cfg.SpoolMinFreeBytes, MaxLanes: cfg.MaxLanes, MaxLanesPerKey: cfg.MaxLanesPerKey,
		RetireIdle: cfg.LaneRetireAfter}, log.Named("spool"), reg)
	if err != nil {
		return fmt.Errorf("open spool in %s: %w%s", cfg.DataDir, err, spoolHint(cfg.DataDir, err))
	}
	var spoolOpen atomic.Bool
	spoolOpen.Store(true)
	lc.onStop("spool", func(context.Context) error {
		spoolOpen.Store(false)
		return sp.Close()
	})
	// Open may have replayed tens of MB of the spool's write-ahead log:
	// give that memory back before serving, or a relay restarted on a
	// backlog keeps it as RSS until its first collection.
	debug.FreeOSMemory()
	// Fleet mode's store, stopped after delivery gave its
	// partitions up (stops run in reverse).
	var fs *fleetStore
	if cfg.SpoolNATS != nil {
		if fs, err = openFleet(cfg, log, reg); err != nil {
			return err
		}
		lc.onStop("fleet", fs.close)
		if hooks.fleetOpened != nil {
			hooks.fleetOpened(fs.nc)
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

	// TLS of both listeners, reloaded on SIGHUP.
	ingTLS, err := loadTLS(log, "ingest", cfg.TLSCert, cfg.TLSKey, tlsSources(cfg, "tls-cert", "tls-key"))
	if err != nil {
		return err
	}
	adminTLS, err := loadTLS(log, "admin", cfg.AdminTLSCert, cfg.AdminTLSKey, tlsSources(cfg, "admin-tls-cert", "admin-tls-key"))
	if err != nil {
		return err
	}
	var tlsPairs []*tlsPair
	for _, p := range []*tlsPair{ingTLS, adminTLS} {
		if p != nil {
			tlsPairs = append(tlsPairs, p)
		}
	}
	onHUP.add(func(config.Config) { reloadTLS(log, tlsPairs) })
	if err := guardSpoolUpstream(sp, upstreamID, cfg.SpoolUpstreamChange == "allow", log); err != nil {
		return err
	}
	cfgReload.setGuard(reloadUpstreamGuard(sp, log))
	// The lane limits in force (a reload changes them), for /readyz too.
	var maxLanes atomic.Int64
	maxLanes.Store(int64(cfg.MaxLanes))
	onHUP.add(func(c config.Config) {
		sp.SetLaneLimits(c.MaxLanes, c.MaxLanesPerKey, c.LaneRetireAfter)
		maxLanes.Store(int64(c.MaxLanes))
	})

	// Delivery is built before the admin listener so that /readyz can ask it
	// and the listener can serve its routes.
	// The credentials file in force: every reader loads it at each use, so
	// a reload can swap it (creds.Swap) without a restart.
	creds := credentials.NewRef(cfg.Creds)
	// The store behind the seam (internal/storage) for everything but the
	// events' hot path (ingest's append, the batcher's reading, which use
	// the spool directly locally): the local spool, or the fleet's.
	local := spool.NewBackend(sp, log.Named("spool"))
	// The upstream bases but the ingest URL, in force (a reload changes
	// them): the forwarded APIs, the user mappings and the tracking plan
	// read them at every use.
	bases := newUpstreamBases(cfg)
	onHUP.add(func(c config.Config) {
		if !c.Sandbox() { // sandbox mode's simulator URLs are kept (isLive)
			bases.store(c)
		}
	})
	// The tracking plan (internal/plan): its reads of the taxonomy API and
	// the forwarded taxonomy calls count on one limiter.
	taxLim, err := ratelimit.New(forward.TaxonomyLimit(forward.APIConfig{}), reg)
	if err != nil {
		return err
	}
	tp, err := plan.New(plan.Config{Default: cfg.TrackingPlan, Refresh: cfg.TrackingPlanRefresh, Dir: cfg.DataDir, AnalyticsURL: bases.analytics},
		creds, taxLim, &http.Client{Timeout: time.Minute}, log.Named("plan"), reg)
	if err != nil {
		return err
	}
	planCtx, stopPlan := context.WithCancel(context.Background())
	lc.onStop("tracking plan", func(context.Context) error { stopPlan(); return nil })
	g.run("tracking plan", func() error { return tp.Run(planCtx) })
	onHUP.add(func(c config.Config) { tp.SetLive(plan.Live{Default: c.TrackingPlan, Refresh: c.TrackingPlanRefresh}) })
	// Live taps (relay tap): offered what ingest accepts, what the
	// upstream takes and the dead letters (tap.go).
	taps, err := tap.New(tap.Config{}, reg)
	if err != nil {
		return err
	}
	dl, err := newDeliveries(cfg, bases, sp, fs, local, creds, tp, taps, log, reg)
	if err != nil {
		return err
	}

	onHUP.add(func(c config.Config) {
		dl.events.SetLive(batcher.Live{Gzip: c.UpstreamGzip, MaxEventAge: c.MaxEventAge,
			MaxBatchEvents: c.MaxBatchEvents, MaxBatchBytes: int(c.MaxBatchBytes), FlushInterval: c.FlushInterval,
			ThrottlePause: c.ThrottlePause, IngestURL: c.IngestURL})
		if !c.Sandbox() { // sandbox mode's simulator URL is kept (isLive)
			dl.gi.SetURL(c.IngestURL)
		}
	})

	// Give the heap's free pages back once the relay goes quiet after a burst.
	idleCtx, stopIdle := context.WithCancel(context.Background())
	lc.onStop("idle memory return", func(context.Context) error { stopIdle(); return nil })
	g.run("idle memory return", func() error {
		returnIdleMemory(idleCtx, idleCheckEvery, idleQuietBytes, idleMinAlloc, dl.release...)
		return nil
	})
	rcfg := adminapi.RelayConfig{Lanes: dl.lanes, Store: local}
	if fs != nil { // the fleet's dead letters
		rcfg.Store, rcfg.Fleet = fs.b, true
	}
	relayAPI, err := adminapi.NewRelay(rcfg, sp, log.Named("admin"), reg)
	if err != nil {
		return err
	}

	// Readiness (/readyz and relay_ready): not ready while stopping, while
	// ingest would refuse, or while a delivery is not running.
	ready := func() error {
		switch {
		case stopping.Load():
			return errShuttingDown
		case !spoolOpen.Load():
			return errors.New("spool closed")
		}
		if err := sp.Stats().Refusing; err != nil { // a full disk at start, failing checkpoints
			return err
		}
		if fs != nil {
			if err := fs.ready(); err != nil {
				return err
			}
		}
		if err := ingestRefusal(sp.Stats().LiveBytes, cfg.SpoolMaxBytes, cfg.DataDir, cfg.SpoolMinFreeBytes); err != nil {
			return err
		}
		for _, c := range dl.components {
			if err := c.Ready(); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
		// Ingest refuses new lanes (the contract's "lane limit").
		if m := int(maxLanes.Load()); m > 0 && sp.Stats().Lanes >= m {
			return fmt.Errorf("lane limit reached (--max-lanes %d): new api_keys are refused", m)
		}
		return nil
	}
	if err := registerOpsMetrics(reg, cfg.SpoolMaxBytes, cfg.SpoolMinFreeBytes, cfg.DataDir, ready); err != nil {
		return err
	}

	// Admin listener. The credentials and the token in force can be swapped
	// at run time (a reload): creds.Swap, and admin.SetToken.
	admin, err := adminapi.New(adminapi.Config{
		Gatherer:  reg,
		Token:     cfg.Token,
		ReadyInfo: func() string { return upstreamInfo(dl.client, time.Now()) + tp.ReadyInfo() },
		Ready:     ready,
	}, log.Named("admin"), reg)
	if err != nil {
		return err
	}
	if sandbox != nil {
		// The simulator's read-outs (GET /sim/...), on the admin listener's
		// fixed address, so a newcomer can see where events went. Its fault
		// and test knobs (POST /sim/...) are not mounted in the product:
		// they are `relay sim`'s and the tests'.
		admin.Register(adminroute.Route{Method: http.MethodGet, Path: "/sim/", Mode: admintoken.ModeOwn, Handler: sandbox.ControlHandler()})
	}
	// ADMIN ROUTES: every route but /healthz, /readyz and /metrics is
	// registered with its admintoken.Mode (adminapi.Server.Register); a
	// forwarded API is a table in cmd/relay/forwarding.go.
	admin.Register(relayAPI.Routes()...)
	admin.Register(dl.routes...)
	bf, err := newBackfills(cfg.DataDir, cfg.IngestURL, dl.live, log.Named("backfill"))
	if err != nil {
		return fmt.Errorf("backfills: %w", err)
	}
	lc.onStop("backfills", bf.stop)
	onHUP.add(func(c config.Config) {
		if !c.Sandbox() {
			bf.setIngestURL(c.IngestURL) // the backfills started after it
		}
	})
	admin.Register(bf.routes()...)
	admin.Register(tp.Routes()...)
	fwdRoutes, fwd, err := forwardingRoutes(bases, creds, taxLim, log, reg)
	if err != nil {
		return err
	}
	// A change of a project's taxonomy made through the relay is read at once.
	admin.Register(tp.Watch(fwdRoutes)...)
	admin.Register(tapRoute(taps, creds))
	admin.Register(cfgReload.routes()...)
	adminLn, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		return fmt.Errorf("admin listener: %w", err)
	}
	if adminTLS != nil {
		adminLn = tls.NewListener(adminLn, adminTLS.r.TLSConfig())
	}
	g.run("admin listener", func() error { return admin.Serve(adminLn) })
	lc.onStop("admin listener", func(ctx context.Context) error {
		relayAPI.Close() // a long replay or purge stops after its current step
		taps.Close()     // a tap streams until its end: end it now
		err := admin.Shutdown(ctx)
		fwd.Close()
		return err
	})
	log.Info("admin listening", zap.String("addr", adminLn.Addr().String()), zap.Bool("tls", adminTLS != nil))

	// Delivery: events, group identifies, user mappings. They share one stop
	// (their drains run side by side within --drain-timeout).
	dctx, dcancel := context.WithCancel(context.Background())
	var dwg sync.WaitGroup
	for _, c := range dl.components {
		dwg.Add(1)
		g.run(c.name, func() error {
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
	lc.onStop("delivery", func(ctx context.Context) error {
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

	// Ingest listener.
	icfg := ingest.Config{
		MaxRequestBytes: cfg.MaxRequestBytes,
		MaxBatchBytes:   int(cfg.MaxBatchBytes),
		TrustedProxies:  cfg.TrustedProxies,
		Open:            ingestOpen(cfg, cfg.Creds),
	}
	icfg.MaxConnections = cfg.MaxConnections
	if ingTLS != nil {
		icfg.TLS = ingTLS.r.TLSConfig()
	}
	// Loopback peers are processes of this host (an app
	// beside a sidecar relay, a local reverse proxy, a load test): the
	// per-client bound is against remote clients.
	icfg.MaxConnectionsPerClient = cfg.MaxConnectionsPerClient
	icfg.UnboundedPeers = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	var events storage.Appender = local
	if fs != nil { // events go to the fleet's streams
		events = fs.b
	}
	events = tappedAppender{events, taps}
	ing, err := ingest.New(icfg, events, event.NewIDGen(), log.Named("ingest"), reg)
	if err != nil {
		return err
	}
	logOpen(log, cfg)
	// A reload: the token and credentials files, once everything that
	// holds them is built (the admin listener, the credentials Ref), then
	// the ingest access settings (the allow-list may be the credentials').
	onHUP.add(func(c config.Config) {
		reloadFiles(c, log, reloadTargets{setToken: admin.SetToken, setCreds: func(n *credentials.Store) { creds.Swap(n) }})
		reloadOpen(ing, c, creds.Load(), log)
		ing.SetMaxBatchBytes(int(c.MaxBatchBytes)) // events that could not fit alone in a request are refused
	})
	ingLn, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("ingest listener: %w", err)
	}
	g.run("ingest listener", func() error { return ing.Serve(ingLn) })
	lc.onStop("ingest listener", func(ctx context.Context) error {
		// In-flight requests wait only for spool commits; they get the
		// drain time-out, the rest of the budget is delivery's.
		ictx, cancel := context.WithTimeout(ctx, cfg.DrainTimeout)
		defer cancel()
		return ing.Shutdown(ictx)
	})
	log.Info("ingest listening", zap.String("addr", ingLn.Addr().String()), zap.Bool("tls", ingTLS != nil),
		zap.Int("max_connections", cfg.MaxConnections), zap.Int("max_connections_per_client", cfg.MaxConnectionsPerClient))
	log.Info("relay serving")
	if err := sd.notify("READY=1\nSTATUS=serving"); err != nil {
		log.Warn("could not tell systemd the relay is ready", errField(err))
	}

	select {
	case <-ctx.Done():
		resetSignals()
		log.Info("signal received: stopping (a second signal kills)", zap.Duration("drain_timeout", cfg.DrainTimeout))
		return nil
	case err := <-g.failed:
		resetSignals()
		return err
	}
}
