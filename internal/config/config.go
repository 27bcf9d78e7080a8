package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/credentials"
	"go.yaml.in/yaml/v3"
)

// MaxBatchEventsLimit is the largest --max-batch-events the relay accepts: the
// upstream takes fewer than 2000 events per request.
const MaxBatchEventsLimit = 1999

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
	MaxBatchEvents int           // --max-batch-events, 1..MaxBatchEventsLimit
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

	// Issue 19: bounded lanes.
	MaxLanes        int           // --max-lanes; 0 means no bound
	LaneRetireAfter time.Duration // --lane-retire-after; 0 never retires
}

// Sandbox reports whether the relay runs against its built-in simulated
// upstream (no --ingest-url).
func (c Config) Sandbox() bool { return c.IngestURL == "" }

// option is one setting: its flag name, default and how to apply a value.
type option struct {
	name   string
	def    string
	usage  string
	isBool bool
	set    func(c *Config, v string) error
}

func str(p func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error { *p(c) = v; return nil }
}

func dur(p func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := ParseDuration(v)
		*p(c) = d
		return err
	}
}

func size(p func(*Config) *int64) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := ParseSize(v)
		*p(c) = n
		return err
	}
}

// options is the table of every setting, in the order of the contract.
var options = []option{
	{name: "listen", def: "127.0.0.1:8080", usage: "ingest listener address (apps and SDKs send events here)",
		set: str(func(c *Config) *string { return &c.Listen })},
	{name: "admin-listen", def: "127.0.0.1:8081", usage: "admin listener address: health, metrics, pprof, dead letters, forwarding",
		set: str(func(c *Config) *string { return &c.AdminListen })},
	{name: "data-dir", def: "./relay-data", usage: "directory of the bbolt spool; created if missing",
		set: str(func(c *Config) *string { return &c.DataDir })},
	{name: "ingest-url", usage: "upstream base for /2/httpapi and /groupidentify; empty: sandbox mode (built-in simulator)",
		set: str(func(c *Config) *string { return &c.IngestURL })},
	{name: "alias-url", usage: "upstream base of the alias (user mapping) API",
		set: str(func(c *Config) *string { return &c.AliasURL })},
	{name: "analytics-url", usage: "upstream base of the analytics/export APIs",
		set: str(func(c *Config) *string { return &c.AnalyticsURL })},
	{name: "experiment-url", usage: "upstream base of the experiment APIs",
		set: str(func(c *Config) *string { return &c.ExperimentURL })},
	{name: "scim-url", usage: "upstream base of the SCIM API",
		set: str(func(c *Config) *string { return &c.ScimURL })},
	{name: "feedback-url", usage: "upstream base of the feedback API",
		set: str(func(c *Config) *string { return &c.FeedbackURL })},
	{name: "throttle-pause", def: "30s", usage: "how long a device or user named in a 429 gets nothing sent",
		set: dur(func(c *Config) *time.Duration { return &c.ThrottlePause })},
	{name: "max-batch-events", def: "1000", usage: "events per upstream request, at most (1..1999)",
		set: func(c *Config, v string) error {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("invalid number %q", v)
			}
			c.MaxBatchEvents = n
			return nil
		}},
	{name: "max-batch-bytes", def: "1000000", usage: "upstream request body size, strictly less than this",
		set: size(func(c *Config) *int64 { return &c.MaxBatchBytes })},
	{name: "flush-interval", def: "200ms", usage: "longest an accepted event waits for its batch to fill",
		set: dur(func(c *Config) *time.Duration { return &c.FlushInterval })},
	{name: "spool-max-bytes", def: "8GiB", usage: "spool quota; above it ingest answers 503 with Retry-After (0: no quota)",
		set: size(func(c *Config) *int64 { return &c.SpoolMaxBytes })},
	{name: "spool-min-free-bytes", def: "256MiB", usage: "free disk space kept in reserve on the data dir's filesystem; below it ingest answers 503 (0: no reserve)",
		set: size(func(c *Config) *int64 { return &c.SpoolMinFreeBytes })},
	{name: "sync", def: "always", usage: "always: answer 200 after fsync; none: after the write reaches the OS",
		set: str(func(c *Config) *string { return &c.Sync })},
	{name: "max-request-bytes", def: "20MB", usage: "largest ingest request body, after decompression (above: 413)",
		set: size(func(c *Config) *int64 { return &c.MaxRequestBytes })},
	{name: "max-event-age", def: "6d", usage: "an event undelivered this long after acceptance goes to dead letters",
		set: dur(func(c *Config) *time.Duration { return &c.MaxEventAge })},
	{name: "upstream-gzip", def: "false", isBool: true, usage: "send upstream bodies gzip-compressed",
		set: func(c *Config, v string) error {
			b, err := strconv.ParseBool(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("invalid boolean %q: want true or false", v)
			}
			c.UpstreamGzip = b
			return nil
		}},
	{name: "admin-token", usage: "token required on admin routes but /healthz, /readyz and /metrics (prefer --admin-token-file)",
		set: str(func(c *Config) *string { return &c.AdminToken })},
	{name: "admin-token-file", usage: "file holding the admin token",
		set: str(func(c *Config) *string { return &c.AdminTokenFile })},
	{name: "credentials", usage: "YAML file of upstream credentials; needs an admin token",
		set: str(func(c *Config) *string { return &c.Credentials })},
	{name: "trusted-proxies", usage: "comma-separated CIDRs whose X-Forwarded-For is trusted",
		set: func(c *Config, v string) error {
			ps, err := parsePrefixes(v)
			c.TrustedProxies = ps
			return err
		}},
	{name: "drain-timeout", def: "10s", usage: "on SIGTERM/SIGINT, longest wait for in-flight requests and deliveries",
		set: dur(func(c *Config) *time.Duration { return &c.DrainTimeout })},
	{name: "log-level", def: "info", usage: "debug, info, warn or error",
		set: str(func(c *Config) *string { return &c.LogLevel })},
	{name: "log-format", usage: "json or console; empty: console on a terminal, json otherwise",
		set: str(func(c *Config) *string { return &c.LogFormat })},
	{name: "config", usage: "YAML file of settings (keys are the flag names); flags and RELAY_* variables beat it",
		set: str(func(c *Config) *string { return &c.ConfigFile })},
	// Issue 19: bounded lanes.
	{name: "max-lanes", def: "10000", usage: "lanes (kind + api_key + canonical options) held at once; a new one beyond it gets 503 + Retry-After (0: no bound)",
		set: func(c *Config, v string) error {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 0 {
				return fmt.Errorf("invalid number %q: want 0 or more", v)
			}
			c.MaxLanes = n
			return nil
		}},
	{name: "lane-retire-after", def: "10m", usage: "an empty lane with nothing accepted for this long is retired (its goroutines, metric series and spool record removed; 0: never)",
		set: dur(func(c *Config) *time.Duration { return &c.LaneRetireAfter })},
}

