package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/fleet"
)

// fleetStore is fleet mode's store (--spool nats://...): the
// connection to the NATS JetStream cluster and the fleet on it. Every lane
// kind goes through it: events (ingest appends, delivery sends the
// events partitions this relay owns, dead letters and pauses are the
// fleet's), group identifies and user mappings (their intake appends, their
// lane runners deliver their kinds' partitions, dead letters are the fleet's).
type fleetStore struct {
	nc *nats.Conn
	f  *fleet.Fleet
	b  *fleet.Backend
}

// openFleetTimeout bounds connecting and creating or checking the streams.
const openFleetTimeout = 30 * time.Second

// openFleet connects to cfg's cluster and opens the fleet. Server URLs are
// never logged (they may hold a password).
func openFleet(cfg config.Config, log *zap.Logger, reg prometheus.Registerer) (*fleetStore, error) {
	nc, err := fleet.Dial(fleet.ConnConfig{Servers: cfg.SpoolNATS, Name: "relay", CredsFile: cfg.NATSCreds,
		TLSCAFile: cfg.NATSTLSCA, TLSCertFile: cfg.NATSTLSCert, TLSKeyFile: cfg.NATSTLSKey}, log.Named("nats"))
	if err != nil {
		return nil, fmt.Errorf("--spool nats://: connect: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), openFleetTimeout)
	defer cancel()
	f, err := fleet.Open(ctx, nc, fleet.Config{Partitions: cfg.SpoolPartitions, Streams: cfg.SpoolStreams}, log.Named("fleet"), reg)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("--spool nats://: open the fleet's streams: %w", err)
	}
	log.Info("fleet mode: events, group identifies and user mappings are spooled on the NATS JetStream cluster",
		zap.String("member", f.Name()), zap.Int("partitions", f.Partitions()), zap.Int("streams", f.Streams()))
	return &fleetStore{nc: nc, f: f, b: f.Backend()}, nil
}

// readyTimeout bounds /readyz's question to the cluster.
const readyTimeout = 800 * time.Millisecond

// ready is nil while the connection is up and the events stream has a
// quorum: without one every append would wait its publish time-out for a
// 503, so the relay must not say it is ready. A nil fleetStore (local
// mode) is always ready.
func (fs *fleetStore) ready() error {
	if fs == nil {
		return nil
	}
	if !fs.nc.IsConnected() {
		return errors.New("not connected to the NATS cluster (--spool)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := fs.f.Writable(ctx); err != nil {
		return fmt.Errorf("NATS cluster (--spool) cannot take appends: %w", err)
	}
	return nil
}

// close stops the fleet and closes the connection (after delivery stopped
// and gave its leases up).
func (fs *fleetStore) close(context.Context) error {
	err := fs.f.Close()
	fs.nc.Close()
	return err
}
