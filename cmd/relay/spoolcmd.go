package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/operator"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// runSpool dispatches `relay spool SUBCOMMAND`.
func runSpool(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "dump":
			return runDump(ctx, args[1:], environ, stdout, stderr)
		case "verify":
			return runVerify(args[1:], environ, stdout, stderr)
		case "salvage":
			return runSalvage(args[1:], environ, stdout, stderr)
		case "import":
			return runImport(ctx, args[1:], environ, stdout, stderr)
		}
	}
	fmt.Fprintln(stderr, "relay: usage: relay spool (dump|verify|salvage|import) --data-dir DIR ...")
	return exitUsage
}

// spoolHint is what an operator runs next when the spool does not open.
func spoolHint(dir string, err error) string {
	if errors.Is(err, spool.ErrDamaged) {
		return fmt.Sprintf("; the relay does not start on it: run `relay spool verify --data-dir %s` to see the damage and "+
			"`relay spool salvage --data-dir %s --out FILE` to recover what is readable (README: Operations)", dir, dir)
	}
	return ""
}

// spoolCmd runs `relay spool NAME` (operator.Run's flow) with --data-dir
// (its default from RELAY_DATA_DIR) and the command's own flags (more);
// run gets the data dir and the arguments.
func spoolCmd(name string, args, environ []string, stderr io.Writer, takesArgs bool, more func(*flag.FlagSet), run func(dir string, args []string) error) int {
	fs := flag.NewFlagSet("relay spool "+name, flag.ContinueOnError)
	def := cmp.Or(envValue(environ, config.EnvName("data-dir")), config.Default("data-dir"))
	dir := fs.String("data-dir", def, "the relay's data dir (default from RELAY_DATA_DIR)")
	if more != nil {
		more(fs)
	}
	return operator.Run("spool "+name, fs, args, stderr, takesArgs, func() error { return run(*dir, fs.Args()) })
}

// runVerify prints a summary of the spool's records and checksums; exit 1
// when anything is damaged.
func runVerify(args, environ []string, stdout, stderr io.Writer) int {
	return spoolCmd("verify", args, environ, stderr, false, nil, func(dir string, _ []string) error {
		if err := checkUnlocked(dir); err != nil {
			return err
		}
		rep, err := spool.Verify(dir, nil)
		if err != nil {
			return err
		}
		printReport(stdout, dir, rep)
		if rep.Damaged > 0 || len(rep.Problems) > 0 {
			fmt.Fprintf(stdout, "DAMAGED: stop here; `relay spool salvage --data-dir %s --out FILE` writes every readable record (README: Operations)\n", dir)
			return operator.ErrFailed
		}
		fmt.Fprintln(stdout, "OK")
		return nil
	})
}

func printReport(w io.Writer, dir string, rep spool.VerifyReport) {
	fmt.Fprintf(w, "spool %s: %d records (%d bytes) in %d lanes, %d dead letters, %d damaged\n",
		dir, rep.Records, rep.Bytes, rep.Lanes, rep.DeadLetters, rep.Damaged)
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "damage: %s\n", p)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

// runSalvage writes every readable record as JSON lines to --out.
func runSalvage(args, environ []string, stdout, stderr io.Writer) int {
	var out *string
	more := func(fs *flag.FlagSet) {
		out = fs.String("out", "", "the file to write (JSON lines; it holds api_keys: mode 0600); - for stdout")
	}
	return spoolCmd("salvage", args, environ, stderr, true, more, func(dir string, args []string) error {
		if len(args) > 0 || *out == "" {
			return operator.Usagef("usage: relay spool salvage --data-dir DIR --out FILE")
		}
		if err := checkUnlocked(dir); err != nil {
			return err
		}
		var w io.Writer = stdout
		var f *os.File
		if *out != "-" {
			var err error
			if f, err = os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
				return err
			}
			w = f
		}
		bw := bufio.NewWriterSize(w, 1<<20)
		enc := json.NewEncoder(bw)
		enc.SetEscapeHTML(false)
		n := 0
		rep, err := spool.Verify(dir, func(r *spool.SalvageRecord) error {
			n++
			return enc.Encode(r)
		})
		err = cmp.Or(err, bw.Flush())
		if f != nil {
			err = cmp.Or(err, f.Sync(), f.Close()) // the first error; both run either way
		}
		if err != nil {
			return err
		}
		printReport(stderr, dir, rep)
		fmt.Fprintf(stderr, "relay spool salvage: wrote %d lines to %s\n", n, *out)
		return nil
	})
}

