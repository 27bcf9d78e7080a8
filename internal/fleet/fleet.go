package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/storage"
)

// Defaults.
const (
	DefaultPartitions      = 3
	DefaultReplicas        = 3
	DefaultDedupWindow     = 2 * time.Minute
	DefaultPublishTimeout  = 10 * time.Second
	DefaultMaxMessageBytes = 512 << 10
	DefaultLeaseTTL        = 6 * time.Second
	DefaultAckWait         = 30 * time.Second
	DefaultMaxAckPending   = 20000
	DefaultStreams         = 1
	DefaultLinger          = time.Millisecond
	DefaultMaxInflight     = 2
	DefaultRebalance       = time.Minute
)

// MaxPartitions bounds Config.Partitions: an atomic batch holds at most
// 1000 messages (the server's default), and a request may need one per
// partition plus its splits.
const MaxPartitions = 256

// Metadata names.
const (
	metaPartitions = "relay.partitions"
	metaStreams    = "relay.streams"
	metaFormat     = "relay.format"
	// formatLimits is the format of the streams this relay creates:
	// limits retention, read by consumers of one replica (see doc.go,
	// Streams). formatWorkQueue is that of the work-queue streams of
	// before, which this relay still reads and writes. A relay of before
	// refuses to start on a stream of any format but formatWorkQueue: it
	// would read a limits stream with consumers of the stream's replicas
	// and, older still, remove nothing.
	formatLimits    = "2"
	formatWorkQueue = "1"
)

// kinds are the lane kinds with a stream each.
var kinds = []storage.Kind{storage.KindEvents, storage.KindGroupIdentify, storage.KindUserMap}

// names are the streams', buckets' and subjects' names of a namespace
// (Config.Namespace) with s streams per kind: RELAY_EVENTS,
// RELAY_EVENTS_1 ... and relay.events.<p> for "RELAY". Partition p is in
// the kind's stream p mod s; the first stream keeps the name a fleet of one
// stream per kind had.
type names struct {
	ns string
	s  int
}

// stream is the name of the kind's stream g (0 to s-1).
func (n names) stream(k storage.Kind, g int) string {
	name := n.ns + "_" + strings.ToUpper(k.String())
	if g > 0 {
		name += "_" + strconv.Itoa(g)
	}
	return name
}

// streamOf is the name of the stream holding partition p of kind k.
func (n names) streamOf(k storage.Kind, p int) string { return n.stream(k, p%n.s) }

func (n names) subjectPrefix(k storage.Kind) string {
	return strings.ToLower(n.ns) + "." + k.String() + "."
}

func (n names) subject(k storage.Kind, p int) string { return n.subjectPrefix(k) + strconv.Itoa(p) }

func (n names) deadStream() string { return n.ns + "_DEAD" }

func (n names) deadSubject(k storage.Kind) string {
	return strings.ToLower(n.ns) + ".dead." + k.String()
}

func (n names) deadAll() string { return strings.ToLower(n.ns) + ".dead.>" }

func (n names) fleetBucket() string { return n.ns + "_FLEET" }

func (n names) pauseBucket() string { return n.ns + "_PAUSES" }

func (n names) laneBucket() string { return n.ns + "_LANES" }

