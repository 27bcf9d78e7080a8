package config

import (
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
	if len(c.Settings) != len(options) {
		t.Fatalf("%d settings, want one per option (%d)", len(c.Settings), len(options))
	}
	for _, s := range c.Settings {
		if strings.Contains(s.Value, "s3cret") || strings.Contains(s.Value, "pa55word") {
			t.Errorf("setting %s shows a secret: %q", s.Name, s.Value)
		}
		switch s.Name {
		case "admin-token":
			if s.Value != Masked || !s.Secret {
				t.Errorf("admin-token = %q secret=%v, want masked", s.Value, s.Secret)
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
