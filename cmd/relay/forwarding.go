package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/ratelimit"
	"github.com/svcrelay/relay/internal/usermap"
)

// forwardingRoutes builds the admin listener's forwarded upstream APIs
// (experiments, SCIM, channel classifiers, taxonomy, feedback, DSAR, user
// deletion, export, user mapping reads) from their tables, on one Forwarder, so its connections
// and metrics exist once per process. Every upstream base comes from the
// flags or the credentials file (read through creds at every request),
// never from a request.
// taxLim is the taxonomy API's limiter, shared with the tracking plan's reads.
func forwardingRoutes(cfg config.Config, creds *credentials.Ref, taxLim *ratelimit.Limiter, log *zap.Logger, reg prometheus.Registerer) ([]adminroute.Route, *forward.Forwarder, error) {
	fwd, err := forward.New(forward.Config{}, creds, log.Named("forward"), reg)
	if err != nil {
		return nil, nil, fmt.Errorf("forwarder: %w", err)
	}
	analytics := forward.APIConfig{URL: cfg.AnalyticsURL}
	routes, err := fwd.Routes(
		forward.Experiments(forward.APIConfig{URL: cfg.ExperimentURL}),
		forward.SCIM(forward.APIConfig{URL: cfg.ScimURL}),
		forward.Classifiers(analytics),
		forward.Taxonomy(forward.APIConfig{URL: cfg.AnalyticsURL, Limiter: taxLim}),
		forward.Feedback(forward.APIConfig{URL: cfg.FeedbackURL}),
		forward.DSAR(analytics),
		forward.Deletion(analytics),
		forward.Export(analytics),
		usermap.ReadAPI(analytics),
	)
	if err != nil {
		return nil, nil, err
	}
	return routes, fwd, nil
}
