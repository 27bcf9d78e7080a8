package operator

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/svcrelay/relay/internal/backfill"
	"github.com/svcrelay/relay/internal/credentials"
)

// sendFlags are the flags of backfill and migrate that say where and how
// events are sent.
type sendFlags struct {
	ingestURL string
	dataDir   string
	maxEPS    int
	deviceEPS int
	batch     bool
	report    string
	sync      string
}

func newSendFlags(fs *flag.FlagSet) *sendFlags {
	s := &sendFlags{}
	fs.StringVar(&s.ingestURL, "ingest-url", "", "upstream base of /2/httpapi (a project's ingest_url in --credentials overrides it)")
	fs.StringVar(&s.dataDir, "data-dir", "", "directory of the backfill's spool, state and report; required (the same one resumes)")
	fs.IntVar(&s.maxEPS, "max-eps", backfill.DefaultMaxEPS, "events per second for the project, at most (the documented plans: 1000 to 50000)")
	fs.IntVar(&s.deviceEPS, "device-eps", backfill.DefaultDeviceEPS, "the upstream's per-device and per-user events/s limit, until a 429 names its own")
	fs.BoolVar(&s.batch, "batch", false, "send to the /batch endpoint instead of /2/httpapi")
	fs.StringVar(&s.report, "report", "", "file the dead letters are written to at the end (default DATA-DIR/backfill-report.jsonl)")
	fs.StringVar(&s.sync, "sync", "always", "always: fsync the spool and state before moving on; none: survive a crash of the process, not of the machine")
	return s
}

func (s *sendFlags) config(apiKey, ingestURL string, files []string) (backfill.Config, error) {
	switch {
	case s.dataDir == "":
		return backfill.Config{}, Usagef("--data-dir is required")
	case ingestURL == "":
		return backfill.Config{}, Usagef("--ingest-url is required")
	case s.maxEPS < 1 || s.deviceEPS < 1:
		return backfill.Config{}, Usagef("--max-eps and --device-eps must be at least 1")
	case s.sync != "always" && s.sync != "none":
		return backfill.Config{}, Usagef("--sync must be always or none")
	}
	return backfill.Config{
		IngestURL: strings.TrimRight(ingestURL, "/"), APIKey: apiKey, Dir: s.dataDir, Files: files,
		MaxEPS: s.maxEPS, DeviceEPS: s.deviceEPS, Batch: s.batch, Report: s.report, NoSync: s.sync == "none",
	}, nil
}

// backfillCmd is `relay backfill`: it delivers the events of its input
// files (JSON lines of events or envelopes, or what `relay export` writes)
// to the project, paced, through a spool in --data-dir; the same command
// again resumes (see internal/backfill).
func backfillCmd(fs *flag.FlagSet, c *common, stdout io.Writer) work {
	s := newSendFlags(fs)
	apiKey := fs.String("api-key", "", "the project's api_key, or the name of a project of --credentials; required")
	return func(ctx context.Context, p *progress) error {
		files := fs.Args()
		if *apiKey == "" {
			return Usagef("--api-key is required")
		}
		if len(files) == 0 {
			return Usagef("no input file: relay backfill [flags] FILE...")
		}
		key, url := *apiKey, s.ingestURL
		if c.credsPath != "" {
			if err := c.load(false); err != nil {
				return err
			}
			if proj, ok := c.store.Project(*apiKey); ok {
				key, url = proj.APIKey.Reveal(), proj.URL(credentials.KindIngest, s.ingestURL)
			}
		}
		cfg, err := s.config(key, url, files)
		if err != nil {
			return err
		}
		return runBackfill(ctx, cfg, p, stdout)
	}
}

// runBackfill runs a backfill with its progress on p and its summary on
// stdout.
func runBackfill(ctx context.Context, cfg backfill.Config, p *progress, stdout io.Writer) error {
	var lastLog time.Time
	cfg.Progress = func(c backfill.Counts) {
		line := progressLine(c)
		if p.tty {
			p.update("%s", line)
		} else if time.Since(lastLog) >= 5*time.Second {
			lastLog = time.Now()
			p.logf("%s", line)
		}
	}
	c, err := backfill.Run(ctx, cfg, nil)
	p.done()
	fmt.Fprintln(stdout, summary(c, cfg))
	if errors.Is(err, backfill.ErrInterrupted) {
		return fmt.Errorf("interrupted with %d events waiting in %s: run the same command again to resume", c.Waiting, cfg.Dir)
	}
	return err
}