// runImport appends the records of salvage files to the spool in
// --data-dir (a fresh one, or any that no relay holds): live records to
// the tails of their lanes, dead letters as dead letters. Records flagged
// damaged are skipped unless --damaged.
func runImport(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	var damaged *bool
	more := func(fs *flag.FlagSet) {
		damaged = fs.Bool("damaged", false, "also import records whose checksum failed (they may be altered)")
	}
	return spoolCmd("import", args, environ, stderr, true, more, func(dir string, files []string) error {
		if len(files) == 0 {
			return operator.Usagef("usage: relay spool import --data-dir DIR FILE...")
		}
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			if err := checkUnlocked(dir); err != nil {
				return err
			}
		}
		sp, err := spool.Open(spool.Config{Dir: dir}, nil, nil)
		if err != nil {
			return fmt.Errorf("open spool in %s: %w%s", dir, err, spoolHint(dir, err))
		}
		st := importStats{lanes: map[storage.LaneKey]bool{}}
		for _, name := range files {
			if err = importFile(ctx, sp, filepath.Clean(name), *damaged, &st); err != nil {
				break
			}
		}
		err = cmp.Or(err, sp.Close())
		fmt.Fprintf(stdout, "imported %d records into %d lanes and %d dead letters; skipped %d damaged, %d without an api_key\n",
			st.records, len(st.lanes), st.dead, st.damaged, st.nokey)
		return err
	})
}

type importStats struct {
	records, dead, damaged, nokey int
	lanes                         map[storage.LaneKey]bool
}

// importBatch bounds the records of one Append.
const importBatch = 1000

func importFile(ctx context.Context, sp *spool.Spool, name string, withDamaged bool, st *importStats) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	var (
		b    storage.Batch
		lane *spool.Lane
		dead []storage.DeadLetter
	)
	flush := func() error {
		if n := b.Len(); n > 0 {
			if err := sp.Append(ctx, lane, &b); err != nil {
				return err
			}
			st.records += n
		}
		if len(dead) > 0 {
			if err := sp.PutDead(ctx, dead); err != nil {
				return err
			}
			st.dead += len(dead)
			dead = dead[:0]
		}
		return nil
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	line := 0
	for sc.Scan() {
		line++
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var r spool.SalvageRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("%s:%d: %w", name, line, err)
		}
		if r.Damaged && !withDamaged {
			st.damaged++
			continue
		}
		if r.APIKey == "" {
			st.nokey++
			continue
		}
		key, rec, err := r.Record()
		if err != nil {
			return fmt.Errorf("%s:%d: %w", name, line, err)
		}
		if r.Dead != nil {
			dead = append(dead, storage.DeadLetter{Lane: key, Reason: r.Dead.Reason, Answer: []byte(r.Dead.Answer),
				Accepted: r.Accepted, Died: r.Dead.Died, Record: rec})
			if len(dead) >= importBatch {
				if err := flush(); err != nil {
					return err
				}
			}
			continue
		}
		if lane == nil || lane.Key() != key || b.Len() >= importBatch {
			if err := flush(); err != nil {
				return err
			}
			if lane, err = sp.Lane(ctx, key); err != nil {
				return err
			}
			st.lanes[key] = true
		}
		b.Add(rec)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return flush()
}
