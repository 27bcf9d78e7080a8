package backfill

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

func upstreamOf(cfg Config) string {
	if cfg.Batch {
		return cfg.IngestURL + " (/batch)"
	}
	return cfg.IngestURL
}

// loadState reads Dir's state (resumed: one existed), checks it is for the
// same project and upstream, and adds the inputs it does not list yet.
func loadState(cfg Config) (st *state, resumed bool, err error) {
	path := filepath.Join(cfg.Dir, stateName)
	st = &state{Version: 1, Project: storage.LaneKey{Kind: storage.KindEvents, APIKey: cfg.APIKey}.Label(), Upstream: upstreamOf(cfg)}
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
		if old.Version != 1 || old.Project != st.Project || old.Upstream != st.Upstream {
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
		known := false
		for _, have := range st.Files {
			known = known || have.Path == abs
		}
		if !known {
			st.Files = append(st.Files, fileState{Path: abs})
		}
	}
	return st, resumed, nil
}

// save writes the state atomically (a temporary file renamed over it,
// fsynced unless cfg.NoSync).
func (s *state) save(cfg Config) error {
	path := filepath.Join(cfg.Dir, stateName)
	b, _ := json.MarshalIndent(s, "", " ")
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil && !cfg.NoSync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	return os.Rename(tmp, path)
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
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	defer os.Remove(tmp)
	bw := bufio.NewWriter(f)
	enc := json.NewEncoder(bw)
	var after uint64
	for {
		dls, err := sp.ListDead(storage.DeadFilter{}, after, 1000)
		if err != nil {
			f.Close()
			return fmt.Errorf("report: %w", err)
		}
		for _, d := range dls {
			l := reportLine{ID: d.ID, Reason: d.Reason, Answer: string(d.Answer), Died: d.Died}
			if json.Valid(d.Record.Data) {
				l.Event = d.Record.Data
			} else {
				l.Line = string(d.Record.Data)
			}
			if err := enc.Encode(l); err != nil {
				f.Close()
				return fmt.Errorf("report: %w", err)
			}
			after = d.ID
		}
		if len(dls) < 1000 {
			break
		}
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("report: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return os.Rename(tmp, path)
}
