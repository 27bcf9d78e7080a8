package sim

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
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
	// IngestHalf: only the first half of the events may be ingested
	// (Exchange.Handle with half).
	IngestHalf bool
	// Rec is this request's log entry; handlers fill Events, Devices, Users,
	// APIKey, Ingested and Duplicates (the middleware fills the rest).
	Rec *Record
}

// routeHandler is a route's handler: serve returns its answer (see
// writeAnswer); describe, when not nil, fills an ingest request's in.Rec
// from the body for requests a fault answered instead (Exchange.Describe).
type routeHandler struct {
	serve    func(w http.ResponseWriter, r *http.Request, in *incoming) (status int, body any)
	describe func(in *incoming)
}

// route registers an ingest route: each request is an Exchange whose
// handler fills what it did into in.Rec (the Exchange the status, time and
// fault).
func (s *Sim) route(pattern string, h routeHandler) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		s.serve(&Exchange{W: w, R: r, h: h})
	})
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
	// read reads src into a pooled buffer; ok is false (and in says why)
	// when it cannot be read or is not under max.
	read := func(src io.Reader) (b []byte, ok bool) {
		buf := bufPool.Get().(*bytes.Buffer)
		bufs = append(bufs, buf)
		_, err := buf.ReadFrom(io.LimitReader(src, max))
		in.BadEncoding, in.TooLarge = err != nil, err == nil && int64(buf.Len()) >= max
		return buf.Bytes(), !in.BadEncoding && !in.TooLarge
	}
	raw, ok := read(r.Body)
	if !ok {
		return release
	}
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
		in.Body = raw
	case "gzip", "x-gzip":
		if zr, err := gzip.NewReader(bytes.NewReader(raw)); err != nil {
			in.BadEncoding = true
		} else if dec, ok := read(zr); ok {
			in.Body = dec
		}
	default:
		in.BadEncoding = true
	}
	return release
}
