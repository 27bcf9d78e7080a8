package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"testing"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/storage"
)

// testSpill: messages read through the seam and spilled (delivery's
// head-of-line guard) stay held: not delivered again past AckWait (kept
// alive by their reply subjects), their client handles dropped; Reread
// reads each again whole by sequence, and its Ack removes it from the
// stream. A message read after them (another key's) is acknowledged
// meanwhile.
func (e *testEnv) testSpill(t *testing.T) {
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1, AckWait: 8 * time.Second})
	ctx := bg(t)
	for _, r := range []storage.Record{rec("d:held", 1), rec("d:held", 2), rec("d:other", 1)} {
		if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{r}}); err != nil {
			t.Fatal(err)
		}
	}
	res := make(chan error, 1)
	stop := runEvents(f, func(ctx context.Context, p *Partition) error {
		r := &partitionReader{p: p, out: make(map[uint64]*Message)}
		err := spillCase(ctx, r)
		res <- err
		return err
	})
	defer stop()
	select {
	case err := <-res:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(polltest.Max):
		t.Fatal("deliver did not finish")
	}
	waitFor(t, 10*time.Second, "the stream empties", func() bool { return streamMsgs(t, f, storage.KindEvents) == 0 })
}

func spillCase(ctx context.Context, r *partitionReader) error {
	var ms []*storage.Message
	for range 3 {
		m, err := r.Next(ctx)
		if err != nil {
			return err
		}
		ms = append(ms, m)
	}
	for _, m := range ms[:2] {
		r.Spill(m.Seq)
	}
	r.mu.Lock()
	for _, m := range ms[:2] {
		if fm := r.out[m.Seq]; fm == nil || fm.msg != nil || fm.Records != nil {
			r.mu.Unlock()
			return fmt.Errorf("seq %d still holds its body after Spill", m.Seq)
		}
	}
	r.mu.Unlock()
	r.p.mu.Lock()
	nout, nspilled := len(r.p.out), len(r.p.spilled)
	r.p.mu.Unlock()
	if nout != 1 || nspilled != 2 || r.p.Held() != 3 {
		return fmt.Errorf("after spilling 2 of 3: %d handles, %d spilled, %d held", nout, nspilled, r.p.Held())
	}
	if err := r.Ack(ctx, ms[2]); err != nil {
		return err
	}
	// 2.5 AckWaits: nothing may be delivered again. (AckWait 8 s: only a
	// stall of over 5.3 s on a loaded machine could miss a keep-alive; at
	// 4 s, 2.6 s was all a keep-alive could be late by.)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	again, err := r.Next(wctx)
	cancel()
	if again != nil {
		return fmt.Errorf("spilled message delivered again: seq %d", again.Seq)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("waiting for nothing: %w", err)
	}
	for i, m := range ms[:2] {
		got, err := r.Reread(ctx, m.Seq)
		if err != nil {
			return err
		}
		if len(got.Records) != 1 || string(got.Records[0].Data) != fmt.Sprintf("d:held/%d", i+1) || got.Lane != lane || got.Seq != m.Seq {
			return fmt.Errorf("reread seq %d: %+v", m.Seq, got)
		}
		if err := r.Ack(ctx, got); err != nil {
			return err
		}
	}
	if r.p.Held() != 0 {
		return fmt.Errorf("%d held after the acks", r.p.Held())
	}
	if _, err := r.Reread(ctx, ms[0].Seq); err == nil || !strings.Contains(err.Error(), "not read") {
		return fmt.Errorf("reread after ack: %v", err)
	}
	return nil
}

// testSpillStepDown: Reread asks again while the stream's leadership
// changes hands. Only a stream's leader answers its info and a message
// get, so a request sent just after a step-down can be answered by no
// server: each spilled message here is read again right after one, the
// first through the stream's lookup, the others through the message get
// alone (the stream known). Asked once and bounded only by the caller's
// context, a read waited all of it.
func (e *testEnv) testSpillStepDown(t *testing.T) {
	f := e.open(t, e.connect(t), Config{Namespace: e.namespace(), Partitions: 1})
	ctx := bg(t)
	const n = 4
	for i := range n {
		if err := f.Append(ctx, Request{Lane: lane, Records: []storage.Record{rec("d:held", i+1)}}); err != nil {
			t.Fatal(err)
		}
	}
	stream := f.n.streamOf(storage.KindEvents, 0)
	res := make(chan error, 1)
	stop := runEvents(f, func(ctx context.Context, p *Partition) error {
		r := &partitionReader{p: p, out: make(map[uint64]*Message)}
		err := func() error {
			var ms []*storage.Message
			for range n {
				m, err := r.Next(ctx)
				if err != nil {
					return err
				}
				r.Spill(m.Seq)
				ms = append(ms, m)
			}
			for i, m := range ms {
				resp, err := f.nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, nil)
				if err != nil {
					return fmt.Errorf("step %s down: %w", stream, err)
				}
				if !strings.Contains(string(resp.Data), `"success":true`) {
					return fmt.Errorf("step %s down: %s", stream, resp.Data)
				}
				t0 := time.Now()
				// Not the whole of ctx: a read that waits this long was
				// asked once and never answered.
				rctx, cancel := context.WithTimeout(ctx, polltest.Max)
				got, err := r.Reread(rctx, m.Seq)
				cancel()
				if err != nil {
					return fmt.Errorf("reread seq %d after a step-down: %w", m.Seq, err)
				}
				if len(got.Records) != 1 || string(got.Records[0].Data) != fmt.Sprintf("d:held/%d", i+1) {
					return fmt.Errorf("reread seq %d: %+v", m.Seq, got)
				}
				t.Logf("seq %d read again %v after a step-down", m.Seq, time.Since(t0).Round(time.Millisecond))
				if err := r.Ack(ctx, got); err != nil {
					return err
				}
			}
			return nil
		}()
		res <- err
		return err
	})
	defer stop()
	select {
	case err := <-res:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * polltest.Max * n):
		t.Fatal("deliver did not finish")
	}
}
