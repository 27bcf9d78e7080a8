package plan

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/svcrelay/relay/internal/backfill"
)

// Plans are kept in Dir/plans/<hex of the project name>.json, one file per
// project, written whole (a temporary file, fsynced, renamed, the
// directory fsynced) so a crash leaves the old or the new. The file holds
// the plan's bytes and their CRC-32C: a damaged file is reported and
// ignored (the project observes until its plan is read again).

// errNone: no plan kept for the project.
var errNone = errors.New("no plan kept")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type fileJSON struct {
	Project string          `json:"project"`
	Fetched time.Time       `json:"fetched"`
	CRC32C  uint32          `json:"crc32c"`
	Plan    json.RawMessage `json:"plan"`
}

func planPath(dir, project string) string {
	return filepath.Join(dir, "plans", fmt.Sprintf("%x.json", project))
}

func save(dir, project string, p *Plan, fetched time.Time) error {
	if dir == "" {
		return nil
	}
	raw, err := json.Marshal(p)
	if err != nil {
		return err
	}
	b, err := json.Marshal(fileJSON{Project: project, Fetched: fetched.UTC(), CRC32C: crc32.Checksum(raw, castagnoli), Plan: raw})
	if err != nil {
		return err
	}
	path := planPath(dir, project)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	err = backfill.WriteFile(path, 0o600, false, func(f *os.File) error {
		_, err := f.Write(b)
		return err
	})
	if err != nil {
		return fmt.Errorf("keep plan: %w", err)
	}
	return nil
}

func load(dir, project string) (*Plan, time.Time, error) {
	if dir == "" {
		return nil, time.Time{}, errNone
	}
	b, err := os.ReadFile(planPath(dir, project))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, time.Time{}, errNone
	}
	if err != nil {
		return nil, time.Time{}, err
	}
	var f fileJSON
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, time.Time{}, fmt.Errorf("plan file %s: %w", planPath(dir, project), err)
	}
	if crc32.Checksum(f.Plan, castagnoli) != f.CRC32C || f.Project != project {
		return nil, time.Time{}, fmt.Errorf("plan file %s: checksum mismatch (damaged)", planPath(dir, project))
	}
	var p Plan
	if err := json.Unmarshal(f.Plan, &p); err != nil {
		return nil, time.Time{}, fmt.Errorf("plan file %s: %w", planPath(dir, project), err)
	}
	return &p, f.Fetched, nil
}