// progressLine is the one line of a backfill's progress.
func progressLine(c backfill.Counts) string {
	eps := float64(c.Delivered) / max(c.Elapsed.Seconds(), 0.001)
	eta := "?"
	switch {
	case c.ReadDone && c.Waiting == 0:
		eta = "0s"
	case eps > 0:
		left := float64(c.Waiting)
		if !c.ReadDone && c.BytesRead > 0 && c.BytesTotal > c.BytesRead {
			// What is still unread, at the events per byte read so far.
			left += float64(c.Read) * float64(c.BytesTotal-c.BytesRead) / float64(c.BytesRead)
		}
		eta = (time.Duration(left/eps) * time.Second).String()
	}
	return fmt.Sprintf("read %d (%.0f%%), sent %d, acknowledged %d, dead %d, %.0f events/s, 429s %d, ETA %s",
		c.Read, 100*float64(c.BytesRead)/float64(max(c.BytesTotal, 1)), c.Sent, c.Delivered, c.Dead, eps, c.Throttled, eta)
}

// summary is the line printed at the end.
func summary(c backfill.Counts, cfg backfill.Config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "backfill: %d events read, %d waiting, %d dead letters", c.Read, c.Waiting, c.Dead)
	if c.Dead > 0 {
		fmt.Fprintf(&b, " (listed in %s)", cfg.ReportPath())
	}
	fmt.Fprintf(&b, "; this run: %d events sent in %d requests, %d acknowledged, %d answered 429 (%.1f per million events sent), %v, %.0f events/s",
		c.Sent, c.Requests, c.Delivered, c.Throttled, float64(c.Throttled)*1e6/float64(max(c.Sent, 1)), c.Elapsed.Round(time.Millisecond),
		float64(c.Delivered)/max(c.Elapsed.Seconds(), 0.001))
	if len(c.Dropped) > 0 {
		fmt.Fprintf(&b, "; exported fields ingestion does not take, dropped: %s", c.DroppedSummary())
	}
	return b.String()
}

// migrateCmd is `relay migrate`: an export of --from-project into
// DATA-DIR/export.zip (relay export's resumable run), then a backfill of it
// into --to-project with the spool in DATA-DIR. Run again, it resumes at
// whichever step it stopped.
func migrateCmd(fs *flag.FlagSet, c *common, stdout io.Writer) work {
	s := newSendFlags(fs)
	from := fs.String("from-project", "", "project of --credentials to export; required")
	to := fs.String("to-project", "", "project of --credentials to import into; required")
	start := fs.String("start", "", "first hour, YYYYMMDDTHH (UTC); required")
	end := fs.String("end", "", "last hour included, YYYYMMDDTHH (UTC); required")
	pieceHours := fs.Int("piece-hours", 24, "hours per export request (1 to 8760)")
	return func(ctx context.Context, p *progress) error {
		if err := required(fs, "from-project", "to-project", "data-dir"); err != nil {
			return err
		}
		if *from == *to {
			return Usagef("--from-project and --to-project are the same project")
		}
		if err := c.load(false); err != nil {
			return err
		}
		dst, ok := c.store.Project(*to)
		if !ok {
			return Usagef("--to-project %q is not in %s", *to, c.credsPath)
		}
		c.project = *from
		out := filepath.Join(s.dataDir, "export.zip")
		cfg, err := s.config(dst.APIKey.Reveal(), dst.URL(credentials.KindIngest, s.ingestURL), []string{out})
		if err != nil {
			return err
		}
		if err := os.MkdirAll(s.dataDir, 0o755); err != nil {
			return err
		}
		if _, err := os.Stat(out); errors.Is(err, os.ErrNotExist) {
			p.logf("step 1 of 2: export of %s, %s to %s, into %s", *from, *start, *end, out)
			if err := runExport(ctx, c, p, stdout, *start, *end, out, *pieceHours, false); err != nil {
				return fmt.Errorf("export: %w", err)
			}
		} else {
			p.logf("step 1 of 2: export done already (%s)", out)
		}
		p.logf("step 2 of 2: backfill into %s", *to)
		return runBackfill(ctx, cfg, p, stdout)
	}
}
