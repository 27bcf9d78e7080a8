package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/ingest"
	"github.com/svcrelay/relay/internal/plan"
	"github.com/svcrelay/relay/internal/spool"
	"go.yaml.in/yaml/v3"
)

// ErrHelp is returned by Load when the arguments ask for help (-h, --help).
var ErrHelp = flag.ErrHelp

// Config is the relay's validated configuration. Zero values are never
// seen by callers: Load fills every field from a flag, a variable, the file
// or the default.
type Config struct {
	Listen      string // --listen
	AdminListen string // --admin-listen
	DataDir     string // --data-dir

	// Upstream bases; IngestURL "" means sandbox mode (see Sandbox).
	IngestURL, AliasURL, AnalyticsURL, ExperimentURL, ScimURL, FeedbackURL string

	ThrottlePause  time.Duration // --throttle-pause
	MaxBatchEvents int           // --max-batch-events, 1..delivery.MaxMaxBatchEvents
	MaxBatchBytes  int64         // --max-batch-bytes, > 0
	FlushInterval  time.Duration // --flush-interval, > 0
	UpstreamGzip   bool          // --upstream-gzip
	MaxEventAge    time.Duration // --max-event-age, > 0

	SpoolMaxBytes     int64  // --spool-max-bytes; 0 means no quota
	SpoolMinFreeBytes int64  // --spool-min-free-bytes; 0 disables the reserve
	Sync              string // --sync: "always" or "none"

	MaxRequestBytes int64          // --max-request-bytes, > 0
	TrustedProxies  []netip.Prefix // --trusted-proxies; nil trusts no proxy
	DrainTimeout    time.Duration  // --drain-timeout, > 0

	// AdminToken is --admin-token as given (never log it); Load turns it,
	// or the file of AdminTokenFile, into Token and then clears it.
	AdminToken     string
	AdminTokenFile string // --admin-token-file as given
	// Token is the admin token from --admin-token or --admin-token-file
	// (admintoken.Load); nil means no admin token: admin routes are open.
	Token *admintoken.Token
	// AdminInsecureOpen is --admin-insecure-open: serve a non-loopback
	// AdminListen without an admin token (false: such a start is refused).
	AdminInsecureOpen bool
	// Credentials is --credentials, the path of the credentials YAML; Creds
	// is that file loaded (credentials.Load), nil when none is given.
	Credentials string
	Creds       *credentials.Store

	ConfigFile string // --config: the YAML file read, "" when none
	LogLevel   string // --log-level: debug, info, warn or error
	LogFormat  string // --log-format: json, console, or "" (auto: console on a terminal)

	// Warnings are non-fatal findings (e.g. an unknown RELAY_* variable) for
	// the caller to log.
	Warnings []string

	// The ingest listener: connections and TLS.
	MaxConnections int // --max-connections, > 0
	// TLSCert and TLSKey are --tls-cert and --tls-key (both or neither):
	// the ingest listener serves TLS with them. AdminTLSCert and
	// AdminTLSKey are the same for the admin listener. SIGHUP reloads them.
	TLSCert, TLSKey           string
	AdminTLSCert, AdminTLSKey string
	// Browsers and the open internet.
	CORSOrigins []string // --cors-origins, normalized (ingest.NormalizeOrigin), or ["*"]; nil: none
	// AllowedAPIKeys is --allowed-api-keys; nil: every api_key. When
	// AllowedKeysFromCredentials (--allowed-api-keys=credentials) it is nil
	// and the keys are the credentials file's projects' (see
	// IngestAllowedAPIKeys).
	AllowedAPIKeys             []string
	AllowedKeysFromCredentials bool
	ClientRateLimit            float64 // --client-rate-limit, requests/s per client address; 0: off
	AnonymizeIP                bool    // --anonymize-ip

	// The tracking plan (internal/plan).
	TrackingPlan        plan.Mode     // --tracking-plan; a project's tracking_plan overrides it
	TrackingPlanRefresh time.Duration // --tracking-plan-refresh, > 0

	// Where each setting came from, for `relay config check`.
	// Settings lists every option of the table in its order, with the value
	// as given (secrets masked) and its Origin.
	Settings []Setting

	// Fleet mode.
	// SpoolNATS is --spool's NATS servers ("nats://host:port" or
	// "tls://host:port" each, user info kept: never log them); nil means
	// --spool local, the WAL + bbolt spool in DataDir.
	SpoolNATS []string
	// NATSCreds, NATSTLSCA, NATSTLSCert and NATSTLSKey are files: a NATS
	// credentials (JWT + nkey seed) file, the CA bundle that verifies the
	// servers, and a client certificate and key; "" means none. Only
	// with SpoolNATS.
	NATSCreds, NATSTLSCA, NATSTLSCert, NATSTLSKey string
	// SpoolPartitions is --spool-partitions, P of the fleet's streams
	// (1..256, fixed once the streams exist).
	SpoolPartitions int
	// SpoolStreams is --spool-streams, how many streams each lane kind's
	// partitions are spread over (0..SpoolPartitions, fixed once the
	// streams exist); 0 means the fleet's default (1).
	SpoolStreams int
	// Connections per client address.
	MaxConnectionsPerClient int // --max-connections-per-client, >= 0; 0: no bound

	// The sandbox guard.
	// SpoolUpstreamChange is --spool-upstream-change: "refuse" (a start
	// whose upstream differs from the one the spool's waiting records were
	// accepted for, sandbox included, fails) or "allow".
	SpoolUpstreamChange string

	// Bounded lanes.
	MaxLanes        int           // --max-lanes; 0 means no bound
	LaneRetireAfter time.Duration // --lane-retire-after; 0 never retires
	MaxLanesPerKey  int           // --max-lanes-per-key; 0 means no bound
}

