package sim

import (
	"bytes"
	"io"
	"net/http"
	"strings"
)

// Faults is the seam of test-only fault injection: internal/simtest
// implements it; the product leaves Config.Faults nil, so no request is
// ever failed on purpose and no route beyond the read-outs is under /sim/.
type Faults interface {
	// Serve answers x in the Sim's place: with x.Answer (the Sim's own
	// answer, logged), or by failing it with Exchange's steps and logging
	// it once (x.Log).
	Serve(x *Exchange)
	// Routes adds the implementation's routes to the /sim/ control mux of
	// s (called once, by New).
	Routes(s *Sim, ctl *http.ServeMux)
}

// Exchange is one upstream request on its way to its answer.
type Exchange struct {
	W   http.ResponseWriter
	R   *http.Request
	Rec *Record // its log entry; a fault fills Fault, Status and Answered
	// Direct routes (management and data APIs) read their body and answer
	// straight to W (unbuffered: export archives are gigabytes);
	// ingest routes have their body read (ReadBody) and their answer
	// buffered, so that a request is logged before its answer is seen.
	Direct bool
	// Streams: the route's answer may be large (an export archive).
	Streams bool

	s       *Sim
	h       routeHandler
	in      incoming
	release func()
}

// ReadBody reads and decodes an ingest request's body (once; later calls
// do nothing), and counts it in Rec.
func (x *Exchange) ReadBody() {
	if x.Direct || x.release != nil {
		return
	}
	x.release = x.s.readBody(x.R, &x.in)
	x.Rec.BodyBytes = len(x.in.Body)
	x.Rec.Gzip = strings.EqualFold(x.R.Header.Get("Content-Encoding"), "gzip")
	if x.in.Body != nil {
		x.R.Body = io.NopCloser(bytes.NewReader(x.in.Body))
		x.R.Header.Del("Content-Encoding")
	}
}

// Describe fills Rec from an ingest request's body (key label, events) for
// a request that is failed without being handled.
func (x *Exchange) Describe() {
	x.ReadBody()
	if x.h.describe != nil && x.in.Body != nil {
		x.h.describe(&x.in)
	}
}

// Handle runs the route with its answer to w and returns the status
// answered; with half, an ingest route ingests only the first half of the
// events. It neither logs nor sets Rec.Status.
func (x *Exchange) Handle(w http.ResponseWriter, half bool) int {
	x.ReadBody()
	x.in.IngestHalf = half
	status, body := x.h.serve(w, x.R, &x.in)
	writeJSON(w, status, body)
	return status
}

// Answer gives the request the Sim's own answer and logs it.
func (x *Exchange) Answer() {
	if x.Direct {
		x.Rec.Status = x.Handle(x.W, false)
		x.Log()
		return
	}
	bw := &bufferedWriter{h: x.W.Header()}
	x.Rec.Status = x.Handle(bw, false)
	x.Log()
	x.W.WriteHeader(x.Rec.Status)
	x.W.Write(bw.Bytes())
}

// serve logs x as a new request, passes it to Config.Faults or answers
// it, and returns the status answered (0: none, the connection was dropped).
func (s *Sim) serve(x *Exchange) int {
	s.mu.Lock()
	s.store.reqSeq++
	x.s, x.Rec = s, &Record{Seq: s.store.reqSeq, Time: s.cfg.Now(), Method: x.R.Method, Path: x.R.URL.Path}
	s.mu.Unlock()
	x.in.Rec = x.Rec
	if s.cfg.Faults != nil {
		s.cfg.Faults.Serve(x)
	} else {
		x.Answer()
	}
	if x.release != nil {
		x.release()
	}
	return x.Rec.Status
}

// bufferedWriter holds a handler's answer until the request is logged.
type bufferedWriter struct {
	h http.Header
	bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header { return b.h }
func (*bufferedWriter) WriteHeader(int)       {}
