package main

import (
	"context"
	"flag"
	"io"
	"net"

	"github.com/svcrelay/relay/internal/operator"
	"github.com/svcrelay/relay/internal/sim"
	"go.uber.org/zap"
)

// runSim serves the simulated upstream until a signal.
func runSim(ctx context.Context, resetSignals func(), args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("relay sim", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8090", "address to serve the simulated upstream on")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	format := fs.String("log-format", "", "json or console; empty: console on a terminal")
	eps := fs.Int("eps-threshold", 0, "per-device and per-user events/s limit before 429; 0 means the upstream's 30")
	// Readings of the document (internal/sim's doc); the defaults are strict.
	window := fs.Duration("rate-window", 0, "window the rate is averaged over; 0 means 10s")
	penalty := fs.Duration("throttle-penalty", 0, "how long a key named in a 429 stays refused; 0 means 30s")
	lenient := fs.Bool("lenient-rate", false, "count only ingested events in the rate (the request's own events do not count)")
	partial := fs.Bool("partial-throttle", false, "a 429 or silenced 400 ingests the events it does not name")
	return operator.Run("sim", fs, args, stderr, false, func() error {
		log, _, _, err := newLeveledLogger(*level, *format, stderr)
		if err != nil {
			return operator.UsageError{Err: err}
		}
		defer log.Sync() //nolint:errcheck
		scfg := sim.Config{EPSThreshold: *eps, RateWindow: *window, ThrottlePenalty: *penalty, LenientRate: *lenient,
			PartialThrottle: *partial, PartialSilence: *partial}
		if err := scfg.Validate(); err != nil {
			return operator.UsageError{Err: err}
		}
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return err
		}
		s := sim.New(scfg, log)
		done := make(chan error, 1)
		go func() { done <- s.Serve(ln) }()
		log.Info("simulated upstream serving", zap.String("addr", ln.Addr().String()),
			zap.String("read_out", "http://"+ln.Addr().String()+"/sim/events"))
		select {
		case <-ctx.Done():
			resetSignals()
		case err := <-done:
			log.Error("simulated upstream failed", errField(err))
			return operator.ErrFailed
		}
		if err := s.Close(); err != nil {
			log.Error("close", errField(err))
			return operator.ErrFailed
		}
		<-done
		log.Info("simulated upstream stopped")
		return nil
	})
}