// Sandbox reports whether the relay runs against its built-in simulated
// upstream (no --ingest-url).
func (c Config) Sandbox() bool { return c.IngestURL == "" }

// UpstreamURL is one upstream base setting: its flag name and the field.
type UpstreamURL struct {
	Name string // "ingest-url", "alias-url", ...
	URL  *string
}

// UpstreamURLs are c's upstream bases, ingest-url first, in the order of
// the flags.
func (c *Config) UpstreamURLs() []UpstreamURL {
	return []UpstreamURL{{"ingest-url", &c.IngestURL}, {"alias-url", &c.AliasURL}, {"analytics-url", &c.AnalyticsURL},
		{"experiment-url", &c.ExperimentURL}, {"scim-url", &c.ScimURL}, {"feedback-url", &c.FeedbackURL}}
}

// option is one setting: its flag name, default, and where its value goes:
// v, a field of the Config being loaded (*string, *time.Duration, *int64
// for a size, *int, *bool), or set for a setting parsed its own way (v is
// then the field set fills, for Reloaded).
type option struct {
	name   string
	def    string
	usage  string
	secret bool // masked by `relay config check`
	list   bool // a YAML file may give it as a list (joined with commas)
	v      any
	set    func(c *Config, v string) error
	// live says whether a reload from cur to next puts the setting in
	// force; nil: never, it needs a restart (see Reloaded).
	live func(cur, next *Config) bool
}

func (o option) isBool() bool { _, ok := o.v.(*bool); return ok }

// apply puts the value v of o in c.
func (o option) apply(c *Config, v string) error {
	if o.set != nil {
		return o.set(c, v)
	}
	var err error
	switch p := o.v.(type) {
	case *string:
		*p = v
	case *time.Duration:
		*p, err = ParseDuration(v)
	case *int64:
		*p, err = ParseSize(v)
	case *bool:
		if *p, err = strconv.ParseBool(strings.TrimSpace(v)); err != nil {
			err = fmt.Errorf("invalid boolean %q: want true or false", v)
		}
	case *int: // its bounds are Validate's
		if *p, err = strconv.Atoi(strings.TrimSpace(v)); err != nil {
			err = fmt.Errorf("invalid number %q", v)
		}
	default: // a table entry without a field or a setter of its own
		panic("config: option " + o.name + " cannot be set")
	}
	return err
}