// EnvName returns the environment variable of a flag: RELAY_ plus the flag
// name in upper snake case.
func EnvName(flagName string) string {
	return "RELAY_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func lookupOption(name string) (option, bool) {
	for _, o := range options {
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
	for _, o := range options {
		fmt.Fprintf(tw, "--%s\t%s\t%s\t%s\n", o.name, o.def, EnvName(o.name), o.usage)
	}
	tw.Flush()
}

// Load builds the configuration from args (without the program name),
// environ (os.Environ's form, "KEY=value") and the YAML file they name, then
// validates it. The error names the setting and where its value came from.
func Load(args []string, environ []string) (Config, error) {
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	raws := make(map[string]*rawValue, len(options))
	for _, o := range options {
		r := &rawValue{isBool: o.isBool}
		raws[o.name] = r
		fs.Var(r, o.name, o.usage)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, ErrHelp
		}
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q (settings are flags: --name value)", fs.Arg(0))
	}

	env := make(map[string]string)
	var c Config
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, "RELAY_") {
			continue
		}
		env[k] = v
	}
	for k := range env {
		known := false
		for _, o := range options {
			known = known || EnvName(o.name) == k
		}
		if !known {
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
	if cfgFile != "" {
		var err error
		if file, err = readFile(cfgFile); err != nil {
			return Config{}, err
		}
	}

	for _, o := range options {
		v, src := o.def, "default"
		if r := raws[o.name]; r.set {
			v, src = r.v, "flag --"+o.name
		} else if ev, ok := env[EnvName(o.name)]; ok {
			v, src = ev, "variable "+EnvName(o.name)
		} else if fv, ok := file[o.name]; ok {
			v, src = fv, fmt.Sprintf("key %s in %s", o.name, cfgFile)
		}
		if err := o.set(&c, v); err != nil {
			return Config{}, fmt.Errorf("--%s (from %s): %w", o.name, src, err)
		}
	}
	if err := c.finish(); err != nil {
		return Config{}, err
	}
	if raws["admin-token"].set {
		c.Warnings = append(c.Warnings, "--admin-token on the command line shows in every local user's process list: prefer --admin-token-file or RELAY_ADMIN_TOKEN")
	}
	return c, nil
}

// readFile reads the YAML settings file into flag name -> raw value.
func readFile(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	out := make(map[string]string)
	if doc.Kind == 0 { // empty file
		return out, nil
	}
	m := &doc
	if m.Kind == yaml.DocumentNode && len(m.Content) == 1 {
		m = m.Content[0]
	}
	if m.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("config file %s: want a mapping of setting: value", path)
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if _, ok := lookupOption(k.Value); !ok || k.Value == "config" {
			return nil, fmt.Errorf("config file %s line %d: unknown key %q", path, k.Line, k.Value)
		}
		if _, dup := out[k.Value]; dup {
			return nil, fmt.Errorf("config file %s line %d: key %q given twice", path, k.Line, k.Value)
		}
		switch {
		case v.Kind == yaml.ScalarNode && v.Tag == "!!null":
			out[k.Value] = ""
		case v.Kind == yaml.ScalarNode:
			out[k.Value] = v.Value
		case v.Kind == yaml.SequenceNode && k.Value == "trusted-proxies":
			items := make([]string, 0, len(v.Content))
			for _, it := range v.Content {
				if it.Kind != yaml.ScalarNode {
					return nil, fmt.Errorf("config file %s line %d: %s: want a list of CIDRs", path, it.Line, k.Value)
				}
				items = append(items, it.Value)
			}
			out[k.Value] = strings.Join(items, ",")
		default:
			return nil, fmt.Errorf("config file %s line %d: %s: want a single value", path, v.Line, k.Value)
		}
	}
	return out, nil
}

