package config

import (
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/plan"
)

func TestDefaults(t *testing.T) {
	c, err := Load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Listen: "127.0.0.1:8080", AdminListen: "127.0.0.1:8081", DataDir: "./relay-data",
		ThrottlePause: 30 * time.Second, MaxBatchEvents: 1000, MaxBatchBytes: 1000000,
		FlushInterval: 200 * time.Millisecond, SpoolMaxBytes: 8 << 30, SpoolMinFreeBytes: 256 << 20,
		Sync: "always", MaxRequestBytes: 20_000_000, MaxEventAge: 6 * 24 * time.Hour,
		DrainTimeout: 10 * time.Second, LogLevel: "info",
		MaxConnections:          16384, // the ingest listener's
		SpoolPartitions:         3,
		MaxConnectionsPerClient: 256,
		SpoolUpstreamChange:     "refuse",
		MaxLanes:                10000, LaneRetireAfter: 10 * time.Minute, TrackingPlanRefresh: 5 * time.Minute,
		MaxLanesPerKey: 16,
	}
	if !equal(c, want) {
		t.Fatalf("defaults\n got %+v\nwant %+v", c, want)
	}
	if !c.Sandbox() {
		t.Fatal("no --ingest-url must mean sandbox mode")
	}
}

func equal(a, b Config) bool {
	if len(a.TrustedProxies) != len(b.TrustedProxies) {
		return false
	}
	for i := range a.TrustedProxies {
		if a.TrustedProxies[i] != b.TrustedProxies[i] {
			return false
		}
	}
	a.TrustedProxies, b.TrustedProxies = nil, nil
	a.Warnings, b.Warnings = nil, nil
	a.Settings, b.Settings = nil, nil
	if (a.Token == nil) != (b.Token == nil) || (a.Creds == nil) != (b.Creds == nil) {
		return false
	}
	a.Token, b.Token, a.Creds, b.Creds = nil, nil, nil, nil
	return reflect.DeepEqual(a, b)
}

func TestFullFile(t *testing.T) {
	c, err := Load([]string{"--config", "testdata/full.yaml"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Listen: "127.0.0.1:9090", AdminListen: "127.0.0.1:9091", DataDir: "/var/lib/relay",
		IngestURL: "https://ingest.example.test", AliasURL: "https://alias.example.test",
		AnalyticsURL: "https://analytics.example.test", ExperimentURL: "https://experiment.example.test",
		ScimURL: "https://scim.example.test", FeedbackURL: "https://feedback.example.test",
		ThrottlePause: 45 * time.Second, MaxBatchEvents: 500, MaxBatchBytes: 500_000,
		FlushInterval: time.Second, SpoolMaxBytes: 2 << 30, SpoolMinFreeBytes: 1 << 30, Sync: "none",
		MaxRequestBytes: 10_000_000, MaxEventAge: 5 * 24 * time.Hour, UpstreamGzip: true,
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.1/32")},
		DrainTimeout:   20 * time.Second, LogLevel: "debug", LogFormat: "console",
		ConfigFile: "testdata/full.yaml",
		// The ingest listener.
		MaxConnections: 1000, TLSCert: "/etc/relay/tls/cert.pem", TLSKey: "/etc/relay/tls/key.pem",
		AdminTLSCert: "/etc/relay/tls/admin-cert.pem", AdminTLSKey: "/etc/relay/tls/admin-key.pem",
		SpoolPartitions:         3,
		MaxConnectionsPerClient: 64,
		SpoolUpstreamChange:     "refuse",
		MaxLanes:                500, LaneRetireAfter: time.Hour, TrackingPlanRefresh: 5 * time.Minute,
		MaxLanesPerKey: 16,
	}
	if !equal(c, want) {
		t.Fatalf("\n got %+v\nwant %+v", c, want)
	}
}

// TestPrecedence: a flag beats the variable, the variable beats the file, the
// file beats the default.
func TestPrecedence(t *testing.T) {
	file := []string{"--config", "testdata/partial.yaml"}
	tests := []struct {
		name    string
		args    []string
		env     []string
		listen  string
		sync    string
		batchEv int
	}{
		{"default", nil, nil, "127.0.0.1:8080", "always", 1000},
		{"file beats default", file, nil, "127.0.0.1:7000", "none", 10},
		{"variable beats file", file, []string{"RELAY_LISTEN=127.0.0.1:7001", "RELAY_MAX_BATCH_EVENTS=20"}, "127.0.0.1:7001", "none", 20},
		{"flag beats variable", append(file, "--listen", "127.0.0.1:7002"), []string{"RELAY_LISTEN=127.0.0.1:7001"}, "127.0.0.1:7002", "none", 10},
		{"flag beats file", append(file, "--sync=always"), nil, "127.0.0.1:7000", "always", 10},
		{"config file named by variable", nil, []string{"RELAY_CONFIG=testdata/partial.yaml"}, "127.0.0.1:7000", "none", 10},
		{"single-dash flag", []string{"-listen", "127.0.0.1:7003"}, nil, "127.0.0.1:7003", "always", 1000},
		{"empty variable counts as set", nil, []string{"RELAY_INGEST_URL="}, "127.0.0.1:8080", "always", 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.args, tt.env)
			if err != nil {
				t.Fatal(err)
			}
			if c.Listen != tt.listen || c.Sync != tt.sync || c.MaxBatchEvents != tt.batchEv {
				t.Fatalf("got listen=%s sync=%s max-batch-events=%d, want %s %s %d",
					c.Listen, c.Sync, c.MaxBatchEvents, tt.listen, tt.sync, tt.batchEv)
			}
		})
	}
}

