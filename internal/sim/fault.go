package sim

import (
	"bytes"
	"context"
	"net/http"
	"time"
)

// DropMode says how an injected fault drops the connection.
type DropMode string

// Drop modes.
const (
	// DropNone answers normally (or with Fault.Status).
	DropNone DropMode = ""
	// DropNoAnswer reads the request, then closes the connection without
	// answering. Nothing is ingested.
	DropNoAnswer DropMode = "no-answer"
	// DropMidRequest reads about half of the request body, then closes the
	// connection (an upload cut off). Nothing is ingested.
	DropMidRequest DropMode = "mid-request"
	// DropAfterIngest handles the request normally (a 200 ingests its
	// events), then closes the connection without answering: the lost
	// answer a retry with insert_id makes safe.
	DropAfterIngest DropMode = "after-ingest"
	// DropMidResponse handles the request normally, then sends the status
	// line, headers and half of the body and closes the connection.
	DropMidResponse DropMode = "mid-response"
)

// DownMode says how the Sim behaves while down (Faults.Take).
type DownMode string

// Down modes.
const (
	// DownRefuse: connections are refused (simtest closes its listeners
	// and cuts open connections; a request that still arrives is dropped
	// as with DownClose).
	DownRefuse DownMode = "refuse"
	// Down503 answers every ingest request 503 {"code":503,...}.
	Down503 DownMode = "503"
	// DownClose reads each ingest request and closes the connection without
	// answering; /sim/ routes keep working.
	DownClose DownMode = "close"
)

// Fault is how the upstream fails one ingest request: the answer it sends
// instead of its own, or how it drops the connection, and what of the
// request it ingested first (the readings of "the request may not have been
// accepted"). The product never fails on purpose; internal/simtest
// queues faults through Config.Faults.
type Fault struct {
	// Status is the HTTP status to answer (e.g. 500, 502, 503, 504, or any
	// other); 0 with Drop set drops instead; 0 without Drop only applies Latency.
	Status int
	// Body is the answer's body; nil means {"code":Status,"error":"..."}.
	// Any bytes (also non-JSON) are sent as given.
	Body []byte
	// ContentType of Body; "" means application/json for the default body
	// and text/plain otherwise.
	ContentType string
	// Drop drops the connection instead of answering (see DropMode).
	Drop DropMode
	// Latency is added (real time) before the request is handled.
	Latency time.Duration
	// Ingest is what a Status or DropNoAnswer fault lets the request
	// ingest before it answers the fault: the document's "The request may
	// not have been accepted" read as accepted in full, in part, or (the
	// zero value) not at all.
	Ingest IngestMode
}

// Faults is the seam of test-only fault injection: internal/simtest
// implements it, the product leaves Config.Faults nil (no request is ever
// failed on purpose and no route beyond the read-outs is under /sim/).
type Faults interface {
	// Take decides what happens to one ingest request of path: latency to
	// add before it is handled, the fault to apply when ok, and the down
	// mode when not "" (then f and ok are ignored).
	Take(path string) (latency time.Duration, f Fault, ok bool, down DownMode)
	// Routes adds the implementation's routes to the /sim/ control mux of
	// s (called once, by New).
	Routes(s *Sim, ctl *http.ServeMux)
}

// IngestMode says what of a request a failed answer ingested.
type IngestMode string

// Ingest modes.
const (
	// IngestNone: nothing (a non-200 answer ingests nothing).
	IngestNone IngestMode = ""
	// IngestAll: the request is handled (ingested when valid and under the
	// limits), then the fault is answered instead.
	IngestAll IngestMode = "all"
	// IngestHalf: the first half of the request's events are handled so.
	IngestHalf IngestMode = "half"
)

// takeFault asks Config.Faults what happens to one request (nothing
// without it).
func (s *Sim) takeFault(path string) (latency time.Duration, f Fault, ok bool, down DownMode) {
	if s.cfg.Faults == nil {
		return 0, Fault{}, false, ""
	}
	return s.cfg.Faults.Take(path)
}

// serveDirect serves a route whose answer goes straight to the client (not
// buffered: export archives are gigabytes) and logs it; it returns the
// status answered. What the Faults seam gives r's path (after its latency),
// a down state or a fault, is answered instead of serve (through sw, or by
// closing w's connection). With cutMid, a DropMidResponse fault is served
// and cut after 64 KiB by sw; without, it is a drop like the others.
func (s *Sim) serveDirect(w http.ResponseWriter, r *http.Request, cutMid bool, serve func(sw *statusWriter, rec *Record)) int {
	rec := s.newRecord(r)
	sw := &statusWriter{ResponseWriter: w}
	latency, f, hasFault, down := s.takeFault(r.URL.Path)
	sleepCtx(r.Context(), latency+f.Latency)
	switch {
	case down == DownRefuse || down == DownClose:
		rec.Fault = "down-" + string(down)
		hijackClose(w)
	case down == Down503:
		rec.Fault = "down-503"
		writeFault(sw, Fault{Status: http.StatusServiceUnavailable})
	case hasFault && f.Drop == DropMidResponse && cutMid:
		rec.Fault = "drop-" + string(f.Drop)
		sw.cutAfter = 64 << 10
		serve(sw, rec)
	case hasFault && f.Drop != DropNone:
		rec.Fault = "drop-" + string(f.Drop)
		hijackClose(w)
	case hasFault && f.Status != 0:
		rec.Fault = "status"
		writeFault(sw, f)
	default:
		serve(sw, rec)
	}
	rec.Status = sw.status
	if sw.cut {
		rec.Answered, rec.Status = sw.status, 0
	}
	s.logRequest(rec)
	return rec.Status
}

func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func writeFault(w http.ResponseWriter, f Fault) {
	body, ct := f.Body, f.ContentType
	if body == nil {
		body = appendJSON(nil, errBody{Code: f.Status, Error: defaultErrorText(f.Status)})
		if ct == "" {
			ct = "application/json"
		}
	}
	if ct == "" {
		ct = "text/plain; charset=utf-8"
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(f.Status)
	w.Write(body)
}

func defaultErrorText(status int) string {
	if t := http.StatusText(status); t != "" {
		return t
	}
	return "Error"
}

// hijackClose closes the request's connection without answering.
func hijackClose(w http.ResponseWriter) bool {
	c, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// bufferedWriter captures a handler's answer so the middleware can drop it.
type bufferedWriter struct {
	h      http.Header
	status int
	buf    bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header { return b.h }
func (b *bufferedWriter) WriteHeader(code int) {
	if b.status == 0 {
		b.status = code
	}
}
func (b *bufferedWriter) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = 200
	}
	return b.buf.Write(p)
}