// Config configures a Fleet. Zero values mean the defaults named.
type Config struct {
	// Namespace prefixes every stream and bucket name (NS_EVENTS,
	// NS_DEAD, NS_FLEET, NS_PAUSES; subjects ns.events.<p>), so that
	// fleets can share a cluster; upper-case letters and digits, empty
	// means "RELAY". All relays of a fleet use the same.
	Namespace string
	// Name identifies this relay among the fleet's members (KV keys, logs);
	// it must be unique in the fleet. Empty means the host name plus a
	// random suffix.
	Name string
	// Partitions is P, the number of partitions of each stream (1 to
	// MaxPartitions); zero means DefaultPartitions. It is fixed when a
	// stream is created: Open fails with ErrPartitions when an existing
	// stream has another.
	Partitions int
	// Streams is how many streams each lane kind's partitions are spread
	// over (partition p in stream p mod Streams): each stream is a Raft
	// group with a leader of its own, so more streams spread the writes
	// over more nodes. 1 to Partitions; zero means DefaultStreams, or
	// Partitions when fewer. Fixed when the streams are created, like
	// Partitions (ErrPartitions). With more than one, all or nothing holds
	// per stream, not per request (see doc.go), hence the default of one.
	//
	// When Partitions and Streams are both zero and the streams exist,
	// Open takes their layout: a relay started with defaults joins the
	// fleet it finds, whatever the defaults were when it was made.
	Streams int
	// Linger is how long a publish waits for other requests to the same
	// stream to share its atomic batch (group commit); zero means
	// DefaultLinger, negative none.
	Linger time.Duration
	// MaxInflight bounds the batches in flight at once per stream; zero
	// means DefaultMaxInflight.
	MaxInflight int
	// Rebalance is how often, after Open, the relay reads where its
	// streams' leaders are and moves some when one node leads more than
	// its share (a node that died or restarted leaves its leaderships to
	// the others, and nothing gives them back); zero means
	// DefaultRebalance, negative never. Only with more than one stream.
	Rebalance time.Duration
	// Replicas of every stream and bucket; zero means DefaultReplicas (3).
	Replicas int
	// MaxBytes bounds each lane kind's backlog, all its streams together:
	// Append returns ErrFull when the kind's stored bytes (as last read
	// from the cluster, at most a quarter second ago, plus this relay's
	// appends since) and the request's would pass it. Each stream also has
	// it as its own server-side bound (discard new). Zero means no bound
	// but the server's.
	MaxBytes int64
	// DedupWindow is how long a retried publish is absorbed; zero means
	// DefaultDedupWindow.
	DedupWindow time.Duration
	// PublishTimeout bounds Append's attempts and retries (a time-out, a
	// lost leader); zero means DefaultPublishTimeout.
	PublishTimeout time.Duration
	// MaxMessageBytes bounds an encoded message; larger groups are split.
	// Zero means DefaultMaxMessageBytes; it must stay under the server's
	// max_payload (Open checks).
	MaxMessageBytes int
	// LeaseTTL is how long a partition lease and a membership heartbeat
	// live without renewal: a dead relay's partitions move after about
	// LeaseTTL plus LeaseTTL/3. Zero means DefaultLeaseTTL; at least 1s.
	LeaseTTL time.Duration
	// LeaseMargin is how much earlier than LeaseTTL an owner that cannot
	// renew stops delivering; zero means LeaseTTL/4.
	LeaseMargin time.Duration
	// AckWait is the consumers' ack wait (the reader keeps handed-out
	// messages alive at a third of it); zero means DefaultAckWait.
	AckWait time.Duration
	// MaxAckPending bounds the unacknowledged messages of a partition
	// (paused keys' messages included): at it, the partition's reading
	// stops until some are acknowledged. Zero means DefaultMaxAckPending.
	MaxAckPending int
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		h, _ := os.Hostname()
		c.Name = sanitize(h) + "-" + strings.ToLower(nuid.Next()[16:])
	}
	if c.Namespace == "" {
		c.Namespace = "RELAY"
	}
	if c.Partitions == 0 {
		c.Partitions = DefaultPartitions
	}
	if c.Streams == 0 {
		c.Streams = min(DefaultStreams, c.Partitions)
	}
	if c.Linger == 0 {
		c.Linger = DefaultLinger
	}
	if c.MaxInflight == 0 {
		c.MaxInflight = DefaultMaxInflight
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultReplicas
	}
	if c.DedupWindow == 0 {
		c.DedupWindow = DefaultDedupWindow
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.LeaseMargin == 0 {
		c.LeaseMargin = c.LeaseTTL / 4
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = DefaultMaxAckPending
	}
	if c.Rebalance == 0 {
		c.Rebalance = DefaultRebalance
	}
	return c
}

// sanitize keeps what a KV key takes.
func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '-'
		}
	}
	if len(b) == 0 {
		return "relay"
	}
	return string(b)
}

