package ingest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
)

// appender is a storage.Appender that keeps what it was asked (the lane,
// id, time and records of each request, copied) and answers err.
type appender struct {
	err  error
	reqs []storage.Request // Batch nil; recs holds the records
	recs [][]storage.Record
}

func (a *appender) Append(_ context.Context, req storage.Request) error {
	var recs []storage.Record
	for _, r := range req.Batch.Records() {
		recs = append(recs, storage.Record{OrderKey: clone(r.OrderKey), UserID: clone(r.UserID), Data: clone(r.Data)})
	}
	req.APIKey, req.Options, req.Batch = clone(req.APIKey), clone(req.Options), nil
	a.reqs, a.recs = append(a.reqs, req), append(a.recs, recs)
	return a.err
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

// TestStore: a request is one storage.Request to the Server's store (any
// backend: here one that answers as told), of lane (events, api_key,
// canonical options), accepted at Config.Now, no id (the fleet makes one),
// the records the local spool gets; 200 only when Append returned nil. The
// store's errors, the local spool's and the fleet's kinds alike, are
// answered 503 with Retry-After and counted under their reasons.
func TestStore(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_123)
	body := []byte(`{"api_key":"k-store","options":{ "min_id_length" : 1 },"events":[` +
		`{"device_id":"dev-1","user_id":"user-1","event_type":"a","insert_id":"i1","time":1700000000000},` +
		`{"device_id":"dev-2","event_type":"b","insert_id":"i2","time":1700000000001,"ip":"10.1.2.3"}]}`)
	call := func(t *testing.T, st storage.Appender) (*fasthttp.RequestCtx, *testRelay) {
		t.Helper()
		reg := prometheus.NewRegistry()
		s, err := New(Config{Now: func() time.Time { return now }}, st, event.NewIDGen(), nil, reg)
		if err != nil {
			t.Fatal(err)
		}
		var rc fasthttp.RequestCtx
		callInProcess(s.strictHandle, inProcessRequest("/2/httpapi", body, "Content-Type", "application/json"), &rc)
		return &rc, &testRelay{t: t, reg: reg}
	}

	ok := &appender{}
	rc, _ := call(t, ok)
	if rc.Response.StatusCode() != 200 || len(ok.reqs) != 1 {
		t.Fatalf("%d %s, %d appends", rc.Response.StatusCode(), rc.Response.Body(), len(ok.reqs))
	}
	req := ok.reqs[0]
	if req.Lane() != (storage.LaneKey{Kind: storage.KindEvents, APIKey: "k-store", Options: `{"min_id_length":1}`}) ||
		req.ID != "" || !req.Accepted.Equal(now) {
		t.Errorf("request %+v (lane %+v)", req, req.Lane())
	}
	// The same records as the local spool holds.
	r := startRelay(t, Config{Now: func() time.Time { return now }}, spool.Config{NoSync: true})
	if a := r.post("/2/httpapi", body); a.status != 200 {
		t.Fatalf("local: %d %s", a.status, a.body)
	}
	want := r.drain("k-store", `{"min_id_length":1}`)
	if len(ok.recs[0]) != len(want) {
		t.Fatalf("%d records, the spool holds %d", len(ok.recs[0]), len(want))
	}
	for i, g := range ok.recs[0] {
		w := want[i]
		if string(g.OrderKey) != w.orderKey || string(g.UserID) != w.userID || string(g.Data) != string(w.data) {
			t.Errorf("record %d:\n got %q %q %s\nwant %q %q %s", i, g.OrderKey, g.UserID, g.Data, w.orderKey, w.userID, w.data)
		}
	}

	for _, c := range []struct {
		err         error
		msg, reason string
	}{
		{fmt.Errorf("%w: %w", storage.ErrFull, spool.ErrFull), "Spool full, retry later", reasonSpoolFull},
		{fmt.Errorf("%w: %w", storage.ErrFull, spool.ErrDiskLow), "Disk space low, retry later", reasonDiskLow},
		{fmt.Errorf("storage: lane: %w", spool.ErrTooManyLanes), "Too many lanes, retry later", reasonTooManyLanes},
		{fmt.Errorf("storage: lane: %w", spool.ErrClosed), "Service is shutting down", reasonShuttingDown},
		{fmt.Errorf("%w: write: disk on fire", storage.ErrUnavailable), "Service unavailable", reasonSpoolError},
		// The fleet's kinds: no spool error in the chain.
		{fmt.Errorf("fleet: %w: insufficient resources", storage.ErrFull), "Spool full, retry later", reasonSpoolFull},
		{fmt.Errorf("fleet: %w", storage.ErrLost), "Service is shutting down", reasonShuttingDown},
		{context.Canceled, "Service is shutting down", reasonShuttingDown},
		{errors.New("nats: connection closed"), "Service unavailable", reasonSpoolError},
	} {
		rc, r := call(t, &appender{err: c.err})
		if rc.Response.StatusCode() != 503 || string(rc.Response.Header.Peek("Retry-After")) == "" ||
			!strings.Contains(string(rc.Response.Body()), c.msg) {
			t.Errorf("%v: %d %q %s, want 503 %q", c.err, rc.Response.StatusCode(), rc.Response.Header.Peek("Retry-After"), rc.Response.Body(), c.msg)
		}
		if got := r.counter("relay_ingest_rejected_requests_total", "reason", c.reason); got != 1 {
			t.Errorf("%v: %v rejections of reason %s", c.err, got, c.reason)
		}
		if got := r.counter("relay_ingest_events_rejected_total", "reason", c.reason); got != 2 {
			t.Errorf("%v: %v events rejected for %s", c.err, got, c.reason)
		}
	}
}
