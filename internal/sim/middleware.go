package sim

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// incoming is an ingest request as the shared middleware read it.
type incoming struct {
	// Body is the request body, gzip-decoded when Content-Encoding: gzip;
	// nil when TooLarge.
	Body []byte
	// TooLarge: the decoded body is not strictly under Config.MaxBodyBytes.
	TooLarge bool
	// BadEncoding: the gzip stream could not be decoded, or another
	// Content-Encoding was named.
	BadEncoding bool
	// IngestHalf: only the first half of the events may be ingested (a
	// fault with IngestHalf).
	IngestHalf bool
	// Rec is this request's log entry; handlers fill Events, Devices, Users,
	// APIKey, Ingested and Duplicates (the middleware fills the rest).
	Rec *Record
}

// routeHandler is an ingest route's handler; describe, when not nil, fills
// in.Rec from the body for requests a fault answered instead.
type routeHandler struct {
	serve    func(w http.ResponseWriter, r *http.Request, in *incoming)
	describe func(in *incoming)
}

func (s *Sim) ingestMiddleware(h routeHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := s.newRecord(r)
		in := &incoming{Rec: rec}
		latency, f, hasFault, down := s.takeFault(r.URL.Path)
		sleepCtx(r.Context(), latency+f.Latency)
		if down == DownRefuse || down == DownClose {
			rec.Fault = "down-" + string(down)
			s.logRequest(rec)
			hijackClose(w)
			return
		}
		if hasFault && f.Drop == DropMidRequest {
			rec.Fault = "drop-" + string(f.Drop)
			if r.ContentLength > 1 {
				io.CopyN(io.Discard, r.Body, r.ContentLength/2)
			}
			s.logRequest(rec)
			hijackClose(w)
			return
		}
		release := s.readBody(r, in)
		defer release()
		rec.BodyBytes = len(in.Body)
		rec.Gzip = strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip")
		if in.Body != nil {
			r.Body = io.NopCloser(bytes.NewReader(in.Body))
			r.Header.Del("Content-Encoding")
		}
		// Answers are buffered so that the request is in the log (and its
		// events in the store) before the client can see the answer.
		bw := &bufferedWriter{h: w.Header()}
		drop := false
		switch {
		case down == Down503:
			rec.Fault = "down-503"
			s.describe(h, in)
			writeFault(bw, Fault{Status: http.StatusServiceUnavailable})
		case hasFault && f.Drop == DropNoAnswer:
			rec.Fault = "drop-" + string(f.Drop)
			s.faultIngest(h, r, in, f)
			drop = true
		case hasFault && (f.Drop == DropAfterIngest || f.Drop == DropMidResponse):
			rec.Fault = "drop-" + string(f.Drop)
			h.serve(bw, r, in)
			rec.Answered = bw.status // what it would have answered
			drop = true
		case hasFault && f.Status != 0:
			rec.Fault = "status"
			s.faultIngest(h, r, in, f)
			writeFault(bw, f)
		default:
			h.serve(bw, r, in)
		}
		if !drop {
			rec.Status = bw.status
			if rec.Status == 0 {
				rec.Status = http.StatusOK
			}
		}
		s.logRequest(rec)
		switch {
		case !drop:
			w.WriteHeader(rec.Status)
			w.Write(bw.buf.Bytes())
		case f.Drop == DropMidResponse:
			b := bw.buf.Bytes()
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
			w.WriteHeader(bw.status)
			w.Write(b[:len(b)/2])
			http.NewResponseController(w).Flush()
			hijackClose(w)
		default:
			hijackClose(w)
		}
	})
}

// faultIngest lets a failed request ingest what f.Ingest says (its answer
// is discarded), or only describes it.
func (s *Sim) faultIngest(h routeHandler, r *http.Request, in *incoming, f Fault) {
	if f.Ingest == IngestNone || in.Body == nil {
		s.describe(h, in)
		return
	}
	in.IngestHalf = f.Ingest == IngestHalf
	h.serve(&bufferedWriter{h: http.Header{}}, r, in)
}

func (s *Sim) describe(h routeHandler, in *incoming) {
	if h.describe != nil && in.Body != nil {
		h.describe(in)
	}
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// readBody reads (and gzip-decodes) the body; it must be strictly shorter
// than MaxBodyBytes. in.Body lives in pooled buffers that release returns
// when the request is done (handlers copy what they keep).
func (s *Sim) readBody(r *http.Request, in *incoming) (release func()) {
	max := int64(s.cfg.MaxBodyBytes)
	var bufs []*bytes.Buffer
	release = func() {
		for _, b := range bufs {
			if b.Cap() <= 4<<20 {
				b.Reset()
				bufPool.Put(b)
			}
		}
	}
	read := func(src io.Reader) ([]byte, error) {
		b := bufPool.Get().(*bytes.Buffer)
		bufs = append(bufs, b)
		_, err := b.ReadFrom(io.LimitReader(src, max))
		return b.Bytes(), err
	}
	raw, err := read(r.Body)
	if err != nil {
		in.BadEncoding = true
		return release
	}
	if int64(len(raw)) >= max {
		in.TooLarge = true
		return release
	}
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
		in.Body = raw
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			in.BadEncoding = true
			return release
		}
		dec, err := read(zr)
		if err != nil {
			in.BadEncoding = true
			return release
		}
		if int64(len(dec)) >= max {
			in.TooLarge = true
			return release
		}
		in.Body = dec
	default:
		in.BadEncoding = true
	}
	return release
}
