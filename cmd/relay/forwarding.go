package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/ratelimit"
	"github.com/svcrelay/relay/internal/usermap"
)

// forwardingRoutes builds the admin listener's forwarded upstream APIs from
// their tables on one Forwarder, so its connections and metrics exist once
// per process. taxLim is the taxonomy API's limiter, shared with the
// tracking plan's reads.
func forwardingRoutes(bases upstreamBases, creds *credentials.Ref, taxLim *ratelimit.Limiter, log *zap.Logger, reg prometheus.Registerer) ([]adminroute.Route, *forward.Forwarder, error) {
	fwd, err := forward.New(forward.Config{}, creds, log.Named("forward"), reg)
	if err != nil {
		return nil, nil, fmt.Errorf("forwarder: %w", err)
	}
	analytics := forward.APIConfig{URL: bases["analytics-url"]}
	routes, err := fwd.Routes(
		forward.Experiments(forward.APIConfig{URL: bases["experiment-url"]}),
		forward.SCIM(forward.APIConfig{URL: bases["scim-url"]}),
		forward.Classifiers(analytics),
		forward.Taxonomy(forward.APIConfig{URL: bases["analytics-url"], Limiter: taxLim}),
		forward.Feedback(forward.APIConfig{URL: bases["feedback-url"]}),
		forward.DSAR(analytics),
		forward.Deletion(analytics),
		forward.Export(analytics),
		usermap.ReadAPI(analytics),
	)
	return routes, fwd, err
}

// upstreamBases are the upstream bases of the flags by flag name
// (config.UpstreamURLs), one baseurl.Ref each, shared by all their readers:
// a reload stores the new ones (config.LiveFrom says when). The events
// lanes keep --ingest-url their own way (delivery.Live).
type upstreamBases map[string]*baseurl.Ref

// store puts c's bases in force (the ones c keeps from before a reload
// included: config.Reloaded); the first, before any reader, makes the Refs.
func (b upstreamBases) store(c config.Config) {
	for _, u := range c.UpstreamURLs() {
		if b[u.Name] == nil {
			b[u.Name] = new(baseurl.Ref)
		}
		b[u.Name].Store(*u.URL)
	}
}
