package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/classifiers"
	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/experiments"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/scim"
	"github.com/svcrelay/relay/internal/taxonomy"
	"go.uber.org/zap"
)

// forwardingRoutes builds the admin listener's forwarded upstream APIs
// (experiments, SCIM, channel classifiers, taxonomy). They share one
// Forwarder, so its connections and metrics exist once per process. Every
// upstream base comes from the flags or the credentials file, never from a
// request.
func forwardingRoutes(cfg config.Config, log *zap.Logger, reg prometheus.Registerer) ([]adminroute.Route, error) {
	fwd, err := forward.New(forward.Config{}, log.Named("forward"), reg)
	if err != nil {
		return nil, fmt.Errorf("forwarder: %w", err)
	}
	var routes []adminroute.Route
	ex, err := experiments.New(experiments.Config{URL: cfg.ExperimentURL}, cfg.Creds, fwd, log.Named("experiments"), reg)
	if err != nil {
		return nil, fmt.Errorf("experiments: %w", err)
	}
	routes = append(routes, ex.Routes()...)
	sc, err := scim.New(scim.Config{URL: cfg.ScimURL}, cfg.Creds, fwd, log.Named("scim"), reg)
	if err != nil {
		return nil, fmt.Errorf("scim: %w", err)
	}
	routes = append(routes, sc.Routes()...)
	cl, err := classifiers.New(classifiers.Config{URL: cfg.AnalyticsURL}, cfg.Creds, fwd, log.Named("classifiers"), reg)
	if err != nil {
		return nil, fmt.Errorf("classifiers: %w", err)
	}
	routes = append(routes, cl.Routes()...)
	tx, err := taxonomy.New(taxonomy.Config{URL: cfg.AnalyticsURL}, cfg.Creds, fwd, log.Named("taxonomy"), reg)
	if err != nil {
		return nil, fmt.Errorf("taxonomy: %w", err)
	}
	routes = append(routes, tx.Routes()...)
	return routes, nil
}