func parsePrefixes(v string) ([]netip.Prefix, error) {
	var ps []netip.Prefix
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return nil, fmt.Errorf("invalid CIDR %q", f)
			}
			ps = append(ps, netip.PrefixFrom(a, a.BitLen()))
			continue
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
		return errors.New("--admin-token and --admin-token-file are both set; use one")
	case err != nil && c.AdminTokenFile != "":
		return fmt.Errorf("--admin-token-file: %w", err)
	case err != nil:
		return fmt.Errorf("--admin-token: %w", err)
	}
	c.Token, c.AdminToken = tok, ""
	if tok.ReadableByOthers() {
		c.Warnings = append(c.Warnings, fmt.Sprintf("--admin-token-file %s is readable by group or others: chmod 600 it", c.AdminTokenFile))
	}
	if c.Credentials != "" {
		if c.Creds, err = credentials.Load(c.Credentials); err != nil {
			return fmt.Errorf("--credentials: %w", err)
		}
	}
	return nil
}

// Validate reports the first invalid setting as one line naming the flag.
func (c Config) Validate() error {
	for _, a := range []struct{ name, v string }{{"listen", c.Listen}, {"admin-listen", c.AdminListen}} {
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			return fmt.Errorf("--%s %q: want host:port, e.g. 127.0.0.1:8080", a.name, a.v)
		}
	}
	if c.Listen == c.AdminListen && !strings.HasSuffix(c.Listen, ":0") {
		return fmt.Errorf("--listen and --admin-listen are both %s", c.Listen)
	}
	if strings.TrimSpace(c.DataDir) == "" {
		return errors.New("--data-dir is empty")
	}
	for _, u := range []struct{ name, v string }{
		{"ingest-url", c.IngestURL}, {"alias-url", c.AliasURL}, {"analytics-url", c.AnalyticsURL},
		{"experiment-url", c.ExperimentURL}, {"scim-url", c.ScimURL}, {"feedback-url", c.FeedbackURL},
	} {
		if u.v == "" {
			continue
		}
		p, err := url.Parse(u.v)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("--%s %q: want an http:// or https:// base URL", u.name, u.v)
		}
	}
	switch {
	case c.MaxBatchEvents > MaxBatchEventsLimit:
		return fmt.Errorf("--max-batch-events %d is above %d: the upstream takes fewer than 2000 events per request", c.MaxBatchEvents, MaxBatchEventsLimit)
	case c.MaxBatchEvents < 1:
		return fmt.Errorf("--max-batch-events %d: want 1 to %d", c.MaxBatchEvents, MaxBatchEventsLimit)
	case c.MaxBatchBytes < 1:
		return fmt.Errorf("--max-batch-bytes %d: want a positive size", c.MaxBatchBytes)
	case c.MaxRequestBytes < 1:
		return fmt.Errorf("--max-request-bytes %d: want a positive size", c.MaxRequestBytes)
	case c.SpoolMaxBytes < 0, c.SpoolMinFreeBytes < 0:
		return errors.New("spool sizes must not be negative")
	case c.ThrottlePause <= 0:
		return errors.New("--throttle-pause must be positive")
	case c.FlushInterval <= 0:
		return errors.New("--flush-interval must be positive")
	case c.MaxEventAge <= 0:
		return errors.New("--max-event-age must be positive")
	case c.DrainTimeout <= 0:
		return errors.New("--drain-timeout must be positive")
	case c.MaxLanes < 0:
		return errors.New("--max-lanes must not be negative")
	case c.LaneRetireAfter < 0:
		return errors.New("--lane-retire-after must not be negative")
	case c.Sync != "always" && c.Sync != "none":
		return fmt.Errorf("--sync %q: want always or none", c.Sync)
	case c.Credentials != "" && c.AdminToken == "" && c.AdminTokenFile == "" && c.Token == nil:
		return errors.New("--credentials needs an admin token (--admin-token or --admin-token-file): injected credentials must not be open to anyone who reaches the admin listener")
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	switch c.LogFormat {
	case "", "json", "console":
	default:
		return fmt.Errorf("--log-format %q: want json or console", c.LogFormat)
	}
	return nil
}
