// Command relay is the event-ingestion relay: it accepts events over the
// upstream's HTTP V2 API, keeps them in a bbolt spool, and delivers them
// upstream. Its subcommands are listed by usage (relay help); see README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/operator"
)

func main() {
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

const exitOK, exitFailure, exitUsage = operator.ExitOK, operator.ExitFailure, operator.ExitUsage

// run dispatches on the subcommand and returns the exit code.
func run(args, environ []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	if len(args) > 0 {
		switch args[0] {
		case "serve":
			args = args[1:]
		case "sim":
			return runSim(ctx, stop, args[1:], stderr)
		case "spool":
			return runSpool(ctx, args[1:], environ, stdout, stderr)
		case "version", "--version", "-version":
			fmt.Fprintln(stdout, versionString())
			return exitOK
		case "config":
			return runConfig(args[1:], environ, stdout, stderr)
		case "tap":
			return runTap(ctx, args[1:], environ, stdout, stderr)
		case "export", "dsar", "delete-users", "feedback", "backfill", "migrate":
			return operator.Main(ctx, args[0], args[1:], stdout, stderr)
		case "help":
			usage(stderr)
			return exitOK
		}
	}

	cfg, err := config.Load(args, environ)
	if errors.Is(err, config.ErrHelp) {
		usage(stderr)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "relay: %v\n", err)
		return exitUsage
	}
	log, level, setFormat, err := newLeveledLogger(cfg.LogLevel, cfg.LogFormat, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "relay: %v\n", err)
		return exitUsage
	}
	defer log.Sync() //nolint:errcheck // nothing to do about a failed flush at exit

	if limit, ok := defaultMemoryLimit(environ); ok {
		debug.SetMemoryLimit(limit)
	}
	if n, ok := defaultMaxProcs(environ, runtime.GOMAXPROCS(0), runtime.NumCPU()); ok {
		runtime.GOMAXPROCS(n)
	}
	// A reload (SIGHUP, POST /relay/v1/reload) reads the same flags and
	// the environment again.
	load := func() (config.Config, error) { return config.Load(args, os.Environ()) }
	if err := serveWith(ctx, stop, cfg, log, serveHooks{load: load, level: &level, format: setFormat}); err != nil {
		log.Error("relay stopped with an error", errField(err))
		return exitFailure
	}
	return exitOK
}

// defaultMaxProcs returns one P more than the CPUs (cpus+1) and true,
// unless environ sets GOMAXPROCS or procs (the runtime's default) is not
// cpus: below, a cgroup CPU limit set it (one more P would be throttled);
// above, it was raised already. Why: under --sync always the WAL writer
// returns from each fsync needing a P, and at peak every other one is busy
// parsing; the spare one took 4-5% more events/s on two CPUs and adds no
// CPU time (README "CPU", bench/RESULTS.md).
func defaultMaxProcs(environ []string, procs, cpus int) (int, bool) {
	if envValue(environ, "GOMAXPROCS") != "" || procs != cpus {
		return 0, false
	}
	return cpus + 1, true
}

// DefaultMemoryLimit is the soft memory limit (runtime/debug.SetMemoryLimit)
// the relay sets when the environment has no GOMEMLIMIT: without one the Go
// heap grows to twice the live data and keeps a spike as RSS. 120 MiB holds
// peak load (live heap ~80-90 MB) for 5-10% more CPU per event, leaving
// room for the spool file's mapped pages under the 150 MB target; less
// starves the GC (96 MiB cut events/s by 40%). Heavier loads set
// GOMEMLIMIT (README "Memory", bench/RESULTS.md).
const DefaultMemoryLimit = 120 << 20

// defaultMemoryLimit returns DefaultMemoryLimit and true unless environ sets
// GOMEMLIMIT (also to "off"): the runtime has applied that one itself.
func defaultMemoryLimit(environ []string) (int64, bool) {
	if envValue(environ, "GOMEMLIMIT") != "" {
		return 0, false
	}
	return DefaultMemoryLimit, true
}

// envValue is the last non-empty value of the variable name in environ
// (os.Environ's form, "KEY=value"), or "" when it has none.
func envValue(environ []string, name string) string {
	val := ""
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, name+"="); ok && v != "" {
			val = v
		}
	}
	return val
}

func usage(w io.Writer) {
	fmt.Fprint(w, `relay: event-ingestion relay

usage:
  relay [serve] [flags]            serve (no --ingest-url: sandbox mode with a built-in simulated upstream)
  relay sim --listen ADDR          serve the simulated upstream alone
  relay spool dump --data-dir DIR  print every live spool record as a JSON line (relay must be stopped)
  relay spool verify --data-dir DIR
                                   check every record and checksum of a stopped relay's spool (exit 1 on damage)
  relay spool salvage --data-dir DIR --out FILE
                                   write every readable record of a (damaged) spool as JSON lines
  relay spool import --data-dir DIR FILE
                                   append the records of a salvage file to a (fresh) spool
  relay version, relay --version   print the build's version
  relay config check [flags]       validate the settings and credentials without serving; print them, secrets masked
  relay tap --admin URL [--token-file F] [--project P | --api-key-hash H] [--event-type T] [--device D]
            [--sample N] [--limit N] [--duration D] [--where ingest|delivered|dead] [--mask]
                                   print live events of a running relay as JSON lines
  relay export --credentials F --project P --analytics-url U --start YYYYMMDDTHH --end YYYYMMDDTHH --out FILE [--jsonl]
  relay dsar --credentials F --project P (--user-id U | --svc-id N) --start YYYY-MM-DD --end YYYY-MM-DD --out DIR
  relay delete-users --credentials F --project P --ids-file F --requester R [--dry-run] [--ignore-invalid-id]
  relay feedback --credentials F --project P --feedback-url U --source S --file items.jsonl
  relay backfill --ingest-url URL --api-key KEY --data-dir DIR [--max-eps N] [--batch] FILE...
  relay migrate --credentials F --from-project A --to-project B --start YYYYMMDDTHH --end YYYYMMDDTHH --data-dir DIR
                                   operator commands: talk to the upstream directly (relay CMD --help)

Every flag can be set as RELAY_<NAME> in the environment or as <name>: in the
--config YAML file; a flag beats the variable, the variable beats the file.

`)
	config.Usage(w)
}
