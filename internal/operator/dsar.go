package operator

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/svcrelay/relay/internal/backfill"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
)

// dsarCmd is `relay dsar`: it creates a data subject access request for
// one user (--user-id or --svc-id) and date range, polls its status
// (backing off from --poll-initial to --poll-max) until it is done (or
// failed: exit 1), and downloads every output into --out as
// dsar-ID-N.json.gz, following redirects with the organization's
// credentials. Each file is verified before it is kept (a complete gzip
// stream whose every line is a JSON object); its line count is printed.
// Files already in --out that verify are not downloaded again, so a run
// given --request-id resumes an earlier one. Addresses are used within
// their 2-day lifetime: past it the status is fetched again for fresh ones.
func dsarCmd(fs *flag.FlagSet, c *common, stdout io.Writer) work {
	org := fs.String("org", "", "organization of the credentials file (default: the organization of --project)")
	userID := fs.String("user-id", "", "the user's user_id (or give --svc-id)")
	svcID := fs.Int64("svc-id", 0, "the user's internal svc_id (or give --user-id)")
	start := fs.String("start", "", "first day, YYYY-MM-DD; required")
	end := fs.String("end", "", "last day, YYYY-MM-DD; required")
	out := fs.String("out", "", "directory for the output files; required (created if missing)")
	requestID := fs.Int64("request-id", 0, "poll and download an existing request instead of creating one")
	pollInitial := fs.Duration("poll-initial", 30*time.Second, "first wait between status polls")
	pollMax := fs.Duration("poll-max", 15*time.Minute, "longest wait between status polls")
	pollTime := fs.Duration("poll-time", 96*time.Hour, "give up polling after this long (jobs finish within 3 days)")
	return func(ctx context.Context, p *progress) error {
		req := forward.DSARRequest{UserID: *userID, SvcID: *svcID, StartDate: *start, EndDate: *end}
		if *userID != "" && *svcID != 0 {
			return Usagef("give --user-id or --svc-id, not both")
		}
		if err := req.Validate(); err != nil && *requestID == 0 {
			return Usagef("%v (flags --user-id/--svc-id, --start, --end)", err)
		}
		if err := required(fs, "out"); err != nil {
			return err
		}
		if *pollInitial <= 0 || *pollMax < *pollInitial {
			return Usagef("want 0 < --poll-initial <= --poll-max")
		}
		if err := c.load(false); err != nil {
			return err
		}
		var o *credentials.Organization
		switch {
		case *org != "":
			var ok bool
			if o, ok = c.store.Organization(*org); !ok {
				return Usagef("--org %q is not in %s", *org, c.credsPath)
			}
		case c.proj != nil && c.proj.Org() != nil:
			o = c.proj.Org()
		default:
			return Usagef("give --org, or a --project that an organization of the credentials file lists (DSAR needs the organization's key pair)")
		}
		base, err := c.base(o)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return err
		}
		d := &dsarRun{cl: c.newClient(credentials.BasicAuth(o.APIKey, o.SecretKey)), base: base, out: *out,
			p: p, stdout: stdout, pollInitial: *pollInitial, pollMax: *pollMax, pollTime: *pollTime}
		return d.run(ctx, req, *requestID)
	}
}

type dsarRun struct {
	cl                             *client
	base, out                      string
	p                              *progress
	stdout                         io.Writer
	pollInitial, pollMax, pollTime time.Duration
}