// options is the table of every setting, in the order of the contract, its
// fields c's.
func options(c *Config) []option {
	return []option{
		{name: "listen", def: "127.0.0.1:8080", usage: "ingest listener address (apps and SDKs send events here)", v: &c.Listen},
		{name: "admin-listen", def: "127.0.0.1:8081", usage: "admin listener address: health, metrics, pprof, dead letters, forwarding", v: &c.AdminListen},
		{name: "data-dir", def: "./relay-data", usage: "directory of the bbolt spool; created if missing", v: &c.DataDir},
		{name: "ingest-url", usage: "upstream base for /2/httpapi and /groupidentify; empty: sandbox mode (built-in simulator)", v: &c.IngestURL, live: sameSandbox},
		{name: "alias-url", usage: "upstream base of the alias (user mapping) API", v: &c.AliasURL,
			live: func(cur, next *Config) bool {
				return outsideSandbox(cur, next) && (cur.AliasURL == "") == (next.AliasURL == "")
			}},
		{name: "analytics-url", usage: "upstream base of the analytics/export APIs", v: &c.AnalyticsURL,
			live: func(cur, next *Config) bool {
				return outsideSandbox(cur, next) && (cur.AnalyticsURL == "") == (next.AnalyticsURL == "")
			}},
		{name: "experiment-url", usage: "upstream base of the experiment APIs", v: &c.ExperimentURL, live: outsideSandbox},
		{name: "scim-url", usage: "upstream base of the SCIM API", v: &c.ScimURL, live: outsideSandbox},
		{name: "feedback-url", usage: "upstream base of the feedback API", v: &c.FeedbackURL, live: outsideSandbox},
		{name: "throttle-pause", def: delivery.DefaultThrottlePause.String(), usage: "how long a device or user named in a 429 gets nothing sent", v: &c.ThrottlePause, live: always},
		{name: "max-batch-events", def: strconv.Itoa(delivery.DefaultMaxBatchEvents), usage: "events per upstream request, at most (1.." + strconv.Itoa(delivery.MaxMaxBatchEvents) + ")", v: &c.MaxBatchEvents, live: always},
		{name: "max-batch-bytes", def: strconv.Itoa(delivery.DefaultMaxBatchBytes), usage: "upstream request body size, strictly less than this", v: &c.MaxBatchBytes, live: always},
		{name: "flush-interval", def: delivery.DefaultFlushInterval.String(), usage: "longest an accepted event waits for its batch to fill", v: &c.FlushInterval, live: always},
		{name: "spool-max-bytes", def: "8GiB", usage: "spool quota; above it ingest answers 503 with Retry-After (0: no quota)", v: &c.SpoolMaxBytes},
		{name: "spool-min-free-bytes", def: fmt.Sprintf("%dMiB", spool.DefaultMinFreeBytes>>20), usage: "free disk space kept in reserve on the data dir's filesystem; below it ingest answers 503 (0: no reserve)", v: &c.SpoolMinFreeBytes},
		{name: "sync", def: "always", usage: "always: answer 200 after fsync; none: after the write reaches the OS", v: &c.Sync},
		{name: "max-request-bytes", def: "20MB", usage: "largest ingest request body, after decompression (above: 413)", v: &c.MaxRequestBytes},
		{name: "max-event-age", def: "6d", usage: "an event undelivered this long after acceptance goes to dead letters", v: &c.MaxEventAge, live: always},
		{name: "upstream-gzip", def: "false", usage: "send upstream bodies gzip-compressed", v: &c.UpstreamGzip, live: always},
		{name: "admin-token", secret: true, usage: "token required on admin routes but /healthz, /readyz and /metrics (prefer --admin-token-file)", v: &c.AdminToken},
		{name: "admin-token-file", usage: "file holding the admin token", v: &c.AdminTokenFile, live: always},
		{name: "admin-insecure-open", def: "false", usage: "serve an admin-listen that is not loopback without an admin token (otherwise that start is refused)", v: &c.AdminInsecureOpen},
		{name: "credentials", usage: "YAML file of upstream credentials; needs an admin token", v: &c.Credentials, live: always},
		{name: "trusted-proxies", list: true, usage: "comma-separated CIDRs whose X-Forwarded-For is trusted",
			v: &c.TrustedProxies, set: parsed(&c.TrustedProxies, parsePrefixes)},
		{name: "drain-timeout", def: "10s", usage: "on SIGTERM/SIGINT, longest wait for in-flight requests and deliveries", v: &c.DrainTimeout},
		{name: "log-level", def: "info", usage: "debug, info, warn or error", v: &c.LogLevel, live: always},
		{name: "log-format", usage: "json or console; empty: console on a terminal, json otherwise", v: &c.LogFormat, live: always},
		{name: "config", usage: "YAML file of settings (keys are the flag names); flags and RELAY_* variables beat it", v: &c.ConfigFile},

		// The ingest listener: connections and TLS.
		{name: "max-connections", def: "16384", usage: "ingest connections held open at once; beyond it new ones wait in the accept queue", v: &c.MaxConnections},
		{name: "tls-cert", usage: "PEM certificate chain: the ingest listener serves HTTPS (with --tls-key); SIGHUP reloads it", v: &c.TLSCert},
		{name: "tls-key", usage: "PEM private key of --tls-cert", v: &c.TLSKey},
		{name: "admin-tls-cert", usage: "PEM certificate chain: the admin listener serves HTTPS (with --admin-tls-key); SIGHUP reloads it", v: &c.AdminTLSCert},
		{name: "admin-tls-key", usage: "PEM private key of --admin-tls-cert", v: &c.AdminTLSKey},
		// Browsers and the open internet.
		{name: "cors-origins", list: true, usage: "comma-separated origins (https://www.example.com) whose browser pages may POST to the ingest listener, or *; others are refused",
			v: &c.CORSOrigins, set: parsed(&c.CORSOrigins, parseOrigins), live: always},
		{name: "allowed-api-keys", secret: true, list: true, usage: "comma-separated api_keys the ingest takes (others: 403), or \"credentials\" for the credentials file's projects; empty: all",
			set: func(c *Config, v string) error {
				c.AllowedAPIKeys, c.AllowedKeysFromCredentials = nil, false
				if strings.TrimSpace(v) == "credentials" {
					c.AllowedKeysFromCredentials = true
					return nil
				}
				for f := range strings.SplitSeq(v, ",") {
					if f = strings.TrimSpace(f); f != "" {
						c.AllowedAPIKeys = append(c.AllowedAPIKeys, f)
					}
				}
				return nil
			}, live: always, v: &c.AllowedAPIKeys},
		{name: "client-rate-limit", def: "0", usage: "ingest requests per second per client address (burst 2x); above: 429 with Retry-After (0: off)",
			set: func(c *Config, v string) error {
				r, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				if err != nil || math.IsNaN(r) || math.IsInf(r, 0) || r < 0 || r > 1e9 {
					return fmt.Errorf("invalid rate %q: want requests per second, 0 (off) to 1e9", v)
				}
				c.ClientRateLimit = r
				return nil
			}, live: always, v: &c.ClientRateLimit},
		{name: "anonymize-ip", def: "false", usage: "drop the last octet of IPv4 / last 80 bits of IPv6 of every ip the relay fills in or forwards", v: &c.AnonymizeIP, live: always},
		{name: "tracking-plan", def: "off", usage: "off, observe, filter or block: how events are checked at delivery against the project's taxonomy (a project's tracking_plan in the credentials file overrides it)",
			v: &c.TrackingPlan, set: parsed(&c.TrackingPlan, plan.ParseMode), live: always},
		{name: "tracking-plan-refresh", def: plan.DefaultRefresh.String(), usage: "how often each project's tracking plan is read again from the taxonomy API", v: &c.TrackingPlanRefresh, live: always},
		// Fleet mode.
		{name: "spool", def: "local", secret: true, usage: "local: the WAL + bbolt spool in --data-dir; nats://host:port[,host:port...]: a NATS JetStream cluster shared by a fleet of relays",
			v: &c.SpoolNATS, set: parsed(&c.SpoolNATS, ParseSpool)},
		{name: "nats-creds", usage: "NATS credentials file (JWT and nkey seed) for --spool nats://", v: &c.NATSCreds},
		{name: "nats-tls-ca", usage: "CA bundle (PEM) that verifies the NATS servers' certificates", v: &c.NATSTLSCA},
		{name: "nats-tls-cert", usage: "client certificate (PEM) for NATS servers that verify clients; with --nats-tls-key", v: &c.NATSTLSCert},
		{name: "nats-tls-key", usage: "client certificate's key (PEM); with --nats-tls-cert", v: &c.NATSTLSKey},
		{name: "spool-partitions", def: "3", usage: "partitions of the fleet's streams (1..256), fixed once the streams exist: per-key order is kept within one", v: &c.SpoolPartitions},
		{name: "spool-streams", def: "0", usage: "streams each lane kind's partitions are spread over, each with a Raft leader of its own (0: 1; above 1, all or nothing per stream, not per request), fixed once the streams exist; with partitions and streams at 0 the layout found is taken", v: &c.SpoolStreams},
		// Connections per client address.
		{name: "max-connections-per-client", def: strconv.Itoa(ingest.DefaultMaxConnectionsPerClient), usage: "ingest connections one client address (IPv6: its /64) holds open at once; beyond it new ones are closed at accept; loopback and --trusted-proxies are not bounded (0: off)", v: &c.MaxConnectionsPerClient},
		// The sandbox guard.
		{name: "spool-upstream-change", def: "refuse", usage: "allow: deliver records waiting in the spool to another upstream than they were accepted for (refuse: fail to start)", v: &c.SpoolUpstreamChange, live: always},
		// Bounded lanes.
		{name: "max-lanes", def: "10000", usage: "lanes (kind + api_key + canonical options) held at once; a new one beyond it gets 503 + Retry-After (0: no bound)", v: &c.MaxLanes, live: always},
		{name: "lane-retire-after", def: "10m", usage: "an empty lane with nothing accepted for this long is retired (its goroutines, metric series and spool record removed; 0: never)", v: &c.LaneRetireAfter, live: always},
		{name: "max-lanes-per-key", def: "16", usage: "lanes of one api_key (its kinds and options variants) held at once; a new one beyond it gets 503 + Retry-After (0: no bound)", v: &c.MaxLanesPerKey, live: always},
	}
}