// TestEnvNames checks every flag is read from its RELAY_ variable.
func TestEnvNames(t *testing.T) {
	if got := EnvName("ingest-url"); got != "RELAY_INGEST_URL" {
		t.Fatalf("EnvName(ingest-url) = %s", got)
	}
	env := []string{
		"RELAY_LISTEN=127.0.0.1:1", "RELAY_ADMIN_LISTEN=127.0.0.1:2", "RELAY_DATA_DIR=/d",
		"RELAY_INGEST_URL=http://i", "RELAY_ALIAS_URL=http://a", "RELAY_ANALYTICS_URL=http://an",
		"RELAY_EXPERIMENT_URL=http://e", "RELAY_SCIM_URL=http://s", "RELAY_FEEDBACK_URL=http://f",
		"RELAY_THROTTLE_PAUSE=1m", "RELAY_MAX_BATCH_EVENTS=1999", "RELAY_MAX_BATCH_BYTES=1KiB",
		"RELAY_FLUSH_INTERVAL=5ms", "RELAY_SPOOL_MAX_BYTES=1MB", "RELAY_SPOOL_MIN_FREE_BYTES=0",
		"RELAY_SYNC=none", "RELAY_MAX_REQUEST_BYTES=1000", "RELAY_MAX_EVENT_AGE=1d12h",
		"RELAY_UPSTREAM_GZIP=true", "RELAY_ADMIN_TOKEN=tok", "RELAY_CREDENTIALS=testdata/credentials.yaml",
		"RELAY_TRUSTED_PROXIES=10.0.0.0/8, ::1/128", "RELAY_DRAIN_TIMEOUT=3s",
		"RELAY_LOG_LEVEL=warn", "RELAY_LOG_FORMAT=json", "RELAY_CONFIG=testdata/empty.yaml",
		"RELAY_CORS_ORIGINS=https://a.example", "RELAY_ALLOWED_API_KEYS=k1", "RELAY_CLIENT_RATE_LIMIT=3",
		"RELAY_ANONYMIZE_IP=true", "RELAY_TRACKING_PLAN=block", "RELAY_TRACKING_PLAN_REFRESH=1m",
		"RELAY_SPOOL_UPSTREAM_CHANGE=allow",
		"RELAY_MAX_LANES=7", "RELAY_LANE_RETIRE_AFTER=0",
		"RELAY_MAX_LANES_PER_KEY=3",
		"RELAY_NOT_A_SETTING=1", "PATH=/bin",
		// The ingest listener.
		"RELAY_MAX_CONNECTIONS=7", "RELAY_TLS_CERT=c", "RELAY_TLS_KEY=k",
		"RELAY_ADMIN_TLS_CERT=ac", "RELAY_ADMIN_TLS_KEY=ak",
		// Fleet mode.
		"RELAY_SPOOL=nats://h1:4222,h2:4222", "RELAY_NATS_CREDS=testdata/admin.token", "RELAY_NATS_TLS_CA=testdata/admin.token",
		"RELAY_NATS_TLS_CERT=testdata/credentials.yaml", "RELAY_NATS_TLS_KEY=testdata/empty.yaml", "RELAY_SPOOL_PARTITIONS=8", "RELAY_SPOOL_STREAMS=2",
		"RELAY_MAX_CONNECTIONS_PER_CLIENT=0",
		"RELAY_ADMIN_INSECURE_OPEN=true",
	}
	c, err := Load(nil, env)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Listen: "127.0.0.1:1", AdminListen: "127.0.0.1:2", DataDir: "/d",
		IngestURL: "http://i", AliasURL: "http://a", AnalyticsURL: "http://an", ExperimentURL: "http://e",
		ScimURL: "http://s", FeedbackURL: "http://f", ThrottlePause: time.Minute, MaxBatchEvents: 1999,
		MaxBatchBytes: 1024, FlushInterval: 5 * time.Millisecond, SpoolMaxBytes: 1_000_000,
		Sync: "none", MaxRequestBytes: 1000, MaxEventAge: 36 * time.Hour, UpstreamGzip: true,
		Token: tokenOf(t, "tok"), Credentials: "testdata/credentials.yaml", Creds: &credentials.Store{},
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")},
		DrainTimeout:   3 * time.Second, LogLevel: "warn", LogFormat: "json", ConfigFile: "testdata/empty.yaml",
		// The ingest listener.
		MaxConnections: 7, TLSCert: "c", TLSKey: "k", AdminTLSCert: "ac", AdminTLSKey: "ak",
		CORSOrigins: []string{"https://a.example"}, AllowedAPIKeys: []string{"k1"}, ClientRateLimit: 3, AnonymizeIP: true,
		// Fleet mode.
		SpoolNATS: []string{"nats://h1:4222", "nats://h2:4222"}, NATSCreds: "testdata/admin.token", NATSTLSCA: "testdata/admin.token",
		NATSTLSCert: "testdata/credentials.yaml", NATSTLSKey: "testdata/empty.yaml", SpoolPartitions: 8, SpoolStreams: 2,
		// 0 turns the bound off.
		MaxConnectionsPerClient: 0, SpoolUpstreamChange: "allow", MaxLanes: 7, MaxLanesPerKey: 3,
		AdminInsecureOpen: true, TrackingPlan: plan.Block, TrackingPlanRefresh: time.Minute,
	}
	if !equal(c, want) {
		t.Fatalf("\n got %+v\nwant %+v", c, want)
	}
	// Beside it, only the fixture's mode (0644 when checked out) may warn.
	if len(c.Warnings) == 0 || !strings.Contains(c.Warnings[0], "RELAY_NOT_A_SETTING") ||
		len(c.Warnings) > 2 || (len(c.Warnings) == 2 && !strings.Contains(c.Warnings[1], "readable by group or others")) {
		t.Fatalf("warnings = %q, want one naming RELAY_NOT_A_SETTING", c.Warnings)
	}
	// Every option has a distinct variable (a typo in the table would show here).
	seen := map[string]bool{}
	for _, o := range options(new(Config)) {
		if seen[EnvName(o.name)] {
			t.Fatalf("duplicate variable %s", EnvName(o.name))
		}
		seen[EnvName(o.name)] = true
	}
	// RELAY_ADMIN_TOKEN_FILE is left out (it excludes RELAY_ADMIN_TOKEN) and
	// covered by TestTokenFile.
	if len(seen) != len(env)-2+1 {
		t.Fatalf("test covers %d variables, the table has %d", len(env)-2+1, len(seen))
	}
}

