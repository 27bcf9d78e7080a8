package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// TestSpoolVerifySalvageImport: verify says OK on a sound spool and exits 1
// naming the damage once a chunk in spool.db is damaged; salvage writes
// every record (the damaged chunk's flagged) with its api_key; import
// replays the sound ones into a fresh spool, which dump then shows.
func TestSpoolVerifySalvageImport(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	sp, err := spool.Open(spool.Config{Dir: dir, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := sp.Lane(ctx, storage.LaneKey{Kind: storage.KindEvents, APIKey: "salvage-key"})
	if err != nil {
		t.Fatal(err)
	}
	for c := range 3 {
		var b storage.Batch
		for i := range 2 {
			b.Add(storage.Record{OrderKey: []byte("d:dev"), Data: fmt.Appendf(nil, `{"event_type":"x","insert_id":"iid-%d-%d"}`, c, i)})
		}
		if err := sp.Append(ctx, l, &b); err != nil {
			t.Fatal(err)
		}
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"spool", "verify", "--data-dir", dir}, nil, &out, &errOut); code != exitOK || !strings.Contains(out.String(), "6 records") {
		t.Fatalf("verify of a sound spool: %d: %s%s", code, out.String(), errOut.String())
	}

	db := filepath.Join(dir, "spool.db")
	b, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(b, []byte(`"iid-1-0"`))
	if i < 0 {
		t.Fatal("chunk 1 not in spool.db")
	}
	b[i+2] ^= 0x01
	if err := os.WriteFile(db, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run([]string{"spool", "verify", "--data-dir", dir}, nil, &out, &errOut); code != exitFailure ||
		!strings.Contains(out.String(), "4 records") || !strings.Contains(out.String(), "1 damaged") || !strings.Contains(out.String(), "checksum") {
		t.Fatalf("verify of a damaged spool: %d: %s", code, out.String())
	}

	file := filepath.Join(t.TempDir(), "salvage.jsonl")
	if code := run([]string{"spool", "salvage", "--data-dir", dir, "--out", file}, nil, &out, &errOut); code != exitOK {
		t.Fatalf("salvage: %d: %s", code, errOut.String())
	}
	sb, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(sb), "\n"); n != 6 || strings.Count(string(sb), `"damaged":true`) != 2 || !strings.Contains(string(sb), `"api_key":"salvage-key"`) {
		t.Fatalf("salvage wrote:\n%s", sb)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("salvage file mode: %v %v", fi.Mode(), err)
	}

	fresh := t.TempDir()
	out.Reset()
	if code := run([]string{"spool", "import", "--data-dir", fresh, file}, nil, &out, &errOut); code != exitOK ||
		!strings.Contains(out.String(), "imported 4 records") || !strings.Contains(out.String(), "skipped 2 damaged") {
		t.Fatalf("import: %d: %s%s", code, out.String(), errOut.String())
	}
	out.Reset()
	if _, err := dump(ctx, fresh, &out); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"iid-0-0", "iid-0-1", "iid-2-0", "iid-2-1"} {
		if !strings.Contains(out.String(), id) {
			t.Fatalf("dump after import lacks %s:\n%s", id, out.String())
		}
	}
	if strings.Contains(out.String(), "iid-1-") {
		t.Fatalf("dump after import holds the damaged chunk's records:\n%s", out.String())
	}
}

// TestSpoolOpenHint: a relay whose spool.db is gone while its log holds
// records refuses to start with one line naming the way out.
func TestSpoolOpenHint(t *testing.T) {
	err := fmt.Errorf("open spool: %w", spool.ErrDamaged)
	if h := spoolHint("/d", err); !strings.Contains(h, "relay spool salvage --data-dir /d") {
		t.Fatalf("hint %q", h)
	}
	if h := spoolHint("/d", errors.New("spool: locked by another process")); h != "" {
		t.Fatalf("hint for a locked spool: %q", h)
	}
}

// TestServeRefusesSpoolWithoutDB: `relay` on a data dir whose spool.db is
// gone while its write-ahead log holds records exits 1 with a line naming
// the way out, and creates no fresh spool.db.
func TestServeRefusesSpoolWithoutDB(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	sp, err := spool.Open(spool.Config{Dir: dir, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := sp.Lane(ctx, storage.LaneKey{Kind: storage.KindEvents, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	var b storage.Batch
	b.Add(storage.Record{OrderKey: []byte("d:dev"), Data: []byte(`{"event_type":"x"}`)})
	if err := sp.Append(ctx, l, &b); err != nil {
		t.Fatal(err)
	}
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "spool.db")); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := run([]string{"--data-dir", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json"}, nil, &out, &errOut)
	if code != exitFailure {
		t.Fatalf("exit %d, want %d: %s", code, exitFailure, errOut.String())
	}
	var line string
	for _, l := range strings.Split(errOut.String(), "\n") {
		if strings.Contains(l, `"level":"error"`) {
			if line != "" {
				t.Fatalf("more than one error line:\n%s", errOut.String())
			}
			line = l
		}
	}
	if !strings.Contains(line, "spool.db is missing") || !strings.Contains(line, "relay spool salvage --data-dir "+dir) {
		t.Fatalf("error line %q", line)
	}
	if _, err := os.Stat(filepath.Join(dir, "spool.db")); err == nil {
		t.Fatal("a fresh spool.db was created")
	}
}
