package config

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/svcrelay/relay/internal/plan"
)

// TestLive pins the settings a reload can put in force: every other one
// needs a restart, and each has the field Reloaded keeps.
func TestLive(t *testing.T) {
	want := []string{"ingest-url", "alias-url", "analytics-url", "experiment-url", "scim-url", "feedback-url",
		"throttle-pause", "max-batch-events", "max-batch-bytes", "flush-interval", "max-event-age", "upstream-gzip",
		"admin-token-file", "credentials", "log-level", "log-format",
		"cors-origins", "allowed-api-keys", "client-rate-limit", "anonymize-ip", "tracking-plan", "tracking-plan-refresh",
		"spool-upstream-change", "max-lanes", "lane-retire-after", "max-lanes-per-key"}
	var got []string
	for _, o := range options(new(Config)) {
		if o.v == nil {
			t.Errorf("option %s has no field: a reload could not keep it", o.name)
		}
		if Live(o.name) {
			got = append(got, o.name)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("live settings %q, want %q", got, want)
	}
}

// TestReloaded: a reload puts the live settings in force with what Load
// derives from them (token, credentials, the allow-list's source), keeps
// the others and their Settings entries, and never adds a token to a relay
// started without one nor changes one given directly.
func TestReloaded(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	creds, err := os.ReadFile("testdata/credentials.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tok1, tok2 := file("tok1", "token-one\n"), file("tok2", "token-two\n")
	creds1, creds2 := file("creds1.yaml", string(creds)), file("creds2.yaml", string(creds))
	load := func(args ...string) Config {
		t.Helper()
		c, err := Load(args, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cur := load("--listen", "127.0.0.1:1001", "--trusted-proxies", "10.0.0.0/8", "--sync", "none",
		"--ingest-url", "http://a.example", "--alias-url", "http://x.example", "--max-batch-events", "10",
		"--admin-token-file", tok1, "--credentials", creds1, "--allowed-api-keys", "k1",
		"--client-rate-limit", "1", "--cors-origins", "https://a.example", "--tracking-plan", "off")
	next := load("--listen", "127.0.0.1:1002", "--trusted-proxies", "10.1.0.0/16",
		"--ingest-url", "http://b.example", "--alias-url", "http://y.example", "--max-batch-events", "20",
		"--admin-token-file", tok2, "--credentials", creds2, "--allowed-api-keys", "credentials",
		"--client-rate-limit", "2", "--cors-origins", "https://b.example", "--tracking-plan", "block")
	eff := Reloaded(cur, next)
	if eff.Listen != cur.Listen || !slices.Equal(eff.TrustedProxies, cur.TrustedProxies) || eff.Sync != cur.Sync {
		t.Errorf("needs-restart settings not kept: listen %s, trusted proxies %v, sync %s", eff.Listen, eff.TrustedProxies, eff.Sync)
	}
	if eff.IngestURL != next.IngestURL || eff.AliasURL != next.AliasURL || eff.MaxBatchEvents != 20 ||
		eff.ClientRateLimit != 2 || !slices.Equal(eff.CORSOrigins, next.CORSOrigins) || eff.TrackingPlan != plan.Block {
		t.Errorf("live settings not in force: %+v", eff)
	}
	if eff.AllowedAPIKeys != nil || !eff.AllowedKeysFromCredentials || eff.Credentials != creds2 || eff.Creds != next.Creds ||
		eff.AdminTokenFile != tok2 || !accepts(eff.Token, "token-two") {
		t.Errorf("derived settings: keys %q from credentials %v, credentials %s (%p, want %p), token file %s",
			eff.AllowedAPIKeys, eff.AllowedKeysFromCredentials, eff.Credentials, eff.Creds, next.Creds, eff.AdminTokenFile)
	}
	for _, c := range []struct{ name, want string }{{"listen", "127.0.0.1:1001"}, {"sync", "none"}, {"max-batch-events", "20"}, {"trusted-proxies", "10.0.0.0/8"}} {
		if i := slices.IndexFunc(eff.Settings, func(s Setting) bool { return s.Name == c.name }); eff.Settings[i].Value != c.want {
			t.Errorf("setting %s in force %q, want %q", c.name, eff.Settings[i].Value, c.want)
		}
	}

	for _, c := range []struct {
		what      string
		cur, next Config
		accepts   string // "": no token
	}{
		{"no token at start", load(), load("--admin-token-file", tok2), ""},
		{"token given directly", load("--admin-token", "token-one"), load("--admin-token", "token-two"), "token-one"},
		{"file, then directly", load("--admin-token-file", tok1), load("--admin-token", "token-two"), "token-one"},
		{"directly, then a file", load("--admin-token", "token-one"), load("--admin-token-file", tok2), "token-two"},
	} {
		eff := Reloaded(c.cur, c.next)
		if c.accepts == "" && eff.Token != nil || c.accepts != "" && !accepts(eff.Token, c.accepts) {
			t.Errorf("%s: token in force %v, want one accepting %q", c.what, eff.Token, c.accepts)
		}
	}
}

// TestReloadedUpstreamURLs: which changes of the upstream URLs a reload
// puts in force, and that the others are kept.
func TestReloadedUpstreamURLs(t *testing.T) {
	const in, x, y = "http://ingest", "http://x", "http://y"
	for i, c := range []struct {
		name     string
		old, new Config
		live     bool
	}{
		{"alias-url", Config{IngestURL: in, AliasURL: x}, Config{IngestURL: in, AliasURL: y}, true},
		{"alias-url", Config{IngestURL: in, AliasURL: x}, Config{IngestURL: in}, false},
		{"analytics-url", Config{IngestURL: in}, Config{IngestURL: in, AnalyticsURL: x}, false},
		{"analytics-url", Config{IngestURL: in, AnalyticsURL: x}, Config{IngestURL: in, AnalyticsURL: y}, true},
		{"scim-url", Config{IngestURL: in}, Config{IngestURL: in, ScimURL: x}, true},
		{"experiment-url", Config{IngestURL: in, ExperimentURL: x}, Config{ExperimentURL: y}, false},
		{"feedback-url", Config{}, Config{FeedbackURL: x}, false},
		{"ingest-url", Config{IngestURL: in}, Config{IngestURL: x}, true},
		{"ingest-url", Config{IngestURL: in}, Config{}, false},
	} {
		if got := LiveFrom(c.old, c.new, c.name); got != c.live {
			t.Errorf("case %d, %s: live %v, want %v", i, c.name, got, c.live)
		}
		eff := Reloaded(c.old, c.new)
		if urls := []string{eff.IngestURL + eff.AliasURL + eff.AnalyticsURL + eff.ExperimentURL + eff.ScimURL + eff.FeedbackURL,
			c.old.IngestURL + c.old.AliasURL + c.old.AnalyticsURL + c.old.ExperimentURL + c.old.ScimURL + c.old.FeedbackURL,
			c.new.IngestURL + c.new.AliasURL + c.new.AnalyticsURL + c.new.ExperimentURL + c.new.ScimURL + c.new.FeedbackURL}; urls[0] != urls[map[bool]int{false: 1, true: 2}[c.live]] {
			t.Errorf("case %d, %s: in force after the reload %q", i, c.name, urls[0])
		}
	}
}
