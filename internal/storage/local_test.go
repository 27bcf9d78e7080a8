package storage_test

import (
	"flag"
	"testing"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/storage/storagetest"
)

// broken wraps the backend under test in a defect, to see the suite catch
// it: go test ./internal/storage -broken=dropack (or another of
// storagetest.Defects) must fail.
var broken = flag.String("broken", "", "wrap the local backend in one of storagetest.Defects")

func TestLocalConformance(t *testing.T) {
	storagetest.Run(t, storagetest.Config{
		LaneQueues: true,
		New: func(t *testing.T) storagetest.OpenFunc {
			dir := t.TempDir()
			// Runs after every open's Close (cleanups run last first): the
			// files the test leaves are whole.
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
				var b storage.Backend = storage.NewLocal(sp, nil)
				if *broken != "" {
					b = storagetest.Broken(b, *broken)
				}
				t.Cleanup(func() { sp.Close() })
				return b
			}
		},
	})
}