// Reload rules of the option table. ingest-url is live between two
// upstreams, not to or from sandbox mode, whose simulator runs from the
// start (cmd/relay's upstream guard refuses a change the spool's waiting
// records forbid). The other upstream URLs are live outside sandbox mode;
// alias-url and analytics-url not to or from "" (what they serve is served
// or not from the start).
func always(_, _ *Config) bool              { return true }
func sameSandbox(cur, next *Config) bool    { return cur.Sandbox() == next.Sandbox() }
func outsideSandbox(cur, next *Config) bool { return !cur.Sandbox() && !next.Sandbox() }

// Live reports whether a reload can put setting name in force (LiveFrom
// says between which values).
func Live(name string) bool {
	o, _ := lookupOption(name)
	return o.live != nil
}

// LiveFrom reports whether a reload from cur to next puts setting name in
// force.
func LiveFrom(cur, next Config, name string) bool {
	o, _ := lookupOption(name)
	return o.live != nil && o.live(&cur, &next)
}

// Reloaded is the configuration in force after a reload from cur to next:
// next, with every setting that needs a restart (LiveFrom) kept at cur's,
// its Settings entry included.
func Reloaded(cur, next Config) Config {
	eff := next
	eff.Settings = slices.Clone(next.Settings)
	was := options(&cur)
	for i, o := range options(&eff) {
		if o.live != nil && o.live(&cur, &next) {
			continue
		}
		reflect.ValueOf(o.v).Elem().Set(reflect.ValueOf(was[i].v).Elem())
		named := func(s Setting) bool { return s.Name == o.name }
		if j, k := slices.IndexFunc(eff.Settings, named), slices.IndexFunc(cur.Settings, named); j >= 0 && k >= 0 {
			eff.Settings[j] = cur.Settings[k]
		}
	}
	// A token file is read again, but a token given directly needs a
	// restart, and none can be added to a relay started without one.
	if cur.Token == nil || next.AdminTokenFile == "" {
		eff.AdminTokenFile, eff.Token = cur.AdminTokenFile, cur.Token
	}
	return eff
}

