package ingest

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// Framing faults fasthttp accepts but RFC 9112 makes errors. fasthttp already
// refuses two Content-Length or two Transfer-Encoding fields, a
// Transfer-Encoding other than chunked (or identity), and Transfer-Encoding
// on HTTP/1.0. It parses the rest leniently: it lets Transfer-Encoding win
// over Content-Length and joins obs-fold lines, and keeps the first of two
// Content-Encoding fields. Its parsed header cannot show these, so the raw
// header block (RequestHeader.RawHeaders, a copy fasthttp keeps of every
// request's head) is scanned once per request.
const (
	headOK = iota
	headCLWithTE
	headObsFold
	headRepeatedCE
)

var headFaultMsgs = [...]string{
	headCLWithTE:   "Content-Length with Transfer-Encoding",
	headObsFold:    "Obsolete header line folding",
	headRepeatedCE: "Repeated Content-Encoding",
}

// checkHead returns the first framing fault of a raw header block (the
// header lines after the request line, each ending in LF or CRLF), or headOK.
// It reads each byte at most twice and allocates nothing.
func checkHead(raw []byte) int {
	var cl, te, ce int
	for len(raw) > 0 {
		n := bytes.IndexByte(raw, '\n')
		line := raw
		if n >= 0 {
			line, raw = raw[:n], raw[n+1:]
		} else {
			raw = nil
		}
		if len(line) > 0 && line[len(line)-1] == '\r' {
			line = line[:len(line)-1]
		}
		if len(line) == 0 {
			break // the blank line that ends the head
		}
		if line[0] == ' ' || line[0] == '\t' {
			return headObsFold
		}
		colon := bytes.IndexByte(line, ':')
		if colon < 0 {
			continue // fasthttp refuses it
		}
		switch key := line[:colon]; len(key) {
		case len("content-length"):
			if bytes.EqualFold(key, []byte("content-length")) {
				cl++
			}
		case len("transfer-encoding"):
			if bytes.EqualFold(key, []byte("transfer-encoding")) {
				te++
			}
		case len("content-encoding"):
			if bytes.EqualFold(key, []byte("content-encoding")) {
				ce++
			}
		}
	}
	switch {
	case cl > 0 && te > 0:
		return headCLWithTE
	case ce > 1:
		return headRepeatedCE
	}
	return headOK
}

// strictHandle refuses requests whose head checkHead faults with 400 and
// closes their connection (whatever follows the body on it, e.g. a request
// smuggled behind a chunked body that a Content-Length would have covered,
// is never read), and passes the others to handle. A request on a
// connection Shutdown closed is answered 503 first (see busy).
func (s *Server) strictHandle(ctx *fasthttp.RequestCtx) {
	if !s.busy(ctx) {
		return
	}
	if f := checkHead(ctx.Request.Header.RawHeaders()); f != headOK {
		s.refuseHead(ctx, f)
		return
	}
	s.handle(ctx)
}

// refuseHead answers 400 for a head fault and closes the connection.
func (s *Server) refuseHead(ctx *fasthttp.RequestCtx, f int) {
	ctx.SetConnectionClose()
	s.rejectf(ctx, pathOther, fasthttp.StatusBadRequest, headFaultMsgs[f], reasonBadHTTP, 0)
	s.m.request(pathOther, fasthttp.StatusBadRequest)
}

// expect decides an `Expect: 100-continue` request before its body is sent
// (fasthttp.Server.ExpectHandler): a head fault gets 400, a Content-Length
// that is certainly too large gets 413, and neither gets `100 Continue`;
// fasthttp then closes the connection without calling the handler. Others
// get 100 Continue and go on as any request.
func (s *Server) expect(ctx *fasthttp.RequestCtx) int {
	if f := checkHead(ctx.Request.Header.RawHeaders()); f != headOK {
		s.refuseHead(ctx, f)
		return fasthttp.StatusBadRequest
	}
	limit := s.readLimit // a compressed body may inflate below the limit
	if parseEncoding(ctx.Request.Header.ContentEncoding()) == encIdentity {
		limit = s.maxBody
	}
	if n := ctx.Request.Header.ContentLength(); n > limit {
		p := classifyPath(ctx.Path())
		s.rejectf(ctx, p, fasthttp.StatusRequestEntityTooLarge, "Payload too large", reasonTooLarge, 0)
		s.m.request(p, fasthttp.StatusRequestEntityTooLarge)
		return fasthttp.StatusRequestEntityTooLarge
	}
	return fasthttp.StatusContinue
}
