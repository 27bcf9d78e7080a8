package operator

import (
	"archive/zip"
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
	"path/filepath"
	"sort"
	"time"

	"github.com/svcrelay/relay/internal/backfill"
	"github.com/svcrelay/relay/internal/forward"
)

// exportCmd is `relay export`: it exports a project's events for a range
// of hours of any length into one zip archive (or JSON lines with --jsonl).
//
// The range is cut into pieces of --piece-hours (at most 365 days, the
// API's limit). A piece the upstream refuses with 400 (its answer for a
// result over 4 GB) is halved and retried, down to single hours; a 404 is an
// empty piece. Each finished piece is kept in OUT.parts/ and recorded in
// the state file OUT.state.json, so that a run that was interrupted (or
// failed) resumes where it stopped when started again with the same
// arguments: finished pieces are never fetched again. At the end the pieces
// are merged into OUT (zip entries copied without recompressing, or
// unpacked to one JSON object per line) and the state is removed.
func exportCmd(fs *flag.FlagSet, c *common, stdout io.Writer) work {
	start := fs.String("start", "", "first hour, YYYYMMDDTHH (UTC); required")
	end := fs.String("end", "", "last hour included, YYYYMMDDTHH (UTC); required")
	out := fs.String("out", "", "output file; required (OUT.state.json and OUT.parts/ hold an unfinished run)")
	jsonl := fs.Bool("jsonl", false, "write JSON lines (one event per line) instead of a zip archive")
	pieceHours := fs.Int("piece-hours", 24, "hours per request (1 to 8760); smaller pieces resume at a finer grain")
	return func(ctx context.Context, p *progress) error {
		return runExport(ctx, c, p, stdout, *start, *end, *out, *pieceHours, *jsonl)
	}
}

// runExport is export's work (migrate's first step too).
func runExport(ctx context.Context, c *common, p *progress, stdout io.Writer, start, end, out string, pieceHours int, jsonl bool) error {
	s, err1 := time.Parse(forward.ExportHourFormat, start)
	e, err2 := time.Parse(forward.ExportHourFormat, end)
	switch {
	case err1 != nil || err2 != nil:
		return Usagef("--start and --end are required, as YYYYMMDDTHH (UTC)")
	case e.Before(s):
		return Usagef("--end is before --start")
	case out == "":
		return Usagef("--out is required")
	case pieceHours < 1 || pieceHours > int(forward.ExportMaxRange/time.Hour):
		return Usagef("--piece-hours must be 1 to %d", int(forward.ExportMaxRange/time.Hour))
	}
	cl, base, err := c.projectClient()
	if err != nil {
		return err
	}
	x := &exporter{cl: cl, base: base, out: out, whole: forward.ExportRange{Start: s, End: e}, pieceHours: pieceHours,
		jsonl: jsonl, p: p, stdout: stdout,
		state: exportState{Version: 1, Project: c.project, Start: start, End: end, JSONL: jsonl}}
	if err = x.run(ctx); err != nil && ctx.Err() != nil {
		return fmt.Errorf("interrupted; %d pieces are done: run the same command again to resume", len(x.state.Pieces))
	}
	return err
}

// exportState is OUT.state.json.
type exportState struct {
	Version int    `json:"version"`
	Project string `json:"project"`
	Start   string `json:"start"`
	End     string `json:"end"`
	JSONL   bool   `json:"jsonl"`
	// Pieces are the finished pieces, in the order they finished.
	Pieces []donePiece `json:"pieces"`
}

type donePiece struct {
	Start string `json:"start"`
	End   string `json:"end"`
	// Part is the file in OUT.parts/ ("" for an empty piece: 404).
	Part  string `json:"part,omitempty"`
	Bytes int64  `json:"bytes"`
}

type exporter struct {
	cl         *client
	base       string
	out        string
	whole      forward.ExportRange
	pieceHours int
	jsonl      bool
	p          *progress
	stdout     io.Writer
	state      exportState
	fetched    int64
}

func (x *exporter) statePath() string { return x.out + ".state.json" }
func (x *exporter) partsDir() string  { return x.out + ".parts" }