// parsed is the set of an option whose field is what parse makes of the
// value, trimmed.
func parsed[T any](field *T, parse func(string) (T, error)) func(*Config, string) error {
	return func(_ *Config, v string) (err error) {
		*field, err = parse(strings.TrimSpace(v))
		return err
	}
}

// parseOrigins parses --cors-origins: a comma-separated list of origins, or
// "*" alone.
func parseOrigins(v string) ([]string, error) {
	var out []string
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "":
			continue
		case f == "*":
			out = append(out, f)
			continue
		}
		n, err := ingest.NormalizeOrigin(f)
		if err != nil {
			return nil, fmt.Errorf("invalid origin %q: want scheme://host[:port], e.g. https://www.example.com", f)
		}
		out = append(out, n)
	}
	if len(out) > 1 && slices.Contains(out, "*") {
		return nil, errors.New(`"*" allows every origin: give it alone`)
	}
	return out, nil
}

// IngestAllowedAPIKeys returns the api_keys the ingest listener takes (nil:
// every one): --allowed-api-keys, or with --allowed-api-keys=credentials the
// api_keys of creds' projects (empty, not nil, when it has none). Callers
// pass the store they serve with, so that a reload gives the new list.
func (c Config) IngestAllowedAPIKeys(creds *credentials.Store) []string {
	if !c.AllowedKeysFromCredentials {
		return c.AllowedAPIKeys
	}
	keys := []string{}
	for _, p := range creds.Projects() {
		// Revealed into the ingest's allow-list only, compared there, never
		// printed.
		keys = append(keys, p.APIKey.Reveal())
	}
	return keys
}

// EnvName returns the environment variable of a flag: RELAY_ plus the flag
// name in upper snake case.
func EnvName(flagName string) string {
	return "RELAY_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Default is the default value of the setting name, as --help shows it.
func Default(name string) string {
	o, _ := lookupOption(name)
	return o.def
}

func lookupOption(name string) (option, bool) {
	for _, o := range options(new(Config)) {
		if o.name == name {
			return o, true
		}
	}
	return option{}, false
}

// rawValue is a flag's string value as given; set records that it was given.
type rawValue struct {
	v      string
	set    bool
	isBool bool
}

func (r *rawValue) String() string     { return r.v }
func (r *rawValue) Set(s string) error { r.v, r.set = s, true; return nil }
func (r *rawValue) IsBoolFlag() bool   { return r.isBool }

// Usage writes the flag table to w.
func Usage(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "flag\tdefault\tvariable\tmeaning")
	for _, o := range options(new(Config)) {
		fmt.Fprintf(tw, "--%s\t%s\t%s\t%s\n", o.name, o.def, EnvName(o.name), o.usage)
	}
	tw.Flush()
}

