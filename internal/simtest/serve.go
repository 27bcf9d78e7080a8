package simtest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/svcrelay/relay/internal/sim"
)

// serve answers one upstream request (sim.Faults.Serve): after the latency,
// by the down state or the fault take gives it, else as the Sim does.
func (s *Sim) serve(x *sim.Exchange) {
	latency, f, hasFault, down := s.take(x.R.URL.Path)
	sleepCtx(x.R.Context(), latency+f.Latency)
	switch {
	case down == DownRefuse || down == DownClose:
		x.Rec.Fault = "down-" + string(down)
		x.Log()
		hijackClose(x.W)
	case !hasFault && down == "":
		x.Answer()
	case x.Direct:
		serveDirect(x, f, hasFault, down)
	case hasFault && f.Drop == DropMidRequest:
		x.Rec.Fault = "drop-" + string(f.Drop)
		if x.R.ContentLength > 1 {
			io.CopyN(io.Discard, x.R.Body, x.R.ContentLength/2)
		}
		x.Log()
		hijackClose(x.W)
	default:
		serveIngest(x, f, down)
	}
}

// serveIngest fails an ingest request, whose answer is buffered so that the
// request is in the log (and its events in the store) before the client
// sees anything.
func serveIngest(x *sim.Exchange, f Fault, down DownMode) {
	x.ReadBody()
	rec, w := x.Rec, x.W
	bw := httptest.NewRecorder()
	drop := false
	switch {
	case down == Down503:
		rec.Fault = "down-503"
		x.Describe()
		writeFault(bw, Fault{Status: http.StatusServiceUnavailable})
	case f.Drop == DropNoAnswer:
		rec.Fault = "drop-" + string(f.Drop)
		faultIngest(x, f)
		drop = true
	case f.Drop == DropAfterIngest || f.Drop == DropMidResponse:
		rec.Fault = "drop-" + string(f.Drop)
		rec.Answered = x.Handle(bw, false) // what it would have answered
		drop = true
	case f.Status != 0:
		rec.Fault = "status"
		faultIngest(x, f)
		writeFault(bw, f)
	default: // a latency-only fault
		x.Answer()
		return
	}
	if !drop {
		rec.Status = bw.Code
	}
	x.Log()
	maps.Copy(w.Header(), bw.Header())
	switch {
	case !drop:
		w.WriteHeader(rec.Status)
		w.Write(bw.Body.Bytes())
	case f.Drop == DropMidResponse:
		b := bw.Body.Bytes()
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(bw.Code)
		w.Write(b[:len(b)/2])
		http.NewResponseController(w).Flush()
		hijackClose(w)
	default:
		hijackClose(w)
	}
}

// faultIngest lets a failed request ingest what f.Ingest says (its answer
// is discarded: a body the route refuses ingests nothing), or only
// describes it.
func faultIngest(x *sim.Exchange, f Fault) {
	if f.Ingest == IngestNone {
		x.Describe()
		return
	}
	x.Handle(httptest.NewRecorder(), f.Ingest == IngestHalf)
}

// serveDirect fails a management or data API request, whose answer goes
// straight to the client: a mid-response drop of a streaming route is cut
// after 64 KiB, of another route it is a drop like the others.
func serveDirect(x *sim.Exchange, f Fault, hasFault bool, down DownMode) {
	rec := x.Rec
	switch {
	case down == Down503:
		rec.Fault = "down-503"
		writeFault(x.W, Fault{Status: http.StatusServiceUnavailable})
		rec.Status = http.StatusServiceUnavailable
	case hasFault && f.Drop == DropMidResponse && x.Streams:
		rec.Fault = "drop-" + string(f.Drop)
		cw := &cutWriter{ResponseWriter: x.W, cutAfter: 64 << 10}
		if rec.Status = x.Handle(cw, false); cw.cut {
			rec.Answered, rec.Status = rec.Status, 0
		}
	case hasFault && f.Drop != DropNone:
		rec.Fault = "drop-" + string(f.Drop)
		hijackClose(x.W)
	case hasFault && f.Status != 0:
		rec.Fault = "status"
		writeFault(x.W, f)
		rec.Status = f.Status
	default: // a latency-only fault
		x.Answer()
		return
	}
	x.Log()
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

// writeFault answers with the fault's status and body.
func writeFault(w http.ResponseWriter, f Fault) {
	body, ct := f.Body, f.ContentType
	if body == nil {
		text := http.StatusText(f.Status)
		if text == "" {
			text = "Error"
		}
		body, _ = json.Marshal(struct {
			Code  int    `json:"code"`
			Error string `json:"error"`
		}{f.Status, text})
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

// hijackClose closes the request's connection without answering.
func hijackClose(w http.ResponseWriter) {
	if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
		c.Close()
	}
}

// cutWriter closes the connection once cutAfter body bytes were written.
type cutWriter struct {
	http.ResponseWriter
	written, cutAfter int64
	cut               bool
}

var errCut = errors.New("simtest: response cut")

func (w *cutWriter) Write(b []byte) (int, error) {
	if w.cut {
		return 0, errCut
	}
	if w.written+int64(len(b)) > w.cutAfter {
		n, _ := w.ResponseWriter.Write(b[:w.cutAfter-w.written])
		w.written += int64(n)
		http.NewResponseController(w.ResponseWriter).Flush()
		w.cut = true
		hijackClose(w.ResponseWriter)
		return n, errCut
	}
	n, err := w.ResponseWriter.Write(b)
	w.written += int64(n)
	return n, err
}

func (w *cutWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