func (x *exporter) run(ctx context.Context) error {
	if err := x.loadState(); err != nil {
		return err
	}
	if err := os.MkdirAll(x.partsDir(), 0o755); err != nil {
		return err
	}
	queue := x.todo()
	if n := len(x.state.Pieces); n > 0 {
		x.p.logf("resuming: %d pieces already done, %d ranges left", n, len(queue))
	}
	t0 := time.Now()
	for len(queue) > 0 {
		r := queue[0]
		queue = queue[1:]
		d, status, err := x.fetchRetrying(ctx, r)
		switch {
		case err != nil:
			return err
		case status == http.StatusBadRequest:
			a, b, ok := r.Halves()
			if !ok {
				return fmt.Errorf("hour %s is refused (400: over 4 GB for a single hour): use the upstream's object-storage export for it", r.StartParam())
			}
			x.p.logf("piece %s refused with 400 (over 4 GB?): splitting into %s and %s", r, a, b)
			queue = append([]forward.ExportRange{a, b}, queue...)
			continue
		}
		x.state.Pieces = append(x.state.Pieces, d)
		if err := x.saveState(); err != nil {
			return err
		}
		if d.Part == "" {
			x.p.logf("piece %s: no data (404)", r)
		} else {
			x.p.logf("piece %s: %s", r, humanBytes(d.Bytes))
		}
	}
	x.p.done()
	n, err := x.merge()
	if err != nil {
		return err
	}
	os.RemoveAll(x.partsDir())
	os.Remove(x.statePath())
	fmt.Fprintf(x.stdout, "%s: %s from %d pieces (%s fetched in %v)\n", x.out, humanBytes(n), len(x.state.Pieces),
		humanBytes(x.fetched), time.Since(t0).Round(time.Millisecond))
	return nil
}

// loadState reads an unfinished run's state; it must be for the same
// arguments.
func (x *exporter) loadState() error {
	b, err := os.ReadFile(x.statePath())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var st exportState
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("state file %s is damaged (%v): remove it and %s to start over", x.statePath(), err, x.partsDir())
	}
	if st.Version != 1 || st.Project != x.state.Project || st.Start != x.state.Start || st.End != x.state.End || st.JSONL != x.state.JSONL {
		return fmt.Errorf("state file %s is of another run (project %s, %s to %s): remove it and %s, or use another --out",
			x.statePath(), st.Project, st.Start, st.End, x.partsDir())
	}
	for _, d := range st.Pieces {
		if d.Part == "" {
			continue
		}
		path := filepath.Join(x.partsDir(), d.Part)
		fi, err := os.Stat(path)
		if err != nil || fi.Size() != d.Bytes {
			return fmt.Errorf("piece file %s of the state file is missing or changed: remove %s and %s to start over",
				d.Part, x.statePath(), x.partsDir())
		}
		// Files are not fsynced (a crash of the machine may leave a piece
		// damaged): each is checked here instead.
		zr, err := zip.OpenReader(path)
		if err != nil {
			return fmt.Errorf("piece file %s is damaged (%v): remove %s and %s to start over", d.Part, err, x.statePath(), x.partsDir())
		}
		zr.Close()
	}
	x.state.Pieces = st.Pieces
	return nil
}

// saveState writes the state file, not fsynced like the pieces (loadState
// checks them).
func (x *exporter) saveState() error {
	return backfill.WriteFile(x.statePath(), 0o644, true, func(f *os.File) error { return json.NewEncoder(f).Encode(x.state) })
}

// todo returns the ranges still to fetch: the plan's pieces minus the hours
// of finished pieces.
func (x *exporter) todo() []forward.ExportRange {
	done := make([]forward.ExportRange, 0, len(x.state.Pieces))
	for _, d := range x.state.Pieces {
		s, _ := time.Parse(forward.ExportHourFormat, d.Start)
		e, _ := time.Parse(forward.ExportHourFormat, d.End)
		done = append(done, forward.ExportRange{Start: s, End: e})
	}
	sort.Slice(done, func(i, j int) bool { return done[i].Start.Before(done[j].Start) })
	var out []forward.ExportRange
	for _, r := range x.whole.Split(x.pieceHours) {
		cur := r.Start
		for _, d := range done {
			if d.End.Before(cur) || d.Start.After(r.End) {
				continue
			}
			if d.Start.After(cur) {
				out = append(out, forward.ExportRange{Start: cur, End: d.Start.Add(-time.Hour)})
			}
			cur = d.End.Add(time.Hour)
		}
		if !cur.After(r.End) {
			out = append(out, forward.ExportRange{Start: cur, End: r.End})
		}
	}
	return out
}