func validNamespace(s string) bool {
	for _, c := range []byte(s) {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return s != "" && len(s) <= 32
}

// Validate reports a configuration error.
func (c Config) Validate() error {
	d := c.withDefaults()
	switch {
	case !validNamespace(d.Namespace):
		return fmt.Errorf("fleet: namespace %q: upper-case letters and digits only", c.Namespace)
	case sanitize(d.Name) != d.Name:
		return fmt.Errorf("fleet: name %q: letters, digits, - and _ only", c.Name)
	case d.Partitions < 1 || d.Partitions > MaxPartitions:
		return fmt.Errorf("fleet: partitions %d: want 1 to %d", c.Partitions, MaxPartitions)
	case d.Streams < 1 || d.Streams > d.Partitions:
		return fmt.Errorf("fleet: streams %d: want 1 to the partitions (%d)", c.Streams, d.Partitions)
	case d.MaxInflight < 1:
		return errors.New("fleet: max in-flight batches must be positive")
	case d.Replicas != 1 && d.Replicas != 3 && d.Replicas != 5:
		return fmt.Errorf("fleet: replicas %d: want 1, 3 or 5", c.Replicas)
	case d.MaxBytes < 0:
		return errors.New("fleet: max bytes must not be negative")
	case d.DedupWindow < time.Second, d.PublishTimeout < 100*time.Millisecond, d.AckWait < time.Second:
		return errors.New("fleet: dedup window and ack wait must be at least 1s, publish timeout 100ms")
	case d.MaxMessageBytes < 1024:
		return fmt.Errorf("fleet: max message bytes %d: want at least 1024", c.MaxMessageBytes)
	case d.LeaseTTL < time.Second:
		return fmt.Errorf("fleet: lease TTL %v: want at least 1s", c.LeaseTTL)
	case d.LeaseMargin <= 0 || d.LeaseMargin >= d.LeaseTTL/2:
		return fmt.Errorf("fleet: lease margin %v: want more than 0 and less than half the lease TTL", c.LeaseMargin)
	case d.MaxAckPending < 1:
		return errors.New("fleet: max ack pending must be positive")
	}
	return nil
}

// Fleet is one relay's handle on the shared spool. All methods are safe for
// concurrent use.
type Fleet struct {
	cfg   Config
	n     names
	nc    *nats.Conn
	js    jetstream.JetStream
	log   *zap.Logger
	kv    jetstream.KeyValue // RELAY_FLEET
	dead  jetstream.Stream
	pause *pauses
	m     *metrics

	lanes  *laneStops
	commit map[storage.Kind][]*committer // by kind, then stream
	// limits, by stream name: the stream has limits retention (it was
	// created by a relay of this version); otherwise it is a work-queue
	// stream of before. Set by Open, read-only after.
	limits map[string]bool
	usage  map[storage.Kind]*usage // for MaxBytes
	// compress, by kind: the codec version (codec.go) the committers
	// write, the best every member of the kind reads (owner.go, codecOf);
	// zero until the first heartbeat: plain.
	compress [storage.KindUserMap + 1]atomic.Uint32

	// recent keeps what the committers compressed into the messages of
	// the partitions this relay reads (readers counts the Partitions
	// open, by slot), for their Next (recent.go).
	recent    recent
	readersMu sync.Mutex
	readers   map[slot]int

	// The rebalancing goroutine (see startRebalance): its stop, and done
	// closed when it returned; nil when there is none.
	rebalanceStop context.CancelFunc
	rebalanceDone chan struct{}
}

// Open creates or checks the streams and buckets on the cluster nc is
// connected to and starts watching pauses. nc stays the caller's (Close does
// not close it). log and reg may be nil.
func Open(ctx context.Context, nc *nats.Conn, cfg Config, log *zap.Logger, reg prometheus.Registerer) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	given := cfg
	cfg = cfg.withDefaults()
	if log == nil {
		log = zap.NewNop()
	}
	if mp := nc.MaxPayload(); mp > 0 && int64(cfg.MaxMessageBytes) > mp {
		return nil, fmt.Errorf("fleet: max message bytes %d above the server's max_payload %d", cfg.MaxMessageBytes, mp)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	if p, g, ok := existingLayout(ctx, js, given, log); ok {
		cfg.Partitions, cfg.Streams = p, g
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	f := &Fleet{cfg: cfg, n: names{cfg.Namespace, cfg.Streams}, nc: nc, js: js, m: m, log: log.With(zap.String("relay", cfg.Name)), limits: make(map[string]bool)}
	for _, k := range kinds {
		for g := range cfg.Streams {
			limits, err := retrySetup(ctx, f.log, func(ctx context.Context) (bool, error) {
				return f.ensureStream(ctx, k, g)
			})
			if err != nil {
				return nil, err
			}
			f.limits[f.n.stream(k, g)] = limits
		}
	}
	deadCfg := jetstream.StreamConfig{
		Name:       f.n.deadStream(),
		Subjects:   []string{f.n.deadAll()},
		Retention:  jetstream.LimitsPolicy,
		Storage:    jetstream.FileStorage,
		Replicas:   cfg.Replicas,
		Duplicates: cfg.DedupWindow,
		Discard:    jetstream.DiscardOld,
	}
	f.dead, err = retrySetup(ctx, f.log, func(ctx context.Context) (jetstream.Stream, error) {
		if _, err := js.Stream(ctx, deadCfg.Name); errors.Is(err, jetstream.ErrStreamNotFound) {
			return js.CreateStream(ctx, deadCfg)
		}
		return js.UpdateStream(ctx, deadCfg)
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: dead-letter stream: %w", unavailable(err))
	}
	fleetKV := jetstream.KeyValueConfig{
		Bucket:   f.n.fleetBucket(),
		History:  1,
		TTL:      cfg.LeaseTTL,
		Storage:  jetstream.FileStorage,
		Replicas: cfg.Replicas,
	}
	f.kv, err = retrySetup(ctx, f.log, func(ctx context.Context) (jetstream.KeyValue, error) {
		if _, err := js.KeyValue(ctx, fleetKV.Bucket); errors.Is(err, jetstream.ErrBucketNotFound) {
			return js.CreateKeyValue(ctx, fleetKV)
		}
		return js.UpdateKeyValue(ctx, fleetKV)
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: membership bucket: %w", unavailable(err))
	}
	pauseKV := jetstream.KeyValueConfig{
		Bucket:         f.n.pauseBucket(),
		History:        1,
		Storage:        jetstream.FileStorage,
		Replicas:       cfg.Replicas,
		LimitMarkerTTL: time.Minute,
	}
	pkv, err := retrySetup(ctx, f.log, func(ctx context.Context) (jetstream.KeyValue, error) {
		if _, err := js.KeyValue(ctx, pauseKV.Bucket); errors.Is(err, jetstream.ErrBucketNotFound) {
			return js.CreateKeyValue(ctx, pauseKV)
		}
		return js.UpdateKeyValue(ctx, pauseKV)
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: pause bucket: %w", unavailable(err))
	}
	if f.pause, err = startPauses(ctx, js, pkv, "$KV."+f.n.pauseBucket()+".", f.log); err != nil {
		return nil, err
	}
	if err := f.startLaneStops(ctx); err != nil {
		f.pause.stop()
		return nil, err
	}
	f.balance(ctx)
	if cfg.Rebalance > 0 {
		f.startRebalance(cfg.Rebalance)
	}
	f.commit = make(map[storage.Kind][]*committer, len(kinds))
	f.usage = make(map[storage.Kind]*usage, len(kinds))
	for _, k := range kinds {
		f.usage[k] = &usage{}
		for g := range cfg.Streams {
			f.commit[k] = append(f.commit[k], f.startCommitter(f.n.stream(k, g)))
		}
	}
	return f, nil
}

// setupAttempt bounds one create-or-update of Open. Two relays creating the
// same stream or bucket at once on a fresh cluster (a Deployment's first
// rollout) left the client's CreateOrUpdate (an update, then a create)
// unanswered on both: they waited out Open's whole context on the
// dead-letter stream. Open now looks the stream or bucket up first and
// creates it only when missing (as ensureStream does), and each attempt is
// bounded and retried (the next one finds what the other relay created).
// The first attempt gets setupAttempt, each retry twice the last, up to
// 4×setupAttempt.
const setupAttempt = 2 * time.Second

// retrySetup calls create with a bounded context (see setupAttempt) until it
// succeeds, fails otherwise than by a time-out or a name taken meanwhile, or
// ctx ends.
func retrySetup[T any](ctx context.Context, log *zap.Logger, create func(context.Context) (T, error)) (T, error) {
	for attempt := setupAttempt; ; attempt = min(2*attempt, 4*setupAttempt) {
		actx, cancel := context.WithTimeout(ctx, attempt)
		v, err := create(actx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return v, err
		}
		var apiErr *jetstream.APIError
		taken := errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) || errors.Is(err, jetstream.ErrBucketExists) ||
			(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamNameInUse)
		// "No suitable peers for placement, peer offline": a node of a
		// loaded cluster missed its heartbeats to the meta leader for a
		// moment (seen at the first relay's start on a fresh cluster).
		noPeers := errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeClusterNoPeers
		if !taken && !noPeers && !errors.Is(err, context.DeadlineExceeded) && !retryable(err) {
			return v, err
		}
		log.Info("creating the fleet's streams: retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// existingLayout reads the partitions and streams of the events kind's first
// stream when the configuration left both to their defaults (zero) and that
// stream exists; ok is false otherwise (Open then creates or checks the
// streams as configured). Its request is bounded and retried like a
// create's: one arriving while the stream's leadership moves is answered
// by no server.
func existingLayout(ctx context.Context, js jetstream.JetStream, cfg Config, log *zap.Logger) (partitions, streams int, ok bool) {
	if cfg.Partitions != 0 || cfg.Streams != 0 {
		return 0, 0, false
	}
	name := names{cfg.withDefaults().Namespace, 1}.stream(storage.KindEvents, 0)
	s, err := retrySetup(ctx, log, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, name) })
	if err != nil {
		return 0, 0, false
	}
	md := s.CachedInfo().Config.Metadata
	p, err := strconv.Atoi(md[metaPartitions])
	if err != nil || p < 1 || p > MaxPartitions {
		return 0, 0, false
	}
	g := 1 // made before streams were counted
	if v := md[metaStreams]; v != "" {
		if g, err = strconv.Atoi(v); err != nil || g < 1 || g > p {
			return 0, 0, false
		}
	}
	return p, g, true
}

// ensureStream creates the lane kind's stream g (limits retention) or
// checks that the existing one has this configuration's partitions and
// streams and a format this relay reads; limits says which retention it
// has (a work-queue stream of before stays one: the server does not change
// a stream's retention to or from work queue).
func (f *Fleet) ensureStream(ctx context.Context, k storage.Kind, g int) (limits bool, err error) {
	name := f.n.stream(k, g)
	want, wantStreams := strconv.Itoa(f.cfg.Partitions), strconv.Itoa(f.cfg.Streams)
	s, err := f.js.Stream(ctx, name)
	switch {
	case err == nil:
		info := s.CachedInfo()
		if got := info.Config.Metadata[metaPartitions]; got != want {
			return false, fmt.Errorf("fleet: stream %s has %q partitions, this relay is configured for %s: %w", name, got, want, ErrPartitions)
		}
		got := info.Config.Metadata[metaStreams]
		if got == "" {
			got = "1" // made before streams were counted
		}
		if got != wantStreams {
			return false, fmt.Errorf("fleet: stream %s is one of %s streams per kind, this relay is configured for %s: %w", name, got, wantStreams, ErrPartitions)
		}
		format, retention := info.Config.Metadata[metaFormat], info.Config.Retention
		switch {
		case format == formatLimits && retention == jetstream.LimitsPolicy:
			return true, nil
		case format == formatWorkQueue && retention == jetstream.WorkQueuePolicy:
			return false, nil
		}
		return false, fmt.Errorf("fleet: stream %s has format %q and %v retention, this relay reads format %s (limits) or %s (work queue): %w",
			name, format, retention, formatLimits, formatWorkQueue, ErrPartitions)
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return false, fmt.Errorf("fleet: stream %s: %w", name, unavailable(err))
	}
	maxBytes := f.cfg.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	var subjects []string
	for p := g; p < f.cfg.Partitions; p += f.cfg.Streams {
		subjects = append(subjects, f.n.subject(k, p))
	}
	_, err = f.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     name,
		Subjects: subjects,
		// Limits retention with no limit but MaxBytes: a message stays
		// until its partition's owner removes it (remove.go), so the
		// stream holds exactly the backlog, as a work queue would, and the
		// consumers need no replicated state (see doc.go, Streams).
		Retention:          jetstream.LimitsPolicy,
		Storage:            jetstream.FileStorage,
		Replicas:           f.cfg.Replicas,
		MaxBytes:           maxBytes,
		Discard:            jetstream.DiscardNew,
		Duplicates:         f.cfg.DedupWindow,
		MaxMsgSize:         int32(f.cfg.MaxMessageBytes) + 1024,
		AllowAtomicPublish: true,
		Metadata:           map[string]string{metaPartitions: want, metaStreams: wantStreams, metaFormat: formatLimits},
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return f.ensureStream(ctx, k, g) // another relay created it meanwhile
	}
	if err != nil {
		return false, fmt.Errorf("fleet: create stream %s: %w", name, unavailable(err))
	}
	return true, nil
}

// Close stops the publishers (an Append after it fails with
// ErrUnavailable; batches in flight finish first) and the pause watcher.
// It does not close the connection.
func (f *Fleet) Close() error {
	if f.rebalanceDone != nil {
		f.rebalanceStop()
		<-f.rebalanceDone
	}
	for _, cs := range f.commit {
		for _, c := range cs {
			c.stop()
		}
	}
	f.lanes.stop()
	f.pause.stop()
	return nil
}

// Name is this relay's member name.
func (f *Fleet) Name() string { return f.cfg.Name }

// Partitions is P.
func (f *Fleet) Partitions() int { return f.cfg.Partitions }

// Streams is how many streams each lane kind's partitions are spread over.
func (f *Fleet) Streams() int { return f.cfg.Streams }