func (d *dsarRun) run(ctx context.Context, req forward.DSARRequest, id int64) error {
	if id == 0 {
		body, _ := json.Marshal(req)
		resp, err := d.cl.do(ctx, http.MethodPost, d.base+forward.DSARPath, body, false)
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
		var c forward.DSARCreated
		err = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&c)
		resp.Body.Close()
		if err != nil || c.RequestID == 0 {
			return fmt.Errorf("create: the answer holds no requestId (%v)", err)
		}
		id = c.RequestID
		d.p.logf("created DSAR request %d (run again with --request-id %d to resume)", id, id)
	}
	st, doneAt, err := d.poll(ctx, id)
	if err != nil {
		return err
	}
	d.p.logf("request %d is done: %d files", id, len(st.URLs))
	var total int64
	for n := range st.URLs {
		// Fetch fresh addresses when the ones we hold are about to expire.
		if time.Since(doneAt) > forward.DSARURLLifetime-time.Hour {
			if st, doneAt, err = d.poll(ctx, id); err != nil {
				return err
			}
			if n >= len(st.URLs) {
				return fmt.Errorf("request %d: the status now lists %d files, fewer than before", id, len(st.URLs))
			}
		}
		path := filepath.Join(d.out, fmt.Sprintf("dsar-%d-%d.json.gz", id, n))
		lines, err := verifyGzipJSONLines(path)
		if err == nil {
			d.p.logf("%s: already downloaded (%d lines)", path, lines)
		} else if lines, err = d.download(ctx, st.URLs[n], path); err != nil {
			return fmt.Errorf("file %d of %d: %w", n+1, len(st.URLs), err)
		}
		fmt.Fprintf(d.stdout, "%s\t%d lines\n", path, lines)
		total += lines
	}
	d.p.logf("request %d: %d files, %d events in %s", id, len(st.URLs), total, d.out)
	return nil
}

// poll polls the status until done (failed is an error), backing off.
func (d *dsarRun) poll(ctx context.Context, id int64) (forward.DSARStatus, time.Time, error) {
	bo := backoff.NewExponentialBackOff(backoff.WithInitialInterval(d.pollInitial), backoff.WithMaxInterval(d.pollMax),
		backoff.WithMaxElapsedTime(d.pollTime), backoff.WithMultiplier(1.5))
	url := d.base + forward.DSARPath + "/" + strconv.FormatInt(id, 10)
	for polls := 1; ; polls++ {
		resp, err := d.cl.do(ctx, http.MethodGet, url, nil, true)
		if err != nil {
			return forward.DSARStatus{}, time.Time{}, fmt.Errorf("status of request %d: %w", id, err)
		}
		var st forward.DSARStatus
		err = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st)
		resp.Body.Close()
		if err != nil {
			return st, time.Time{}, fmt.Errorf("status of request %d: %w", id, err)
		}
		switch st.Status {
		case forward.DSARDone:
			return st, time.Now(), nil
		case forward.DSARFailed:
			return st, time.Time{}, fmt.Errorf("request %d failed upstream (status %q): create a new one", id, st.Status)
		}
		wait := bo.NextBackOff()
		if wait == backoff.Stop {
			return st, time.Time{}, fmt.Errorf("request %d still %q after %v: run again with --request-id %d", id, st.Status, d.pollTime, id)
		}
		d.p.logf("request %d: %s (poll %d); next poll in %v", id, st.Status, polls, wait.Round(time.Millisecond))
		if err := backfill.Sleep(ctx, wait); err != nil {
			return st, time.Time{}, fmt.Errorf("interrupted: run again with --request-id %d: %w", id, err)
		}
	}
}

// download fetches one output into path (through path.tmp) and verifies it.
func (d *dsarRun) download(ctx context.Context, url, path string) (int64, error) {
	resp, err := d.cl.do(ctx, http.MethodGet, url, nil, true)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	name := filepath.Base(path)
	var n, lines int64
	// Not fsynced: a file that does not verify is downloaded again.
	err = backfill.WriteFile(path, 0o666, true, func(f *os.File) error {
		cr := &countingReader{r: resp.Body, on: func(n int64) { d.p.update("%s: %s", name, humanBytes(n)) }}
		var err error
		if n, err = io.Copy(f, cr); err != nil {
			return err
		}
		if lines, err = verifyGzipJSONLines(f.Name()); err != nil {
			return fmt.Errorf("%s does not verify: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	d.p.logf("%s: %s, %d lines, verified", path, humanBytes(n), lines)
	return lines, nil
}

// verifyGzipJSONLines reads the gzip file at path to its end (its CRC
// catches a cut download) and requires every non-blank line to be a JSON
// object; it returns the number of lines.
func verifyGzipJSONLines(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	var magic [2]byte
	_, err = io.ReadFull(f, magic[:])
	f.Close()
	if err != nil || magic != [2]byte{0x1f, 0x8b} {
		return 0, errors.New("not gzip")
	}
	var lines int64
	err = backfill.ReadLines(path, func(b []byte) error {
		lines++
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(b, &obj); err != nil {
			return fmt.Errorf("line %d is not a JSON object: %w", lines, err)
		}
		return nil
	})
	return lines, err
}
