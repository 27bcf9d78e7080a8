package backfill

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestWriteFile: a write that fails leaves the old file and no temporary
// file; one that succeeds replaces it with the mode asked for.
func TestWriteFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := WriteFile(path, 0o600, false, func(f *os.File) error {
		f.Write([]byte("half"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Fatalf("after a failed write: %q", b)
	}
	if _, err := os.Stat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary file left: %v", err)
	}
	for _, noSync := range []bool{false, true} {
		err = WriteFile(path, 0o640, noSync, func(f *os.File) error {
			_, err := f.Write([]byte("new"))
			return err
		})
		b, _ := os.ReadFile(path)
		fi, serr := os.Stat(path)
		if err != nil || serr != nil || string(b) != "new" || fi.Mode().Perm() != 0o640 {
			t.Fatalf("noSync %v: err %v, content %q, stat %v %v", noSync, err, b, fi, serr)
		}
		if _, err := os.Stat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("temporary file left: %v", err)
		}
		os.Remove(path)
	}
}

// TestDroppedSummary: most dropped first, then by name.
func TestDroppedSummary(t *testing.T) {
	c := Counts{Dropped: map[string]int64{"b": 1, "a": 1, "c": 2}}
	if s := c.DroppedSummary(); s != "c 2, a 1, b 1" {
		t.Fatalf("%q", s)
	}
}
