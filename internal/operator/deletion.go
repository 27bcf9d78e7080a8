package operator

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/svcrelay/relay/internal/backfill"
	"github.com/svcrelay/relay/internal/forward"
)

// deleteUsersCmd is `relay delete-users`: it schedules the deletion of the
// users listed in --ids-file (one id a line; blank lines and lines starting
// with '#' are skipped; "svc_id:N" and "user_id:U" name the kind, other
// lines are of --ids-kind), in requests of at most 100 ids, at most one
// request per second. It reports the ids the upstream finds invalid (with
// --ignore-invalid-id from the answers; without, a request holding one is
// refused as a whole and its invalid ids are listed), then lists the
// scheduled jobs over the days concerned (GET from today to the latest job
// day, at least today + 30 days, at most six months). --dry-run prints the
// requests without sending anything. Exit 1 when any request failed.
func deleteUsersCmd(fs *flag.FlagSet, c *common, stdout io.Writer) work {
	idsFile := fs.String("ids-file", "", "file of ids to delete, one a line; required")
	kind := fs.String("ids-kind", "user", "kind of the lines without a prefix: user (user_id) or svc (svc_id)")
	requester := fs.String("requester", "", "who asks, for the audit trail; required")
	dryRun := fs.Bool("dry-run", false, "print the requests, send nothing")
	ignoreInvalid := fs.Bool("ignore-invalid-id", false, "schedule the users found even when others of a request are not")
	fromOrg := fs.Bool("delete-from-org", false, "delete from every project of the organization that has data of the users")
	mapped := fs.Bool("include-mapped-user-ids", false, "ask the answers to name the user_id of each svc_id")
	return func(ctx context.Context, p *progress) error {
		if err := required(fs, "ids-file", "requester"); err != nil {
			return err
		}
		if *kind != "user" && *kind != "svc" {
			return Usagef("--ids-kind is user or svc")
		}
		ids, bad, err := readIDs(*idsFile, *kind)
		if err != nil {
			return UsageError{err}
		}
		for _, b := range bad {
			p.logf("invalid id (not sent): %s", b)
		}
		if len(ids) == 0 {
			return errors.New("no valid id in --ids-file")
		}
		chunks := chunkIDs(ids, *requester, *ignoreInvalid, *fromOrg, *mapped)
		if *dryRun {
			for i, ch := range chunks {
				b, _ := json.Marshal(ch)
				fmt.Fprintf(stdout, "request %d of %d: %d svc_ids, %d user_ids: POST %s %s\n", i+1, len(chunks),
					len(ch.SvcIDs), len(ch.UserIDs), forward.DeletionPath, b)
			}
			p.logf("dry run: %d ids in %d requests, nothing sent", len(ids), len(chunks))
			return nil
		}
		cl, base, err := c.projectClient()
		if err != nil {
			return err
		}
		var last time.Time
		failed, scheduled := 0, 0
		var invalid []string
		latest := ""
		for i, ch := range chunks {
			if wait := time.Until(last.Add(forward.DeletionPostInterval)); wait > 0 {
				p.update("request %d of %d: waiting %v (1 request per second)", i+1, len(chunks), wait.Round(time.Millisecond))
				if err := backfill.Sleep(ctx, wait); err != nil {
					return fmt.Errorf("interrupted after %d of %d requests: %w", i, len(chunks), err)
				}
			}
			body, _ := json.Marshal(ch)
			resp, err := cl.do(ctx, http.MethodPost, base+forward.DeletionPath, body, true, http.StatusBadRequest)
			last = time.Now()
			if err != nil {
				return fmt.Errorf("request %d of %d: %w", i+1, len(chunks), err)
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if resp.StatusCode == http.StatusBadRequest {
				failed++
				var e struct {
					Error      string            `json:"error"`
					InvalidIDs []json.RawMessage `json:"invalid_ids"`
				}
				json.Unmarshal(b, &e)
				p.logf("request %d of %d refused (400, nothing of it scheduled): %s", i+1, len(chunks), strings.TrimSpace(string(b)))
				for _, id := range e.InvalidIDs {
					invalid = append(invalid, idText(id))
				}
				continue
			}
			var job forward.DeletionJob
			if err := json.Unmarshal(b, &job); err != nil {
				return fmt.Errorf("request %d of %d: answer is not a deletion job: %v", i+1, len(chunks), err)
			}
			scheduled += len(job.SvcIDs)
			for _, id := range job.InvalidIDs {
				invalid = append(invalid, idText(id))
			}
			latest = max(latest, job.Day)
			p.logf("request %d of %d: %d users scheduled in the job of %s (%s), %d invalid ids", i+1, len(chunks),
				len(job.SvcIDs), job.Day, job.Status, len(job.InvalidIDs))
		}
		p.done()
		for _, id := range invalid {
			fmt.Fprintf(stdout, "invalid\t%s\n", id)
		}
		if len(invalid) > 0 && !*ignoreInvalid && !*fromOrg {
			p.logf("%d ids have no data in the project; their requests were refused as a whole: remove them or use --ignore-invalid-id", len(invalid))
		}
		if err := listJobs(ctx, cl, base, latest, stdout); err != nil {
			return err
		}
		p.logf("%d ids sent in %d requests: %d users scheduled, %d invalid, %d requests refused", len(ids), len(chunks), scheduled, len(invalid), failed)
		if failed > 0 {
			return ErrFailed
		}
		return nil
	}
}

// delID is one id of the file.
type delID struct {
	svc  int64
	user string
}

// readIDs reads the ids file; bad lists lines that cannot be sent.
func readIDs(path, kind string) (ids []delID, bad []string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	seen := make(map[delID]bool)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v := kind, line
		if rest, ok := strings.CutPrefix(line, "svc_id:"); ok {
			k, v = "svc", strings.TrimSpace(rest)
		} else if rest, ok := strings.CutPrefix(line, "user_id:"); ok {
			k, v = "user", strings.TrimSpace(rest)
		}
		var id delID
		if k == "svc" {
			x, err := strconv.ParseInt(v, 10, 64)
			if err != nil || x <= 0 {
				bad = append(bad, fmt.Sprintf("line %d: svc_id %q is not a positive integer", n, v))
				continue
			}
			id.svc = x
		} else {
			if v == "" {
				bad = append(bad, fmt.Sprintf("line %d: empty user_id", n))
				continue
			}
			id.user = v
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		ids = append(ids, id)
	}
	return ids, bad, sc.Err()
}

// chunkIDs cuts ids into requests of at most forward.DeletionMaxIDs ids.
func chunkIDs(ids []delID, requester string, ignore, fromOrg, mapped bool) []forward.DeletionRequest {
	var out []forward.DeletionRequest
	for len(ids) > 0 {
		n := min(len(ids), forward.DeletionMaxIDs)
		r := forward.DeletionRequest{Requester: requester, IgnoreInvalidID: ignore, DeleteFromOrg: fromOrg, IncludeMappedUserIDs: mapped}
		for _, id := range ids[:n] {
			if id.user != "" {
				r.UserIDs = append(r.UserIDs, id.user)
			} else {
				r.SvcIDs = append(r.SvcIDs, id.svc)
			}
		}
		out = append(out, r)
		ids = ids[n:]
	}
	return out
}

// listJobs prints the jobs scheduled from today to latest (at least today +
// forward.DeletionQueryDays, at most six months).
func listJobs(ctx context.Context, cl *client, base, latest string, stdout io.Writer) error {
	today := time.Now().UTC().Truncate(24 * time.Hour)
	end := today.AddDate(0, 0, forward.DeletionQueryDays)
	if l, err := time.Parse(time.DateOnly, latest); err == nil && l.After(end) {
		end = l
	}
	if lim := today.AddDate(0, forward.DeletionMaxQueryMonths, 0); end.After(lim) {
		end = lim
	}
	q := url.Values{"start_day": {today.Format(time.DateOnly)}, "end_day": {end.Format(time.DateOnly)}}
	resp, err := cl.do(ctx, http.MethodGet, base+forward.DeletionPath+"?"+q.Encode(), nil, true)
	if err != nil {
		return fmt.Errorf("list jobs: %w", err)
	}
	defer resp.Body.Close()
	var jobs []forward.DeletionJob
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&jobs); err != nil {
		return fmt.Errorf("list jobs: %w", err)
	}
	sort.Slice(jobs, func(i, j int) bool { return jobs[i].Day < jobs[j].Day })
	if len(jobs) == 0 {
		fmt.Fprintf(stdout, "no deletion job scheduled from %s to %s\n", q.Get("start_day"), q.Get("end_day"))
	}
	for _, j := range jobs {
		fmt.Fprintf(stdout, "job\t%s\t%s\t%d users", j.Day, j.Status, len(j.SvcIDs))
		if len(j.App) > 0 {
			fmt.Fprintf(stdout, "\tapp %s", j.App)
		}
		if j.ActiveScrubDoneDate != "" {
			fmt.Fprintf(stdout, "\tscrubbed %s", j.ActiveScrubDoneDate)
		}
		fmt.Fprintln(stdout)
	}
	return nil
}

// idText is an id of an answer (a JSON string or number) as text.
func idText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}
