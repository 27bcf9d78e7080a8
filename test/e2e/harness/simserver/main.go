// Command simserver is a test helper: the simulated upstream with fault
// injection (internal/simtest) in its own process, for the binary-level
// tests that inject faults over /sim/ (harness.StartFaultSim). It takes the
// flags of `relay sim` that those tests use. It is not part of the relay.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

func main() {
	fs := flag.NewFlagSet("simserver", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on")
	eps := fs.Int("eps-threshold", 0, "per-device and per-user events/s limit; 0 means 30")
	window := fs.Duration("rate-window", 0, "rate window; 0 means 10s")
	penalty := fs.Duration("throttle-penalty", 0, "penalty of a key named in a 429; 0 means 30s")
	lenient := fs.Bool("lenient-rate", false, "only ingested events count in the rate")
	partial := fs.Bool("partial-throttle", false, "a 429 or silenced 400 ingests the events it does not name")
	fs.String("log-format", "", "accepted for `relay sim` compatibility; ignored")
	fs.String("log-level", "", "accepted for `relay sim` compatibility; ignored")
	fs.Parse(os.Args[1:]) //nolint:errcheck // ExitOnError
	cfg := sim.Config{EPSThreshold: *eps, RateWindow: *window, ThrottlePenalty: *penalty, LenientRate: *lenient,
		PartialThrottle: *partial, PartialSilence: *partial}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "simserver:", err)
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "simserver:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	s := simtest.New(cfg, nil)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	select {
	case <-ctx.Done():
		s.Close() //nolint:errcheck // exiting
		<-done
	case err := <-done:
		if !errors.Is(err, simtest.ErrClosed) {
			fmt.Fprintln(os.Stderr, "simserver:", err)
			os.Exit(1)
		}
	}
}
