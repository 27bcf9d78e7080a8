package config

import "testing"

// TestValidateBounds: each bound refuses its setting alone, with its
// message, when every other setting is valid.
func TestValidateBounds(t *testing.T) {
	for _, tt := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.MaxBatchEvents = 2000 }, "--max-batch-events 2000 is above 1999: the upstream takes fewer than 2000 events per request"},
		{func(c *Config) { c.MaxBatchEvents = 0 }, "--max-batch-events 0: want 1 to 1999"},
		{func(c *Config) { c.MaxBatchBytes = 0 }, "--max-batch-bytes 0: want a positive size"},
		{func(c *Config) { c.MaxRequestBytes = 0 }, "--max-request-bytes 0: want a positive size"},
		{func(c *Config) { c.SpoolMaxBytes = -1 }, "--spool-max-bytes must not be negative"},
		{func(c *Config) { c.SpoolMinFreeBytes = -1 }, "--spool-min-free-bytes must not be negative"},
		{func(c *Config) { c.ThrottlePause = 0 }, "--throttle-pause must be positive"},
		{func(c *Config) { c.FlushInterval = 0 }, "--flush-interval must be positive"},
		{func(c *Config) { c.MaxEventAge = 0 }, "--max-event-age must be positive"},
		{func(c *Config) { c.DrainTimeout = 0 }, "--drain-timeout must be positive"},
		{func(c *Config) { c.MaxLanes = -1 }, "--max-lanes must not be negative"},
		{func(c *Config) { c.LaneRetireAfter = -1 }, "--lane-retire-after must not be negative"},
		{func(c *Config) { c.MaxLanesPerKey = -1 }, "--max-lanes-per-key must not be negative"},
		{func(c *Config) { c.Sync = "x" }, `--sync "x": want always or none`},
		{func(c *Config) { c.SpoolUpstreamChange = "x" }, `--spool-upstream-change "x": want refuse or allow`},
		{func(c *Config) { c.LogLevel = "x" }, `--log-level "x": want debug, info, warn or error`},
		{func(c *Config) { c.LogFormat = "x" }, `--log-format "x": want json or console`},
		{func(c *Config) { c.MaxConnections = 0 }, "--max-connections 0: want a positive number"},
		{func(c *Config) { c.TLSCert = "c" }, "--tls-cert is set without tls-key: set both or neither"},
		{func(c *Config) { c.TLSKey = "k" }, "--tls-key is set without tls-cert: set both or neither"},
		{func(c *Config) { c.AdminTLSCert = "c" }, "--admin-tls-cert is set without admin-tls-key: set both or neither"},
		{func(c *Config) { c.AdminTLSKey = "k" }, "--admin-tls-key is set without admin-tls-cert: set both or neither"},
		{func(c *Config) { c.MaxConnectionsPerClient = -1 }, "--max-connections-per-client -1: want 0 (no bound) or a positive number"},
	} {
		c, err := Load(nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		tt.set(&c)
		if err := c.Validate(); err == nil || err.Error() != tt.want {
			t.Errorf("Validate: %v, want %s", err, tt.want)
		}
	}
}
