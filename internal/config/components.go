package config

import (
	"net/netip"

	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/ingest"
	"github.com/svcrelay/relay/internal/plan"
)

// DeliveryLive is the part of Delivery a reload puts in force.
func (c Config) DeliveryLive() delivery.Live {
	return delivery.Live{IngestURL: c.IngestURL, MaxBatchEvents: c.MaxBatchEvents, MaxBatchBytes: int(c.MaxBatchBytes),
		FlushInterval: c.FlushInterval, ThrottlePause: c.ThrottlePause, MaxEventAge: c.MaxEventAge, Gzip: c.UpstreamGzip}
}

// FormTiming is the form kinds' (group identify, user mappings) delivery
// timing.
func (c Config) FormTiming() delivery.FormTiming {
	return delivery.FormTiming{MaxAge: c.MaxEventAge, Gzip: c.UpstreamGzip}
}

// loopbackPeers are processes of this host (an app beside a sidecar relay,
// a local reverse proxy, a load test): the per-client connection bound is
// against remote clients.
var loopbackPeers = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// Ingest is the ingest listener's Config with the credentials file in
// force (the allow-list may be its projects'); TLS is the caller's.
func (c Config) Ingest(creds *credentials.Store) ingest.Config {
	return ingest.Config{
		MaxRequestBytes:         c.MaxRequestBytes,
		MaxBatchBytes:           int(c.MaxBatchBytes),
		TrustedProxies:          c.TrustedProxies,
		MaxConnections:          c.MaxConnections,
		MaxConnectionsPerClient: c.MaxConnectionsPerClient,
		UnboundedPeers:          loopbackPeers,
		Open:                    c.IngestOpen(creds),
	}
}

// IngestOpen is the ingest listener's access settings, which a reload puts
// in force; creds as for Ingest.
func (c Config) IngestOpen(creds *credentials.Store) ingest.Open {
	return ingest.Open{CORSOrigins: c.CORSOrigins, AllowedAPIKeys: c.IngestAllowedAPIKeys(creds),
		ClientRateLimit: c.ClientRateLimit, AnonymizeIP: c.AnonymizeIP}
}

// Plan is the tracking plan's Config; analytics is the --analytics-url in
// force (a reload may change it).
func (c Config) Plan(analytics *baseurl.Ref) plan.Config {
	return plan.Config{Default: c.TrackingPlan, Refresh: c.TrackingPlanRefresh, Dir: c.DataDir, AnalyticsURL: analytics}
}

// PlanLive is the part of Plan a reload puts in force.
func (c Config) PlanLive() plan.Live {
	return plan.Live{Default: c.TrackingPlan, Refresh: c.TrackingPlanRefresh}
}
