package storagetest

import (
	"context"
	"slices"
	"time"

	"github.com/svcrelay/relay/internal/storage"
)

// defective is a backend with one defect.
type defective struct {
	storage.Backend
	how string
}

// Defects are the defects Broken knows; the suite fails on each of them
// (every case fails on at least one):
//
//	dropack     Ack does nothing
//	reorder     Next swaps two messages when both wait
//	halfappend  Append stores a request's first record, then the rest
//	            separately (the rest may be refused)
//	dupread     every fifth message is read twice
//	deaddrop    PutDead stores only the first dead letter
//	ackonread   Next acknowledges a message before handing it out (at
//	            most once: what is read and not delivered is lost)
var Defects = []string{"dropack", "reorder", "halfappend", "dupread", "deaddrop", "ackonread"}

// Broken wraps b in the named defect, for checking that the suite catches
// it: a backend's test takes a flag naming one and runs Run on Broken(b).
// An unknown name panics.
func Broken(b storage.Backend, defect string) storage.Backend {
	if !slices.Contains(Defects, defect) {
		panic("storagetest: unknown defect " + defect)
	}
	return &defective{b, defect}
}

// Unwrap is the backend with the defect.
func (d *defective) Unwrap() storage.Backend { return d.Backend }

func (d *defective) Append(ctx context.Context, req storage.Request) error {
	if recs := req.Batch.Records(); d.how == "halfappend" && len(recs) > 1 {
		// Stores the first record on its own, then the rest (which may fail).
		l := req.Lane()
		if err := d.Backend.Append(ctx, request(l, recs[:1])); err != nil {
			return err
		}
		return d.Backend.Append(ctx, request(l, recs[1:]))
	}
	return d.Backend.Append(ctx, req)
}

func (d *defective) PutDead(ctx context.Context, dls []storage.DeadLetter) error {
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
	case "ackonread":
		m, err := d.r.Next(ctx)
		if err == nil {
			err = d.r.Ack(ctx, m)
		}
		return m, err
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
	if d.how == "dropack" || d.how == "ackonread" {
		return nil
	}
	return d.r.Ack(ctx, m)
}
