package fleet

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/natstest"
	"github.com/svcrelay/relay/internal/storage"
)

// TestFleetCompressGate: a relay writes a kind's messages in the best codec
// every member of the kind reads: zstd while every member reads it, S2
// while a member of before reads S2 only, plain while one (its heartbeat
// without a marker) reads neither, so that a rolling upgrade dead-letters
// nothing as damaged; the members of before leaving turn zstd on again.
// Every message reads back whole either way.
func TestFleetCompressGate(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node NATS cluster")
	}
	t.Parallel()
	e := &testEnv{c: natstest.Start(t, natstest.Config{})}
	ns := e.namespace()
	nc := e.connect(t)
	// Members are listed while their heartbeat is younger than the TTL: one
	// long enough that a loaded machine does not delay the members of
	// before's beats past it (they would leave, and zstd be right).
	f := e.open(t, nc, Config{Namespace: ns, Partitions: 1, LeaseTTL: 20 * time.Second, Name: "relay-new"})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	hold := func(ctx context.Context, _ storage.Reader) error { <-ctx.Done(); return nil }
	wg.Go(func() { f.Backend().Only(storage.KindEvents).Run(ctx, hold) }) //nolint:errcheck // ends with ctx

	var recs []storage.Record
	for i := range 50 {
		recs = append(recs, storage.Record{OrderKey: []byte("d:1"),
			Data: fmt.Appendf(nil, `{"event_type":"screen","device_id":"device-1","event_properties":{"n":%d}}`, i)})
	}
	st, err := f.js.Stream(bg(t), f.n.stream(storage.KindEvents, 0))
	if err != nil {
		t.Fatal(err)
	}
	// appendVersion appends recs and returns the codec version of the
	// message stored, after checking that it reads back whole.
	appendVersion := func() byte {
		t.Helper()
		if err := f.Append(bg(t), Request{Lane: lane, Records: recs}); err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(bg(t))
		if err != nil {
			t.Fatal(err)
		}
		raw, err := st.GetMsg(bg(t), info.State.LastSeq)
		if err != nil {
			t.Fatal(err)
		}
		_, got, err := decode(raw.Data)
		if err != nil || len(got) != len(recs) || !bytes.Equal(got[49].Data, recs[49].Data) {
			t.Fatalf("read back: %v, %d records", err, len(got))
		}
		return raw.Data[0]
	}
	waitFor(t, time.Minute, "zstd messages with every member new", func() bool { return appendVersion() == codecZstd })

	// Members of before join, one at a time: their heartbeats are the time
	// and the S2 marker, then the time alone.
	oldCtx, oldStop := context.WithCancel(ctx)
	var oldWG sync.WaitGroup
	defer func() { oldStop(); oldWG.Wait() }()
	beat := func(name, value string) {
		oldWG.Go(func() {
			for oldCtx.Err() == nil {
				f.kv.Put(oldCtx, "m.events."+name, []byte(time.Now().UTC().Format(time.RFC3339)+value)) //nolint:errcheck // retried
				select {
				case <-oldCtx.Done():
				case <-time.After(300 * time.Millisecond):
				}
			}
		})
	}
	beat("relay-s2", readsS2)
	waitFor(t, time.Minute, "S2 messages with a member reading S2 only", func() bool { return appendVersion() == codecS2 })
	for range 5 {
		if v := appendVersion(); v != codecS2 {
			t.Fatalf("version %d written while a member reading S2 only lives", v)
		}
	}
	beat("relay-old", "")
	waitFor(t, time.Minute, "plain messages with a member of before", func() bool { return appendVersion() == codecPlain })
	for range 5 {
		if v := appendVersion(); v != codecPlain {
			t.Fatalf("version %d written while a member of before lives", v)
		}
	}
	oldStop()
	oldWG.Wait()
	waitFor(t, 2*time.Minute, "zstd messages again once the members of before left", func() bool { return appendVersion() == codecZstd })
}

// BenchmarkEncode encodes a message of one SDK request as bench/fleet
// sends it, in each codec: 50 events of about 400 bytes whose properties
// have random values (they compress about as real events do).
func BenchmarkEncode(b *testing.B) {
	var recs []storage.Record
	var seed uint32 = 1
	for i := range 50 {
		var d bytes.Buffer
		fmt.Fprintf(&d, `{"event_type":"bench","device_id":"device-000001","insert_id":"%08x-%08x","event_properties":{"n":%d`, seed, i, i)
		for j := range 17 {
			seed = seed*1664525 + 1013904223
			fmt.Fprintf(&d, `,"p%02d":"%08x"`, j, seed)
		}
		d.WriteString("}}")
		recs = append(recs, storage.Record{OrderKey: []byte("d:1"), Data: d.Bytes()})
	}
	h := &header{lane: lane, accepted: time.Now()}
	part := encodeRecords(nil, recs)
	for _, c := range []struct {
		name  string
		codec byte
	}{{"plain", codecPlain}, {"s2", codecS2}, {"zstd", codecZstd}} {
		b.Run(c.name, func(b *testing.B) {
			var dst []byte
			b.ReportAllocs()
			b.SetBytes(int64(len(part)))
			for b.Loop() {
				dst = encodeMessage(dst[:0], h, len(recs), [][]byte{part}, c.codec)
			}
			b.ReportMetric(float64(len(part))/float64(len(dst)), "ratio")
		})
	}
}