// Load builds the configuration from args (without the program name),
// environ (os.Environ's form, "KEY=value") and the YAML file they name, then
// validates it. The error names the setting and where its value came from.
// extra registers a command's own flags (flags only, no variable or file
// key), parsed with the settings.
func Load(args []string, environ []string, extra ...func(*flag.FlagSet)) (Config, error) {
	var c Config
	opts := options(&c)
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for _, f := range extra {
		f(fs)
	}
	raws := make(map[string]*rawValue, len(opts))
	for _, o := range opts {
		r := &rawValue{isBool: o.isBool()}
		raws[o.name] = r
		fs.Var(r, o.name, o.usage)
	}
	if err := fs.Parse(args); err != nil { // -h: flag.ErrHelp, which is ErrHelp
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q (settings are flags: --name value)", fs.Arg(0))
	}

	env := make(map[string]string)
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, "RELAY_") {
			continue
		}
		env[k] = v
	}
	for k := range env {
		if !slices.ContainsFunc(opts, func(o option) bool { return EnvName(o.name) == k }) {
			c.Warnings = append(c.Warnings, fmt.Sprintf("unknown environment variable %s ignored", k))
		}
	}
	slices.Sort(c.Warnings)

	// The file's name itself comes from the flag or the variable.
	cfgFile := ""
	if r := raws["config"]; r.set {
		cfgFile = r.v
	} else if v, ok := env[EnvName("config")]; ok {
		cfgFile = v
	}
	var file map[string]string
	var lines map[string]int // the line of each key, for sources
	if cfgFile != "" {
		var err error
		if file, lines, err = readFile(cfgFile); err != nil {
			return Config{}, err
		}
	}

	for _, o := range opts {
		v, org := o.def, Origin{Kind: "default"}
		if r := raws[o.name]; r.set {
			v, org = r.v, Origin{Kind: "flag"}
		} else if ev, ok := env[EnvName(o.name)]; ok {
			v, org = ev, Origin{Kind: "variable"}
		} else if fv, ok := file[o.name]; ok {
			v, org = fv, Origin{Kind: "file", File: cfgFile, Line: lines[o.name]}
		}
		shown := MaskURL(v)
		if o.secret && v != "" {
			shown = Masked
		}
		c.Settings = append(c.Settings, Setting{Name: o.name, Value: shown, Origin: org})
		if err := o.apply(&c, v); err != nil {
			return Config{}, fmt.Errorf("%s (from %s): %w", c.label(o.name), org.describe(o.name), err)
		}
	}
	if err := c.finish(); err != nil {
		return Config{}, c.withSources(err)
	}
	if raws["admin-token"].set {
		c.Warnings = append(c.Warnings, "--admin-token on the command line shows in every local user's process list: prefer --admin-token-file or RELAY_ADMIN_TOKEN")
	}
	return c, nil
}

// readFile reads the YAML settings file into flag name -> raw value, and
// the line of each key (for naming a value's source).
func readFile(path string) (map[string]string, map[string]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("config file: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, nil, fmt.Errorf("config file %s: %w", path, err)
	}
	out, lines := make(map[string]string), make(map[string]int)
	if doc.Kind == 0 { // empty file
		return out, lines, nil
	}
	m := &doc
	if m.Kind == yaml.DocumentNode && len(m.Content) == 1 {
		m = m.Content[0]
	}
	if m.Kind != yaml.MappingNode {
		return nil, nil, fmt.Errorf("config file %s: want a mapping of setting: value", path)
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		o, ok := lookupOption(k.Value)
		if !ok || k.Value == "config" {
			return nil, nil, fmt.Errorf("config file %s line %d: unknown key %q", path, k.Line, k.Value)
		}
		if _, dup := out[k.Value]; dup {
			return nil, nil, fmt.Errorf("config file %s line %d: key %q given twice", path, k.Line, k.Value)
		}
		lines[k.Value] = k.Line
		switch {
		case v.Kind == yaml.ScalarNode && v.Tag == "!!null":
			out[k.Value] = ""
		case v.Kind == yaml.ScalarNode:
			out[k.Value] = v.Value
		case v.Kind == yaml.SequenceNode && o.list:
			items := make([]string, 0, len(v.Content))
			for _, it := range v.Content {
				if it.Kind != yaml.ScalarNode {
					return nil, nil, fmt.Errorf("config file %s line %d: %s: want a list of strings", path, it.Line, k.Value)
				}
				items = append(items, it.Value)
			}
			out[k.Value] = strings.Join(items, ",")
		default:
			return nil, nil, fmt.Errorf("config file %s line %d: %s: want a single value", path, v.Line, k.Value)
		}
	}
	return out, lines, nil
}

func parsePrefixes(v string) ([]netip.Prefix, error) {
	var ps []netip.Prefix
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if a, err := netip.ParseAddr(f); err == nil { // one address
			f = netip.PrefixFrom(a, a.BitLen()).String()
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("invalid CIDR %q", f)
		}
		ps = append(ps, p.Masked())
	}
	return ps, nil
}

// finish validates c, then loads the admin token and the credentials file
// (the one place that refuses credentials without a token is Validate).
func (c *Config) finish() error {
	if err := c.Validate(); err != nil {
		return err
	}
	tok, err := admintoken.Load(c.AdminToken, c.AdminTokenFile)
	switch {
	case errors.Is(err, admintoken.ErrBoth):
		return &SettingError{Names: []string{"admin-token", "admin-token-file"}, Msg: "and admin-token-file are both set; use one"}
	case err != nil && c.AdminTokenFile != "":
		return settingErr("admin-token-file", "%s: %v", c.AdminTokenFile, err)
	case err != nil:
		return settingErr("admin-token", ": %v", err)
	}
	c.Token, c.AdminToken = tok, ""
	if tok == nil && c.AdminInsecureOpen && !LoopbackAddr(c.AdminListen) {
		c.warn("admin-insecure-open", "is set: admin-listen %s serves every admin route (dead letters, lanes, forwarded APIs) with no token to anyone who reaches it", c.AdminListen)
	}
	if tok.ReadableByOthers() {
		c.warn("admin-token-file", "%s is readable by group or others: chmod 600 it", c.AdminTokenFile)
	}
	if c.Credentials != "" {
		if c.Creds, err = credentials.Load(c.Credentials); err != nil {
			return settingErr("credentials", ": %v", err)
		}
		if c.Creds.ReadableByOthers() {
			c.warn("credentials", "%s is readable by group or others: chmod 600 it", c.Credentials)
		}
	}
	switch {
	case c.AllowedKeysFromCredentials && c.Creds == nil:
		return settingErr("allowed-api-keys", `"credentials" needs the credentials setting: the file whose projects' api_keys are taken`)
	case c.AllowedKeysFromCredentials && len(c.Creds.Projects()) == 0:
		c.warn("allowed-api-keys", `"credentials": the credentials file has no project, so the ingest takes no api_key`)
	case len(c.CORSOrigins) > 0 && c.AllowedAPIKeys == nil && !c.AllowedKeysFromCredentials:
		c.warn("cors-origins", "is set but allowed-api-keys is not: the ingest listener takes any api_key and forwards it to your upstream; set allowed-api-keys first")
	}
	return nil
}

