package config

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestSources: every setting says where its value came from, secrets and
// URL passwords are masked.
func TestSources(t *testing.T) {
	c, err := Load(
		[]string{"--config", "testdata/partial.yaml", "--sync", "always"},
		[]string{"RELAY_ADMIN_TOKEN=s3cret-token", "RELAY_INGEST_URL=https://user:pa55word@ingest.example.test"},
	)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"sync":             "flag --sync",
		"admin-token":      "variable RELAY_ADMIN_TOKEN",
		"listen":           "testdata/partial.yaml line 1",
		"max-batch-events": "testdata/partial.yaml line 3",
		"flush-interval":   "default",
	}
	for name, src := range want {
		if got := c.Source(name); got != src {
			t.Errorf("Source(%s) = %q, want %q", name, got, src)
		}
	}
	if len(c.Settings) != len(options(new(Config))) {
		t.Fatalf("%d settings, want one per option (%d)", len(c.Settings), len(options(new(Config))))
	}
	for _, s := range c.Settings {
		if strings.Contains(s.Value, "s3cret") || strings.Contains(s.Value, "pa55word") {
			t.Errorf("setting %s shows a secret: %q", s.Name, s.Value)
		}
		switch s.Name {
		case "admin-token":
			if s.Value != Masked {
				t.Errorf("admin-token = %q, want masked", s.Value)
			}
		case "ingest-url":
			if s.Value != "https://user:xxxxx@ingest.example.test" {
				t.Errorf("ingest-url = %q", s.Value)
			}
		}
	}
}

// TestErrorsNameTheirSource: a bad value's error names where it was set
// (flag, variable, or file and line) and never a flag that was not given.
func TestErrorsNameTheirSource(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"variable", nil, []string{"RELAY_MAX_BATCH_EVENTS=3000"}, "max-batch-events 3000 is above 1999: the upstream takes fewer than 2000 events per request (from variable RELAY_MAX_BATCH_EVENTS)"},
		{"variable parse", nil, []string{"RELAY_SYNC=maybe"}, `sync "maybe": want always or none (from variable RELAY_SYNC)`},
		{"file", []string{"--config", "testdata/batch_too_big.yaml"}, nil, "(from testdata/batch_too_big.yaml line 1)"},
		{"two sources", []string{"--listen", "127.0.0.1:9"}, []string{"RELAY_ADMIN_LISTEN=127.0.0.1:9"}, "listen and admin-listen are both 127.0.0.1:9 (from listen from flag --listen; admin-listen from variable RELAY_ADMIN_LISTEN)"},
		{"token file", nil, []string{"RELAY_ADMIN_TOKEN_FILE=testdata/nope.token"}, "(from variable RELAY_ADMIN_TOKEN_FILE)"},
		{"credentials by variable", nil, []string{"RELAY_CREDENTIALS=testdata/credentials.yaml"}, "(from variable RELAY_CREDENTIALS)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(tt.args, tt.env)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q\nwant it to contain %q", err, tt.want)
			}
			if len(tt.args) == 0 && strings.Contains(err.Error(), "--") {
				t.Fatalf("error %q names a flag, but none was given", err)
			}
		})
	}
}