// fetchRetrying is fetch, tried again (up to 5 times, backing off) when the
// archive's body was cut or arrived damaged.
func (x *exporter) fetchRetrying(ctx context.Context, r forward.ExportRange) (donePiece, int, error) {
	bo := x.cl.c.backOff(0)
	for attempt := 1; ; attempt++ {
		d, status, err := x.fetch(ctx, r)
		var be *bodyError
		if !errors.As(err, &be) || attempt == 5 || ctx.Err() != nil {
			return d, status, err
		}
		wait := bo.NextBackOff()
		x.p.logf("piece %s: %v; fetching it again in %v", r, err, wait.Round(time.Millisecond))
		if err := backfill.Sleep(ctx, wait); err != nil {
			return d, 0, err
		}
	}
}

// bodyError is a piece whose answer began (200) but did not arrive whole.
type bodyError struct{ err error }

func (e *bodyError) Error() string { return e.err.Error() }
func (e *bodyError) Unwrap() error { return e.err }

// fetch downloads one piece into the parts directory. It returns the
// finished piece, or status 400 (to split).
func (x *exporter) fetch(ctx context.Context, r forward.ExportRange) (donePiece, int, error) {
	d := donePiece{Start: r.StartParam(), End: r.EndParam()}
	q := url.Values{"start": {d.Start}, "end": {d.End}}
	resp, err := x.cl.do(ctx, http.MethodGet, x.base+forward.ExportPath+"?"+q.Encode(), nil, true, http.StatusBadRequest, http.StatusNotFound)
	if err != nil {
		return d, 0, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusBadRequest:
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return d, resp.StatusCode, nil
	case http.StatusNotFound:
		return d, resp.StatusCode, nil
	}
	d.Part = d.Start + "-" + d.End + ".zip"
	total := resp.ContentLength
	var n int64
	// Not fsynced: loadState checks the pieces a crash may have damaged.
	err = backfill.WriteFile(filepath.Join(x.partsDir(), d.Part), 0o666, true, func(f *os.File) error {
		cr := &countingReader{r: resp.Body, on: func(n int64) {
			if total > 0 {
				x.p.update("piece %s: %s of %s", r, humanBytes(n), humanBytes(total))
			} else {
				x.p.update("piece %s: %s", r, humanBytes(n))
			}
		}}
		var err error
		n, err = io.Copy(f, cr)
		x.fetched += n
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return &bodyError{fmt.Errorf("piece %s: the archive was cut after %d bytes: %w", r, n, err)}
		}
		// A cut-off download has no central directory: refuse it.
		if _, err := zip.NewReader(f, n); err != nil {
			return &bodyError{fmt.Errorf("piece %s: the archive is damaged: %w", r, err)}
		}
		return nil
	})
	if err != nil {
		return d, 0, err
	}
	d.Bytes = n
	return d, http.StatusOK, nil
}

// merge writes OUT from the finished pieces, in time order, and returns its
// size.
func (x *exporter) merge() (int64, error) {
	pieces := append([]donePiece(nil), x.state.Pieces...)
	sort.Slice(pieces, func(i, j int) bool { return pieces[i].Start < pieces[j].Start })
	var size int64
	err := backfill.WriteFile(x.out, 0o666, false, func(f *os.File) error {
		bw := bufio.NewWriterSize(f, 1<<20)
		var zw *zip.Writer
		if !x.jsonl {
			zw = zip.NewWriter(bw)
		}
		for _, d := range pieces {
			if d.Part == "" {
				continue
			}
			x.p.update("merging %s", d.Part)
			if err := x.mergePart(filepath.Join(x.partsDir(), d.Part), zw, bw); err != nil {
				return fmt.Errorf("merge %s: %w", d.Part, err)
			}
		}
		var err error
		if zw != nil {
			err = zw.Close()
		}
		if err == nil {
			err = bw.Flush()
		}
		if err == nil {
			size, err = f.Seek(0, io.SeekCurrent)
		}
		return err
	})
	x.p.done()
	return size, err
}

// mergePart copies a piece's zip entries into zw without recompressing
// them or, with zw nil (--jsonl), writes its events to w, one a line.
func (x *exporter) mergePart(path string, zw *zip.Writer, w io.Writer) error {
	if zw == nil {
		return backfill.ReadLines(path, func(line []byte) error {
			_, err := w.Write(line)
			if err == nil && line[len(line)-1] != '\n' {
				_, err = w.Write([]byte{'\n'})
			}
			return err
		})
	}
	zr, err := zip.OpenReader(path)
	if err != nil {
		return err
	}
	defer zr.Close()
	for _, zf := range zr.File {
		raw, err := zf.OpenRaw()
		if err != nil {
			return err
		}
		hdr := zf.FileHeader
		dst, err := zw.CreateRaw(&hdr)
		if err != nil {
			return err
		}
		if _, err := io.Copy(dst, raw); err != nil {
			return err
		}
	}
	return nil
}