// warn adds a warning about setting name worded as Load words errors: the
// setting ("--name" only when it was given as a flag), what is wrong, and
// where its value came from.
func (c *Config) warn(name, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	c.Warnings = append(c.Warnings, fmt.Sprintf("%s%s%s (from %s)", c.label(name), sep(msg), msg, c.Source(name)))
}

// Validate reports the first invalid setting as one line naming the flag;
// the error is a *SettingError (Load names where the value came from).
func (c Config) Validate() error {
	for _, a := range []struct{ name, v string }{{"listen", c.Listen}, {"admin-listen", c.AdminListen}} {
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			return settingErr(a.name, "%q: want host:port, e.g. 127.0.0.1:8080", a.v)
		}
	}
	if c.Listen == c.AdminListen && !strings.HasSuffix(c.Listen, ":0") {
		return &SettingError{Names: []string{"listen", "admin-listen"}, Msg: "and admin-listen are both " + c.Listen}
	}
	if strings.TrimSpace(c.DataDir) == "" {
		return settingErr("data-dir", "is empty")
	}
	for _, u := range c.UpstreamURLs() {
		if *u.URL == "" {
			continue
		}
		if _, ok := baseurl.Parse(*u.URL); !ok {
			return settingErr(u.Name, "%q: want an http:// or https:// base URL", MaskURL(*u.URL))
		}
	}
	if err := firstBad([]bound{
		{"max-batch-events", c.MaxBatchEvents > delivery.MaxMaxBatchEvents, fmt.Sprintf("%d is above %d: the upstream takes fewer than 2000 events per request", c.MaxBatchEvents, delivery.MaxMaxBatchEvents)},
		{"max-batch-events", c.MaxBatchEvents < 1, fmt.Sprintf("%d: want 1 to %d", c.MaxBatchEvents, delivery.MaxMaxBatchEvents)},
		{"max-batch-bytes", c.MaxBatchBytes < 1, fmt.Sprintf("%d: want a positive size", c.MaxBatchBytes)},
		{"max-request-bytes", c.MaxRequestBytes < 1, fmt.Sprintf("%d: want a positive size", c.MaxRequestBytes)},
		{"spool-max-bytes", c.SpoolMaxBytes < 0, "must not be negative"},
		{"spool-min-free-bytes", c.SpoolMinFreeBytes < 0, "must not be negative"},
		{"throttle-pause", c.ThrottlePause <= 0, "must be positive"},
		{"flush-interval", c.FlushInterval <= 0, "must be positive"},
		{"max-event-age", c.MaxEventAge <= 0, "must be positive"},
		{"drain-timeout", c.DrainTimeout <= 0, "must be positive"},
		{"max-lanes", c.MaxLanes < 0, "must not be negative"},
		{"lane-retire-after", c.LaneRetireAfter < 0, "must not be negative"},
		{"max-lanes-per-key", c.MaxLanesPerKey < 0, "must not be negative"},
		{"sync", c.Sync != "always" && c.Sync != "none", fmt.Sprintf("%q: want always or none", c.Sync)},
	}); err != nil {
		return err
	}
	switch {
	case c.Credentials != "" && c.AdminToken == "" && c.AdminTokenFile == "" && c.Token == nil:
		return settingErr("credentials", "needs an admin token (admin-token or admin-token-file): injected credentials must not be open to anyone who reaches the admin listener")
	case !LoopbackAddr(c.AdminListen) && c.AdminToken == "" && c.AdminTokenFile == "" && c.Token == nil && !c.AdminInsecureOpen:
		return &SettingError{Names: []string{"admin-listen", "admin-token"}, Msg: strconv.Quote(c.AdminListen) +
			" is not a loopback address and no admin-token (or admin-token-file) is set: anyone who reaches it could read and replay dead letters, stop lanes and call the forwarded APIs; " +
			"set admin-token-file, listen on 127.0.0.1, or set admin-insecure-open to serve it open"}
	}
	// Fleet mode.
	if c.SpoolPartitions < 1 || c.SpoolPartitions > 256 {
		return settingErr("spool-partitions", "%d: want 1 to 256", c.SpoolPartitions)
	}
	if c.SpoolStreams < 0 || c.SpoolStreams > c.SpoolPartitions {
		return settingErr("spool-streams", "%d: want 0 (the default) to --spool-partitions (%d)", c.SpoolStreams, c.SpoolPartitions)
	}
	for _, f := range []struct{ name, v string }{
		{"nats-creds", c.NATSCreds}, {"nats-tls-ca", c.NATSTLSCA}, {"nats-tls-cert", c.NATSTLSCert}, {"nats-tls-key", c.NATSTLSKey},
	} {
		if f.v == "" {
			continue
		}
		if c.SpoolNATS == nil {
			return settingErr(f.name, "is only for --spool nats://host:port")
		}
		if _, err := os.Stat(f.v); err != nil {
			return settingErr(f.name, "%v", err) // the path, never a secret
		}
	}
	if (c.NATSTLSCert == "") != (c.NATSTLSKey == "") {
		return &SettingError{Names: []string{"nats-tls-cert", "nats-tls-key"}, Msg: "and nats-tls-key go together: set both or neither"}
	}
	// The ingest listener's errors name only the setting that was set
	// (Load adds where from), never as a flag one not given.
	return firstBad([]bound{
		{"spool-upstream-change", !slices.Contains([]string{"refuse", "allow"}, c.SpoolUpstreamChange), fmt.Sprintf("%q: want refuse or allow", c.SpoolUpstreamChange)},
		{"log-level", !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel), fmt.Sprintf("%q: want debug, info, warn or error", c.LogLevel)},
		{"log-format", !slices.Contains([]string{"", "json", "console"}, c.LogFormat), fmt.Sprintf("%q: want json or console", c.LogFormat)},
		{"max-connections", c.MaxConnections < 1, fmt.Sprintf("%d: want a positive number", c.MaxConnections)},
		{"tls-cert", c.TLSCert != "" && c.TLSKey == "", "is set without tls-key: set both or neither"},
		{"tls-key", c.TLSCert == "" && c.TLSKey != "", "is set without tls-cert: set both or neither"},
		{"admin-tls-cert", c.AdminTLSCert != "" && c.AdminTLSKey == "", "is set without admin-tls-key: set both or neither"},
		{"admin-tls-key", c.AdminTLSCert == "" && c.AdminTLSKey != "", "is set without admin-tls-cert: set both or neither"},
		{"max-connections-per-client", c.MaxConnectionsPerClient < 0, fmt.Sprintf("%d: want 0 (no bound) or a positive number", c.MaxConnectionsPerClient)},
	})
}