// TestListenerErrorsNameTheirSource: the ingest listener's settings (issues
// 19 and 23, and the per-client connection bound) name where a bad value was
// set, like every other setting, and never a flag that was not given.
func TestListenerErrorsNameTheirSource(t *testing.T) {
	dir := t.TempDir()
	// file writes a settings file whose line 2 onwards are lines; line 1 is
	// a harmless setting, so that line numbers are checked.
	file := func(name string, lines ...string) string {
		p := filepath.Join(dir, name)
		body := "log-level: info\n" + strings.Join(lines, "\n") + "\n"
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	type tc struct {
		name string
		args []string
		env  []string
		want string // substring of the error
	}
	tests := []tc{
		{"max-connections flag", []string{"--max-connections", "0"}, nil, "--max-connections 0: want a positive number (from flag --max-connections)"},
		{"max-connections variable", nil, []string{"RELAY_MAX_CONNECTIONS=0"}, "max-connections 0: want a positive number (from variable RELAY_MAX_CONNECTIONS)"},
		{"max-connections not a number", nil, []string{"RELAY_MAX_CONNECTIONS=lots"}, `max-connections (from variable RELAY_MAX_CONNECTIONS): invalid number "lots"`},
		{"per-client variable", nil, []string{"RELAY_MAX_CONNECTIONS_PER_CLIENT=-1"}, "max-connections-per-client -1: want 0 (no bound) or a positive number (from variable RELAY_MAX_CONNECTIONS_PER_CLIENT)"},
		{"tls-cert variable", nil, []string{"RELAY_TLS_CERT=c.pem"}, "tls-cert is set without tls-key: set both or neither (from variable RELAY_TLS_CERT)"},
		{"tls-key flag", []string{"--tls-key", "k.pem"}, nil, "--tls-key is set without tls-cert: set both or neither (from flag --tls-key)"},
		{"admin-tls-key variable", nil, []string{"RELAY_ADMIN_TLS_KEY=k.pem"}, "admin-tls-key is set without admin-tls-cert: set both or neither (from variable RELAY_ADMIN_TLS_KEY)"},
		{"allow-list from credentials variable", nil, []string{"RELAY_ALLOWED_API_KEYS=credentials"}, `allowed-api-keys "credentials" needs the credentials setting: the file whose projects' api_keys are taken (from variable RELAY_ALLOWED_API_KEYS)`},
		{"allow-list from credentials flag", []string{"--allowed-api-keys", "credentials"}, nil, `--allowed-api-keys "credentials" needs the credentials setting`},
		{"cors-origins variable", nil, []string{"RELAY_CORS_ORIGINS=www.example.com"}, `cors-origins (from variable RELAY_CORS_ORIGINS): invalid origin "www.example.com"`},
		{"client-rate-limit variable", nil, []string{"RELAY_CLIENT_RATE_LIMIT=fast"}, "client-rate-limit (from variable RELAY_CLIENT_RATE_LIMIT): invalid rate"},
	}
	for _, f := range []struct {
		name  string
		lines []string
		want  string
	}{
		{"max-connections", []string{"max-connections: 0"}, "max-connections 0: want a positive number (from %s line 2)"},
		{"per-client", []string{"max-connections-per-client: -5"}, "max-connections-per-client -5: want 0 (no bound) or a positive number (from %s line 2)"},
		{"tls-cert", []string{"anonymize-ip: false", "tls-cert: c.pem"}, "tls-cert is set without tls-key: set both or neither (from %s line 3)"},
		{"admin-tls-key", []string{"admin-tls-key: k.pem"}, "admin-tls-key is set without admin-tls-cert: set both or neither (from %s line 2)"},
		{"allow-list from credentials", []string{"allowed-api-keys: credentials"}, `allowed-api-keys "credentials" needs the credentials setting: the file whose projects' api_keys are taken (from %s line 2)`},
		{"cors-origins", []string{"cors-origins:", "  - https://ok.example", "  - https://x.example/path"}, "cors-origins (from %s line 2): invalid origin"},
		{"cors-origins star", []string{"cors-origins: '*,https://x.example'"}, `cors-origins (from %s line 2): "*" allows every origin: give it alone`},
		{"anonymize-ip", []string{"anonymize-ip: maybe"}, `anonymize-ip (from %s line 2): invalid boolean "maybe"`},
	} {
		p := file(strings.ReplaceAll(f.name, " ", "_")+".yaml", f.lines...)
		tests = append(tests, tc{"file " + f.name, nil, []string{"RELAY_CONFIG=" + p}, fmt.Sprintf(f.want, p)})
	}
	flagRE := regexp.MustCompile(`--[a-z][a-z-]*`)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(tt.args, tt.env)
			if err == nil {
				t.Fatalf("accepted; want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q\nwant it to contain %q", err, tt.want)
			}
			for _, f := range flagRE.FindAllString(err.Error(), -1) {
				if !slices.Contains(tt.args, f) {
					t.Fatalf("error %q names %s, a flag not given", err, f)
				}
			}
		})
	}
}

// TestWarningsNameTheirSource: warnings about a setting say where it was
// set, as errors do.
func TestWarningsNameTheirSource(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"cors without allow-list, variable", nil, []string{"RELAY_CORS_ORIGINS=https://shop.example"},
			"cors-origins is set but allowed-api-keys is not: the ingest listener takes any api_key and forwards it to your upstream; set allowed-api-keys first (from variable RELAY_CORS_ORIGINS)"},
		{"cors without allow-list, flag", []string{"--cors-origins", "https://shop.example"}, nil,
			"--cors-origins is set but allowed-api-keys is not"},
		{"readable credentials, variable", nil, []string{"RELAY_CREDENTIALS=testdata/credentials.yaml", "RELAY_ADMIN_TOKEN=t"},
			"credentials testdata/credentials.yaml is readable by group or others: chmod 600 it (from variable RELAY_CREDENTIALS)"},
		{"readable token file, file", []string{"--config", "testdata/credentials_token_file.yaml"}, nil,
			"admin-token-file testdata/admin.token is readable by group or others: chmod 600 it (from testdata/credentials_token_file.yaml line 2)"},
	}
	flagRE := regexp.MustCompile(`--[a-z][a-z-]*`)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(tt.args, tt.env)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, w := range c.Warnings {
				found = found || strings.Contains(w, tt.want)
				for _, f := range flagRE.FindAllString(w, -1) {
					if !slices.Contains(tt.args, f) {
						t.Errorf("warning %q names %s, a flag not given", w, f)
					}
				}
			}
			if !found {
				t.Fatalf("warnings %q\nwant one containing %q", c.Warnings, tt.want)
			}
		})
	}
}
