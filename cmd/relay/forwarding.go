package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/classifiers"
	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/deletion"
	"github.com/svcrelay/relay/internal/dsar"
	"github.com/svcrelay/relay/internal/experiments"
	"github.com/svcrelay/relay/internal/export"
	"github.com/svcrelay/relay/internal/feedback"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/scim"
	"github.com/svcrelay/relay/internal/taxonomy"
	"go.uber.org/zap"
)

// forwardingRoutes builds the admin listener's forwarded upstream APIs
// (experiments, SCIM, channel classifiers, taxonomy, feedback, DSAR, user
// deletion, export). They share one
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
	fb, err := feedback.New(feedback.Config{URL: cfg.FeedbackURL}, cfg.Creds, fwd, log.Named("feedback"), reg)
	if err != nil {
		return nil, fmt.Errorf("feedback: %w", err)
	}
	routes = append(routes, fb.Routes()...)
	ds, err := dsar.New(dsar.Config{URL: cfg.AnalyticsURL}, cfg.Creds, fwd, log.Named("dsar"), reg)
	if err != nil {
		return nil, fmt.Errorf("dsar: %w", err)
	}
	routes = append(routes, ds.Routes()...)
	de, err := deletion.New(deletion.Config{URL: cfg.AnalyticsURL}, cfg.Creds, fwd, log.Named("deletion"), reg)
	if err != nil {
		return nil, fmt.Errorf("deletion: %w", err)
	}
	routes = append(routes, de.Routes()...)
	xp, err := export.New(export.Config{URL: cfg.AnalyticsURL}, cfg.Creds, fwd, log.Named("export"), reg)
	if err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	routes = append(routes, xp.Routes()...)
	return routes, nil
}
