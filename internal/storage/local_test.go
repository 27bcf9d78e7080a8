package storage_test

import (
	"context"
	"flag"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/storage/storagetest"
)

// broken wraps the backend under test in a defect, to see the suite catch
// it: go test ./internal/storage -run Conformance -broken=dropack (or
// reorder, halfappend, dupread, deaddrop) must fail.
var broken = flag.String("broken", "", "wrap the local backend in a defect: dropack, reorder, halfappend, dupread, deaddrop")

func TestLocalConformance(t *testing.T) {
	storagetest.Run(t, storagetest.Config{
		LaneQueues: true,
		New: func(t *testing.T) storagetest.OpenFunc {
			dir := t.TempDir()
			return func(t *testing.T, o storagetest.Options) storage.Backend {
				t.Helper()
				sp, err := spool.Open(spool.Config{Dir: dir, Sync: spool.SyncNone, MinFreeBytes: -1, MaxBytes: o.MaxBytes}, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				var b storage.Backend = storage.NewLocal(sp, nil)
				if *broken != "" {
					b = breakBackend(b, *broken)
				}
				t.Cleanup(func() { sp.Close() })
				return b
			}
		},
	})
}

// defective is a backend with one defect.
type defective struct {
	storage.Backend
	how string
}

func breakBackend(b storage.Backend, how string) storage.Backend { return &defective{b, how} }

func (d *defective) Append(ctx context.Context, req storage.Request) error {
	if d.how == "halfappend" && len(req.Records) > 1 {
		// Stores the first record on its own, then the rest (which may fail).
		first := req
		first.Records = req.Records[:1]
		if err := d.Backend.Append(ctx, first); err != nil {
			return err
		}
		return d.Backend.Append(ctx, storage.Request{Lane: req.Lane, Records: req.Records[1:]})
	}
	return d.Backend.Append(ctx, req)
}

func (d *defective) PutDead(ctx context.Context, dls []spool.DeadLetter) error {
	if d.how == "deaddrop" && len(dls) > 1 {
		return d.Backend.PutDead(ctx, dls[:1])
	}
	return d.Backend.PutDead(ctx, dls)
}

func (d *defective) Run(ctx context.Context, deliver storage.DeliverFunc) error {
	return d.Backend.Run(ctx, func(ctx context.Context, r storage.Reader) error {
		return deliver(ctx, &defectiveReader{r: r, how: d.how})
	})
}

type defectiveReader struct {
	r    storage.Reader
	how  string
	held *storage.Message // reorder: a message given after the next one
	last *storage.Message // dupread
}

func (d *defectiveReader) Next(ctx context.Context) (*storage.Message, error) {
	switch d.how {
	case "reorder":
		// Swaps two messages when a second one is there within 50ms.
		if d.held != nil {
			m := d.held
			d.held = nil
			return m, nil
		}
		m, err := d.r.Next(ctx)
		if err != nil {
			return nil, err
		}
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if m2, err := d.r.Next(wctx); err == nil {
			d.held = m
			return m2, nil
		}
		return m, nil
	case "dupread":
		if d.last != nil {
			m := d.last
			d.last = nil
			return m, nil
		}
		m, err := d.r.Next(ctx)
		if err == nil && len(m.Records) > 0 && m.Seq%5 == 0 {
			cp := *m
			d.last = &cp
		}
		return m, err
	}
	return d.r.Next(ctx)
}

func (d *defectiveReader) Ack(ctx context.Context, m *storage.Message) error {
	if d.how == "dropack" {
		return nil
	}
	return d.r.Ack(ctx, m)
}
