package ingest

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// idRecorder is a storage.Appender (a real one, the local spool behind the
// seam) that remembers the request ids it was given.
type idRecorder struct {
	storage.Appender
	mu  sync.Mutex
	ids []string
}

func (r *idRecorder) Append(ctx context.Context, req storage.Request) error {
	r.mu.Lock()
	r.ids = append(r.ids, req.ID)
	r.mu.Unlock()
	return r.Appender.Append(ctx, req)
}

func openStoreSpool(t *testing.T, cfg spool.Config) *spool.Spool {
	t.Helper()
	cfg.Dir = t.TempDir()
	cfg.MinFreeBytes = -1
	sp, err := spool.Open(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	return sp
}

// TestStore (fleet mode, issue 22): with Config.Store, a request is appended
// through it, with the records the spool path stores byte for byte, one
// fresh id per request, and 200 only once Append returned nil; a refusal
// is a 503 with Retry-After and nothing stored.
func TestStore(t *testing.T) {
	body := []byte(`{"api_key":"k-store","options":{"min_id_length":1},"events":[` +
		`{"device_id":"dev-1","user_id":"user-1","event_type":"a","insert_id":"i1","time":1700000000000},` +
		`{"device_id":"dev-2","event_type":"b","insert_id":"i2","time":1700000000001,"ip":"10.1.2.3"},` +
		`{"user_id":"user-3","event_type":"c","insert_id":"i3","time":1700000000002}]}`)
	for _, anon := range []bool{false, true} {
		local := startRelay(t, Config{Open: Open{AnonymizeIP: anon}}, spool.Config{})
		if a := local.post("/2/httpapi", body); a.status != 200 {
			t.Fatalf("local: %d %s", a.status, a.body)
		}
		want := local.drain("k-store", `{"min_id_length":1}`)

		ssp := openStoreSpool(t, spool.Config{})
		rec := &idRecorder{Appender: storage.NewLocal(ssp, nil)}
		r := startRelay(t, Config{Store: rec, Open: Open{AnonymizeIP: anon}}, spool.Config{})
		for range 2 {
			if a := r.post("/2/httpapi", body); a.status != 200 {
				t.Fatalf("store: %d %s", a.status, a.body)
			}
		}
		// Nothing in the relay's own spool: it went to the store.
		if got := r.drain("k-store", `{"min_id_length":1}`); len(got) != 0 {
			t.Fatalf("%d records in the relay's spool", len(got))
		}
		own := r.sp
		r.sp = ssp // drain the store's spool
		got := r.drain("k-store", `{"min_id_length":1}`)
		r.sp = own
		if len(got) != 2*len(want) {
			t.Fatalf("store holds %d records, want %d", len(got), 2*len(want))
		}
		for i, g := range got {
			w := want[i%len(want)]
			if g.orderKey != w.orderKey || g.userID != w.userID || !bytes.Equal(g.data, w.data) {
				t.Errorf("anon %v record %d:\n got %q %q %s\nwant %q %q %s", anon, i, g.orderKey, g.userID, g.data, w.orderKey, w.userID, w.data)
			}
		}
		if len(rec.ids) != 2 || rec.ids[0] == rec.ids[1] || rec.ids[0] == "" || len(rec.ids[0]) > 64 {
			t.Errorf("request ids %q: want two distinct, non-empty, at most 64 bytes", rec.ids)
		}
	}

	// Full: 503 with Retry-After, nothing stored.
	full := openStoreSpool(t, spool.Config{MaxBytes: 64})
	r := startRelay(t, Config{Store: storage.NewLocal(full, nil)}, spool.Config{})
	a := r.post("/2/httpapi", body)
	if a.status != 503 || a.header.Get("Retry-After") == "" {
		t.Fatalf("full store: %d %q %s", a.status, a.header.Get("Retry-After"), a.body)
	}
	if n := full.Stats().LiveBytes; n != 0 {
		t.Fatalf("full store holds %d bytes", n)
	}
	// A closed store: 503 with Retry-After.
	full.Close()
	if a := r.post("/2/httpapi", body); a.status != 503 || a.header.Get("Retry-After") == "" {
		t.Fatalf("closed store: %d %s", a.status, a.body)
	}
}