func TestBoolFlag(t *testing.T) {
	c, err := Load([]string{"--upstream-gzip", "--ingest-url", "http://x"}, nil)
	if err != nil || !c.UpstreamGzip || c.IngestURL != "http://x" {
		t.Fatalf("bare --upstream-gzip: %+v %v", c, err)
	}
	c, err = Load([]string{"--upstream-gzip=false"}, []string{"RELAY_UPSTREAM_GZIP=1"})
	if err != nil || c.UpstreamGzip {
		t.Fatalf("--upstream-gzip=false over variable: %+v %v", c, err)
	}
}

func TestTokenFile(t *testing.T) {
	c, err := Load([]string{"--config", "testdata/credentials_token_file.yaml"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !accepts(c.Token, "s3cret-token") || accepts(c.Token, "s3cret-toke") {
		t.Fatal("token: want the file's content trimmed")
	}
	if c.AdminToken != "" {
		t.Fatal("raw token kept in Config after loading")
	}
	// testdata/admin.token is 0644: a warning names the file, not the token.
	found := false
	for _, w := range c.Warnings {
		found = found || strings.Contains(w, "testdata/admin.token is readable by group or others")
		if strings.Contains(w, "s3cret") {
			t.Fatalf("warning holds the token: %q", w)
		}
	}
	if !found {
		t.Fatalf("warnings %q: want one about the readable token file", c.Warnings)
	}
	// testdata/credentials.yaml is 0644 too.
	found = false
	for _, w := range c.Warnings {
		found = found || strings.Contains(w, "credentials testdata/credentials.yaml is readable by group or others: chmod 600 it (from testdata/credentials_token_file.yaml line 1)") && !strings.Contains(w, "--")
	}
	if !found {
		t.Fatalf("warnings %q: want one about the readable credentials file", c.Warnings)
	}
	if c.Creds == nil || len(c.Creds.Projects()) != 1 {
		t.Fatalf("credentials not loaded: %v", c.Creds)
	}

	// A token on the command line gives a warning (without the token).
	c, err = Load([]string{"--admin-token", "flag-token"}, nil)
	if err != nil || len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "prefer --admin-token-file") || strings.Contains(c.Warnings[0], "flag-token") {
		t.Fatalf("token flag: %v %q", err, c.Warnings)
	}

	// A private file gives no warning.
	priv := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(priv, []byte("another-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = Load([]string{"--admin-token-file", priv}, nil)
	if err != nil || !accepts(c.Token, "another-token") || len(c.Warnings) != 0 {
		t.Fatalf("private token file: %v %q", err, c.Warnings)
	}
}

// accepts reports whether tok lets "Authorization: Bearer v" through on an
// own route.
func accepts(tok *admintoken.Token, v string) bool {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer "+v)
	_, ok := tok.Check(httptest.NewRecorder(), r, admintoken.ModeOwn)
	return ok && tok != nil
}

func tokenOf(t *testing.T, v string) *admintoken.Token {
	t.Helper()
	tok, err := admintoken.New(v)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestRefusals: every invalid setting is refused with one line naming it.
func TestRefusals(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want string // substring of the error
	}{
		{"unknown yaml key", []string{"--config", "testdata/unknown_key.yaml"}, nil, `line 2: unknown key "ingest_url"`},
		{"config key in file", []string{"--config", "testdata/config_key.yaml"}, nil, `unknown key "config"`},
		{"nested yaml value", []string{"--config", "testdata/nested.yaml"}, nil, "listen: want a single value"},
		{"duplicate yaml key", []string{"--config", "testdata/duplicate.yaml"}, nil, `"listen" given twice`},
		{"missing config file", []string{"--config", "testdata/nope.yaml"}, nil, "no such file"},
		{"bad size in file", []string{"--config", "testdata/bad_size.yaml"}, nil, "spool-max-bytes (from testdata/bad_size.yaml line 1): invalid size"},
		{"max-batch-events 2000 in file", []string{"--config", "testdata/batch_too_big.yaml"}, nil, "max-batch-events 2000 is above 1999: the upstream takes fewer than 2000 events per request (from testdata/batch_too_big.yaml line 1)"},
		{"max-batch-events flag", []string{"--max-batch-events", "5000"}, nil, "above 1999"},
		{"max-batch-events zero", []string{"--max-batch-events", "0"}, nil, "want 1 to 1999"},
		{"max-batch-events not a number", nil, []string{"RELAY_MAX_BATCH_EVENTS=lots"}, "max-batch-events (from variable RELAY_MAX_BATCH_EVENTS): invalid number"},
		{"credentials without token", []string{"--config", "testdata/credentials_no_token.yaml"}, nil, "credentials needs an admin token (admin-token or admin-token-file): injected credentials must not be open to anyone who reaches the admin listener (from testdata/credentials_no_token.yaml line 1)"},
		{"admin listener open to the network", []string{"--admin-listen", "0.0.0.0:8081"}, nil, "--admin-listen \"0.0.0.0:8081\" is not a loopback address and no admin-token (or admin-token-file) is set: anyone who reaches it could read and replay dead letters, stop lanes and call the forwarded APIs; set admin-token-file, listen on 127.0.0.1, or set admin-insecure-open to serve it open (from admin-listen from flag --admin-listen; admin-token from default)"},
		{"admin listener on every interface", nil, []string{"RELAY_ADMIN_LISTEN=:8081"}, "admin-listen \":8081\" is not a loopback address"},
		{"admin listener on a name", []string{"--admin-listen", "relay.internal:8081"}, nil, "--admin-listen \"relay.internal:8081\" is not a loopback address"},
		{"admin listener on IPv6", []string{"--admin-listen", "[::]:8081", "--admin-insecure-open=false"}, nil, "is not a loopback address"},
		{"credentials file missing", []string{"--credentials", "testdata/nope.yaml", "--admin-token", "x"}, nil, "--credentials"},
		{"both token and token file", []string{"--admin-token", "a", "--admin-token-file", "testdata/admin.token"}, nil, "both set"},
		{"empty token file", []string{"--admin-token-file", "testdata/empty.yaml"}, nil, "is empty"},
		{"token with white space", []string{"--admin-token", "two words"}, nil, "--admin-token: admin token has white space"},
		{"invalid credentials file", []string{"--credentials", "testdata/full.yaml", "--admin-token", "x"}, nil, "--credentials: "},
		{"bad sync", []string{"--sync", "sometimes"}, nil, `--sync "sometimes"`},
		{"bad duration", []string{"--flush-interval", "soon"}, nil, "--flush-interval (from flag --flush-interval): invalid duration"},
		{"zero drain", []string{"--drain-timeout", "0s"}, nil, "--drain-timeout must be positive"},
		{"negative duration", []string{"--throttle-pause", "-1s"}, nil, "negative"},
		{"bad url", []string{"--ingest-url", "ingest.example.test"}, nil, "--ingest-url"},
		{"url with query", []string{"--analytics-url", "https://analytics.example.test/?k=v"}, nil, "--analytics-url"},
		{"bad listen", []string{"--listen", "8080"}, nil, "--listen"},
		{"same listeners", []string{"--listen", "127.0.0.1:9", "--admin-listen", "127.0.0.1:9"}, nil, "both"},
		{"bad cidr", []string{"--trusted-proxies", "10.0.0.0/33"}, nil, "invalid CIDR"},
		{"bad address", []string{"--trusted-proxies", "10.0.0.300"}, nil, `invalid CIDR "10.0.0.300"`},
		{"bad log level", []string{"--log-level", "loud"}, nil, "--log-level"},
		{"bad log format", []string{"--log-format", "xml"}, nil, "--log-format"},
		{"unknown flag", []string{"--ingest_url", "http://x"}, nil, "flag provided but not defined"},
		{"stray argument", []string{"serve"}, nil, `unexpected argument "serve"`},
		{"zero request bytes", []string{"--max-request-bytes", "0"}, nil, "--max-request-bytes 0"},
		// The ingest listener.
		{"zero connections", []string{"--max-connections", "0"}, nil, "--max-connections 0"},
		{"connections not a number", []string{"--max-connections", "many"}, nil, "--max-connections (from flag --max-connections): invalid number"},
		{"negative lanes", []string{"--max-lanes", "-1"}, nil, "--max-lanes must not be negative (from flag --max-lanes)"},
		{"lanes not a number", nil, []string{"RELAY_MAX_LANES_PER_KEY=x"}, "max-lanes-per-key (from variable RELAY_MAX_LANES_PER_KEY): invalid number"},
		// Fleet mode.
		{"spool neither local nor nats", []string{"--spool", "kafka://h:9092"}, nil, "--spool (from flag --spool): want local or nats://"},
		{"spool server without port", []string{"--spool", "nats://h1:4222,h2"}, nil, "server 2: want host:port"},
		{"spool password not echoed", []string{"--spool", "nats://u:s3cret@h1"}, nil, "server 1: want host:port"},
		{"spool bad scheme", []string{"--spool", "nats://h1:4222,http://h2:4222"}, nil, `scheme "http"`},
		{"nats creds with local spool", []string{"--nats-creds", "testdata/admin.token"}, nil, "--nats-creds is only for --spool nats://"},
		{"nats creds missing", []string{"--spool", "nats://h:4222", "--nats-creds", "testdata/nope.creds"}, nil, "--nats-creds stat testdata/nope.creds"},
		{"nats tls cert without key", []string{"--spool", "nats://h:4222", "--nats-tls-cert", "testdata/admin.token"}, nil, "--nats-tls-cert and nats-tls-key go together: set both or neither (from nats-tls-cert from flag --nats-tls-cert"},
		{"zero partitions", []string{"--spool-partitions", "0"}, nil, "--spool-partitions 0"},
		{"too many partitions", nil, []string{"RELAY_SPOOL_PARTITIONS=1000"}, "spool-partitions 1000: want 1 to 256 (from variable RELAY_SPOOL_PARTITIONS)"},
		{"more streams than partitions", []string{"--spool-partitions", "2", "--spool-streams", "3"}, nil, "spool-streams 3: want 0 (the default) to --spool-partitions (2)"},
		{"tls cert without key", []string{"--tls-cert", "c.pem"}, nil, "--tls-cert is set without tls-key: set both or neither (from flag --tls-cert)"},
		{"tls key without cert", nil, []string{"RELAY_TLS_KEY=k.pem"}, "tls-key is set without tls-cert: set both or neither (from variable RELAY_TLS_KEY)"},
		{"admin tls cert without key", []string{"--admin-tls-cert", "c.pem"}, nil, "--admin-tls-cert is set without admin-tls-key"},
		{"negative connections per client", []string{"--max-connections-per-client", "-1"}, nil, "--max-connections-per-client -1: want 0 (no bound) or a positive number (from flag --max-connections-per-client)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(tt.args, tt.env)
			if err == nil {
				t.Fatalf("accepted; want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	if _, err := Load([]string{"--help"}, nil); err != ErrHelp {
		t.Fatalf("--help: %v, want ErrHelp", err)
	}
	var b strings.Builder
	Usage(&b)
	for _, o := range options(new(Config)) {
		if !strings.Contains(b.String(), "--"+o.name) || !strings.Contains(b.String(), EnvName(o.name)) {
			t.Fatalf("usage lacks %s", o.name)
		}
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		err  bool
	}{
		{"1000000", 1000000, false},
		{"20MB", 20_000_000, false},
		{"8GiB", 8 << 30, false},
		{"8gib", 8 << 30, false},
		{"256 MiB", 256 << 20, false},
		{"1KB", 1000, false},
		{"1KiB", 1024, false},
		{"2TB", 2e12, false},
		{"1TiB", 1 << 40, false},
		{"100B", 100, false},
		{"1.5GiB", 3 << 29, false},
		{"0", 0, false},
		{"", 0, true},
		{"MB", 0, true},
		{"-1", 0, true},
		{"8 gigs", 0, true},
		{"1.5", 0, true}, // not whole bytes
		{"0.1KiB", 0, true},
		{"9999999999TiB", 0, true},
		{"99999999999999999999", 0, true},
		{"1.2.3MB", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if (err != nil) != tt.err || (!tt.err && got != tt.want) {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, err=%v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{"200ms", 200 * time.Millisecond, false},
		{"30s", 30 * time.Second, false},
		{"1h30m", 90 * time.Minute, false},
		{"6d", 6 * 24 * time.Hour, false},
		{"1d12h", 36 * time.Hour, false},
		{"0d", 0, false},
		{"0", 0, false},
		{"", 0, true},
		{"d", 0, true},
		{"-1s", 0, true},
		{"-6d", 0, true},
		{"1.5d", 0, true},
		{"6days", 0, true},
		{"1d-1h", 0, true},
		{"soon", 0, true},
		{"99999d", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseDuration(tt.in)
		if (err != nil) != tt.err || (!tt.err && got != tt.want) {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v, err=%v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"8GiB", "20MB", "1.5GiB", "1000000", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err == nil && n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
	})
}

func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"6d", "1d12h", "200ms", "-1s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err == nil && d < 0 {
			t.Fatalf("ParseDuration(%q) = %v", s, d)
		}
	})
}

// TestDeployExample: deploy/relay.yaml loads and names every setting but
// config itself, so the example stays complete and true.
func TestDeployExample(t *testing.T) {
	const path = "../../deploy/relay.yaml"
	c, err := Load([]string{"--config", path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Sandbox() || c.MaxBatchEvents != 1000 || c.SpoolMaxBytes != 8<<30 {
		t.Fatalf("example config: %+v", c)
	}
	keys, _, err := readFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range options(new(Config)) {
		if _, ok := keys[o.name]; !ok && o.name != "config" {
			t.Errorf("deploy/relay.yaml lacks %s", o.name)
		}
	}
}

// TestSpool: --spool's forms.
func TestSpool(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want []string
	}{
		{"local", nil},
		{"nats://h1:4222", []string{"nats://h1:4222"}},
		{"nats://h1:4222,h2:4222, h3:4222", []string{"nats://h1:4222", "nats://h2:4222", "nats://h3:4222"}},
		{"tls://h1:4222,h2:4222", []string{"tls://h1:4222", "tls://h2:4222"}},
		{"nats://u:p@h1:4222,[::1]:4222", []string{"nats://u:p@h1:4222", "nats://[::1]:4222"}},
	} {
		c, err := Load([]string{"--spool", tt.in}, nil)
		if err != nil {
			t.Errorf("%s: %v", tt.in, err)
			continue
		}
		if !reflect.DeepEqual(c.SpoolNATS, tt.want) {
			t.Errorf("%s: %q, want %q", tt.in, c.SpoolNATS, tt.want)
		}
	}
	c, err := Load([]string{"--spool", "nats://h:4222", "--nats-creds", "testdata/admin.token", "--nats-tls-ca", "testdata/admin.token",
		"--nats-tls-cert", "testdata/admin.token", "--nats-tls-key", "testdata/admin.token", "--spool-partitions", "32"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.NATSCreds == "" || c.NATSTLSCA == "" || c.NATSTLSCert == "" || c.NATSTLSKey == "" || c.SpoolPartitions != 32 {
		t.Fatalf("%+v", c)
	}
}

// TestAdminListenClosedByDefault: a non-loopback admin listener starts
// only with an admin token or the explicit opt-out; loopback ones need
// neither.
func TestAdminListenClosedByDefault(t *testing.T) {
	for _, args := range [][]string{
		{"--admin-listen", "127.0.0.1:8081"},
		{"--admin-listen", "127.3.2.1:0"},
		{"--admin-listen", "localhost:8081"},
		{"--admin-listen", "[::1]:8081"},
		{"--admin-listen", "0.0.0.0:8081", "--admin-token", "tok"},
		{"--admin-listen", "0.0.0.0:8081", "--admin-token-file", "testdata/admin.token"},
		{"--admin-listen", "0.0.0.0:8081", "--admin-insecure-open"},
		{"--admin-listen", "10.1.2.3:8081", "--admin-insecure-open=true"},
	} {
		c, err := Load(args, nil)
		if err != nil {
			t.Errorf("%q: %v", args, err)
			continue
		}
		if got := slices.Contains(args, "--admin-insecure-open") || slices.Contains(args, "--admin-insecure-open=true"); c.AdminInsecureOpen != got {
			t.Errorf("%q: AdminInsecureOpen %v", args, c.AdminInsecureOpen)
		}
	}
	for addr, want := range map[string]bool{
		"127.0.0.1:1": true, "localhost:1": true, "LOCALHOST:1": true, "[::1]:1": true, "127.255.0.1:1": true,
		"0.0.0.0:1": false, ":1": false, "[::]:1": false, "10.0.0.1:1": false, "example.test:1": false, "8081": false,
	} {
		if got := LoopbackAddr(addr); got != want {
			t.Errorf("LoopbackAddr(%q) = %v, want %v", addr, got, want)
		}
	}
}
