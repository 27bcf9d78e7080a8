package backfill

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// stateName is the state file in Dir.
const stateName = "backfill.state.json"

// state is Dir/backfill.state.json: for which project and upstream the
// spool's records are, and how far each input was read. It moves past a
// chunk only after the chunk is in the spool (and its dead letters in the
// dead-letter store), so a run killed between the two reads that chunk again:
// the same events under the same insert_ids, which the upstream dedups.
type state struct {
	Version int `json:"version"`
	// Project is a label of the api_key (never the key itself).
	Project string `json:"project"`
	// Upstream is where the spooled records go (the ingest URL, and
	// whether /batch).
	Upstream string      `json:"upstream"`
	Files    []fileState `json:"files"`
}

type fileState struct {
	// Path is the input's absolute path.
	Path string `json:"path"`
	// Pos is where the next unread line starts; Done says the input was
	// read to its end.
	Pos    pos   `json:"pos"`
	Done   bool  `json:"done"`
	Events int64 `json:"events"` // read so far
}

func (s *state) read() int64 {
	var n int64
	for _, f := range s.Files {
		n += f.Events
	}
	return n
}

const batchSuffix = " (/batch)"

// upstreamKey names a run's upstream in its state: the ingest URL without
// a trailing slash (the same base with or without one; a state written
// before kept it as given), batchSuffix after it for a /batch run.
func upstreamKey(ingestURL string, batch bool) string {
	u := strings.TrimRight(ingestURL, "/")
	if batch {
		u += batchSuffix
	}
	return u
}

// loadState reads Dir's state (resumed: one existed), checks it is for the
// same project and upstream, and adds the inputs it does not list yet.
func loadState(cfg Config) (st *state, resumed bool, err error) {
	path := filepath.Join(cfg.Dir, stateName)
	st = &state{Version: 1, Project: storage.LaneKey{Kind: storage.KindEvents, APIKey: cfg.APIKey}.Label(), Upstream: upstreamKey(cfg.IngestURL, cfg.Batch)}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, false, err
	default:
		var old state
		if err := json.Unmarshal(b, &old); err != nil {
			return nil, false, fmt.Errorf("state file %s is damaged (%v): use another --data-dir", path, err)
		}
		if u, batch := strings.CutSuffix(old.Upstream, batchSuffix); old.Version != 1 || old.Project != st.Project || upstreamKey(u, batch) != st.Upstream {
			return nil, false, fmt.Errorf("%s holds a backfill of another project or upstream (%s to %s): use another --data-dir",
				cfg.Dir, old.Project, old.Upstream)
		}
		st.Files, resumed = old.Files, true
	}
	for _, f := range cfg.Files {
		abs, err := filepath.Abs(f)
		if err != nil {
			return nil, false, err
		}
		if _, err := os.Stat(abs); err != nil {
			return nil, false, err
		}
		if !slices.ContainsFunc(st.Files, func(f fileState) bool { return f.Path == abs }) {
			st.Files = append(st.Files, fileState{Path: abs})
		}
	}
	return st, resumed, nil
}

// save writes the state atomically, fsynced unless cfg.NoSync.
func (s *state) save(cfg Config) error {
	if err := WriteFile(filepath.Join(cfg.Dir, stateName), 0o666, cfg.NoSync, func(f *os.File) error { return json.NewEncoder(f).Encode(s) }); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	return nil
}

// WriteFile replaces path with what write writes to a temporary file beside
// it (created with perm), so that a reader or a crash sees the old file or
// the new one, never a part of it. Unless noSync, the file is fsynced before
// the rename and its directory after it, so that the new file survives a
// crash of the machine. f is open for reading too, so that write may check
// what it wrote; write's error is returned as it is.
func WriteFile(path string, perm os.FileMode, noSync bool, write func(f *os.File) error) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // after a failure; after the rename it is gone
	err = write(f)
	if err == nil && !noSync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil && !noSync {
		if d, derr := os.Open(filepath.Dir(path)); derr == nil {
			err = d.Sync()
			d.Close()
		}
	}
	return err
}

// reportLine is one dead letter in the report file.
type reportLine struct {
	ID     uint64          `json:"id"`
	Reason string          `json:"reason"`
	Answer string          `json:"answer,omitempty"`
	Died   time.Time       `json:"died"`
	Event  json.RawMessage `json:"event,omitempty"`
	Line   string          `json:"line,omitempty"` // an input line that is not JSON
}

// writeReport writes every dead letter of the spool (all runs) to path as
// JSON lines; with none, it removes an old report.
func writeReport(sp *spool.Spool, path string) error {
	if sp.Stats().Dead == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	err := WriteFile(path, 0o666, false, func(f *os.File) error {
		bw := bufio.NewWriter(f)
		enc := json.NewEncoder(bw)
		var after uint64
		for {
			dls, err := sp.ListDead(context.Background(), storage.DeadFilter{}, after, 1000)
			if err != nil {
				return err
			}
			for _, d := range dls {
				l := reportLine{ID: d.ID, Reason: d.Reason, Answer: string(d.Answer), Died: d.Died}
				if json.Valid(d.Record.Data) {
					l.Event = d.Record.Data
				} else {
					l.Line = string(d.Record.Data)
				}
				if err := enc.Encode(l); err != nil {
					return err
				}
				after = d.ID
			}
			if len(dls) < 1000 {
				return bw.Flush()
			}
		}
	})
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}
