package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// dumpLine is one record of `relay spool dump`.
type dumpLine struct {
	Lane     string    `json:"lane"` // the lane's Label (never the api_key)
	Kind     string    `json:"kind"`
	Seq      uint64    `json:"seq"`   // chunk sequence number within the lane
	Index    int       `json:"index"` // record index within the chunk
	Accepted time.Time `json:"accepted"`
	OrderKey string    `json:"order_key"`
	UserID   string    `json:"user_id,omitempty"`
	// Data is the record as it is sent upstream; DataRaw holds it instead
	// when it is not JSON.
	Data    json.RawMessage `json:"data,omitempty"`
	DataRaw string          `json:"data_raw,omitempty"`
}

// runDump prints every live record of the spool in --data-dir, lane by lane
// (oldest lane first), in delivery order, one JSON object per line. It
// refuses when a running relay holds the spool.
func runDump(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	return spoolCmd("dump", args, environ, stderr, false, nil, func(dir string, _ []string) error {
		n, err := dump(ctx, dir, stdout)
		if err == nil { // on stderr: stdout stays JSON lines only, and an empty spool says so
			records := "records"
			if n == 1 {
				records = "record"
			}
			fmt.Fprintf(stderr, "relay spool dump: %d %s\n", n, records)
		}
		return err
	})
}

// errLocked is returned by dump when another process holds the spool.
var errLocked = errors.New("the spool is in use by a running relay; stop it first")

// dump writes the spool's records to out and returns how many it wrote.
func dump(ctx context.Context, dir string, out io.Writer) (int, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return 0, fmt.Errorf("no spool in %s: %w", dir, err)
	}
	if !st.IsDir() {
		return 0, fmt.Errorf("%s is not a directory", dir)
	}
	if err := checkUnlocked(dir); err != nil {
		return 0, err
	}

	// A lock the check missed (the spool's files changed) makes Open fail
	// after the spool's own lock time-out.
	sp, err := spool.Open(spool.Config{Dir: dir}, nil, nil)
	if err != nil {
		return 0, fmt.Errorf("open spool in %s: %w", dir, err)
	}
	defer sp.Close()

	w := bufio.NewWriterSize(out, 1<<20)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	n := 0
	var recs []storage.Record
	for _, l := range sp.Lanes() {
		want := l.Stats().Chunks
		key := l.Key()
		label := key.Label()
		for got := int64(0); got < want; {
			// NextPart blocks when the lane is empty; the count above says how
			// many chunks there are, and the bound guards against a miscount.
			nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			chunks, rs, err := l.NextPart(nctx, 4<<20, recs)
			cancel()
			recs = rs
			if err != nil {
				return n, fmt.Errorf("lane %s: read chunk %d of %d: %w", label, got+1, want, err)
			}
			for _, c := range chunks {
				if c.First+len(c.Records) == c.Total { // a chunk larger than 4 MB comes in parts
					got++
				}
				for i, r := range c.Records {
					line := dumpLine{
						Lane: label, Kind: key.Kind.String(), Seq: c.Seq, Index: c.First + i,
						Accepted: c.Accepted.UTC(), OrderKey: string(r.OrderKey), UserID: string(r.UserID),
					}
					if json.Valid(r.Data) {
						line.Data = r.Data
					} else {
						line.DataRaw = string(r.Data)
					}
					if err := enc.Encode(&line); err != nil {
						return n, err
					}
					n++
				}
			}
		}
	}
	if err := w.Flush(); err != nil {
		return n, err
	}
	return n, sp.Close()
}

// checkUnlocked returns errLocked when a file in dir is locked by another
// process (bbolt holds an flock on its file while a relay has it open).
func checkUnlocked(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		if err == nil {
			_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		}
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("%s (%s is locked): %w", dir, e.Name(), errLocked)
		}
	}
	return nil
}