// bound is one check of Validate: when bad, setting name is refused with
// msg.
type bound struct {
	name string
	bad  bool
	msg  string
}

// firstBad is the error of the first bad bound, in their order; nil when
// none is.
func firstBad(bs []bound) error {
	for _, b := range bs {
		if b.bad {
			return settingErr(b.name, "%s", b.msg)
		}
	}
	return nil
}

// LoopbackAddr reports whether a listen address host:port binds loopback
// only: localhost, 127.0.0.0/8 or ::1. An empty host (every interface), any
// other address and any other name (which may resolve anywhere) are not.
func LoopbackAddr(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// ParseSpool parses --spool: "local" (nil) or NATS servers,
// "nats://h1:4222,h2:4222" (the scheme given once applies to the hosts that
// follow without one) or "nats://h1:4222,tls://h2:4222". Each server needs
// a host and a port; "nats://" and "tls://" are the schemes.
func ParseSpool(v string) ([]string, error) {
	v = strings.TrimSpace(v)
	if v == "local" {
		return nil, nil
	}
	if !strings.HasPrefix(v, "nats://") && !strings.HasPrefix(v, "tls://") {
		return nil, errors.New("want local or nats://host:port[,host:port]")
	}
	var out []string
	scheme := ""
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		if s, rest, ok := strings.Cut(f, "://"); ok {
			if s != "nats" && s != "tls" {
				return nil, fmt.Errorf("server %d: scheme %q: want nats:// or tls://", len(out)+1, s)
			}
			scheme, f = s, rest
		}
		u, err := url.Parse(scheme + "://" + f)
		if err != nil || u.Host == "" || u.Port() == "" || u.Hostname() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
			// Never echo the value: it may hold a password.
			return nil, fmt.Errorf("server %d: want host:port", len(out)+1)
		}
		if _, err := strconv.ParseUint(u.Port(), 10, 16); err != nil {
			return nil, fmt.Errorf("server %d: bad port", len(out)+1)
		}
		out = append(out, scheme+"://"+u.Host)
		if u.User != nil {
			out[len(out)-1] = scheme + "://" + u.User.String() + "@" + u.Host
		}
	}
	return out, nil
}
