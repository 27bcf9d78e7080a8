package spool_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/svcrelay/relay/internal/diskfulltest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/storage/storagetest"
)

// broken wraps the backend under test in a defect, to see the suite catch
// it: go test ./internal/storage -broken=dropack (or another of
// storagetest.Defects) must fail.
var broken = flag.String("broken", "", "wrap the local backend in one of storagetest.Defects")

func TestLocalConformance(t *testing.T) {
	var mu sync.Mutex
	dirs := map[*testing.T]string{} // each test's spool
	storagetest.Run(t, storagetest.Config{
		LaneQueues: true,
		New: func(t *testing.T) storagetest.OpenFunc {
			dir := t.TempDir()
			mu.Lock()
			dirs[t] = dir
			mu.Unlock()
			return openAt(t, dir)
		},
		// The spool closed, every chunk is in spool.db: flip the marked
		// record's bytes there (each copy: bbolt may keep an old page).
		Damage: func(t *testing.T, open storagetest.OpenFunc, b storage.Backend, marker []byte) storage.Backend {
			mu.Lock()
			dir := dirs[t]
			mu.Unlock()
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "spool.db")
			db, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(db, marker) {
				t.Fatal("the marked record is not in spool.db")
			}
			for i := bytes.Index(db, marker); i >= 0; i = bytes.Index(db, marker) {
				for j := range marker {
					db[i+j] ^= 0x20
				}
			}
			if err := os.WriteFile(path, db, 0o600); err != nil {
				t.Fatal(err)
			}
			return open(t, storagetest.Options{})
		},
		NoSpace: func(t *testing.T) (storagetest.OpenFunc, func(), func()) {
			mnt := diskfulltest.Tmpfs(t, "96m", "")
			filler := filepath.Join(mnt, "filler")
			return openAt(t, filepath.Join(mnt, "spool")),
				func() { diskfulltest.Fill(t, filler) },
				func() {
					if err := os.Remove(filler); err != nil {
						t.Fatal(err)
					}
				}
		},
	})
}

// openAt is the OpenFunc of a spool in dir; the spool's files must be
// whole when the test ends.
func openAt(t *testing.T, dir string) storagetest.OpenFunc {
	// Runs after every open's Close (cleanups run last first): the files
	// the test leaves are whole (a damaged chunk is a dead letter by then).
	t.Cleanup(func() {
		rep, err := spool.Verify(dir, nil)
		if err != nil || rep.Damaged != 0 || len(rep.Problems) != 0 {
			t.Errorf("spool left damaged: %v, %+v", err, rep)
		}
	})
	return func(t *testing.T, o storagetest.Options) storage.Backend {
		t.Helper()
		sp, err := spool.Open(spool.Config{Dir: dir, NoSync: true, MinFreeBytes: -1, MaxBytes: o.MaxBytes}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		var b storage.Backend = spool.NewBackend(sp)
		if *broken != "" {
			b = storagetest.Broken(b, *broken)
		}
		t.Cleanup(func() { sp.Close() })
		return b
	}
}
