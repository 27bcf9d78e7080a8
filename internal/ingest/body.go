package ingest

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
)

// errTooLarge is returned by readCapped when the reader holds more than the
// limit.
var errTooLarge = errors.New("ingest: body larger than the limit")

// encoding is a request's Content-Encoding.
type encoding uint8

const (
	encIdentity encoding = iota
	encGzip
	encUnsupported
)

// parseEncoding classifies a Content-Encoding header value. Only a single
// coding is supported: "gzip" (or its alias "x-gzip") or "identity".
func parseEncoding(v []byte) encoding {
	v = bytes.TrimSpace(v)
	switch {
	case len(v) == 0, bytes.EqualFold(v, []byte("identity")):
		return encIdentity
	case bytes.EqualFold(v, []byte("gzip")), bytes.EqualFold(v, []byte("x-gzip")):
		return encGzip
	}
	return encUnsupported
}

// gunzipCapped inflates the gzip body src (one or more members) into dst[:0]
// and returns it. It reads at most limit+1 inflated bytes: a body that
// inflates to more than limit returns errTooLarge without inflating the rest,
// so memory stays bounded by about limit whatever the compression ratio.
// zr is reused when not nil; the reader to reuse is returned.
func gunzipCapped(dst []byte, zr *gzip.Reader, br *bytes.Reader, src []byte, limit int) ([]byte, *gzip.Reader, error) {
	br.Reset(src)
	if zr == nil {
		var err error
		if zr, err = gzip.NewReader(br); err != nil {
			return dst[:0], nil, err
		}
	} else if err := zr.Reset(br); err != nil {
		return dst[:0], zr, err
	}
	// A good first guess at the size saves most regrowth.
	if want := min(4*len(src), limit+1); cap(dst) < want {
		dst = make([]byte, 0, want)
	}
	out, err := readCapped(dst[:0], zr, limit)
	return out, zr, err
}

// readCapped appends r's content to dst, never holding more than limit+1
// bytes of it; when r has more than limit bytes it returns errTooLarge.
func readCapped(dst []byte, r io.Reader, limit int) ([]byte, error) {
	start := len(dst)
	for {
		if len(dst)-start > limit {
			return dst, errTooLarge
		}
		if len(dst) == cap(dst) {
			// Grow by doubling, never past limit+1 bytes of content.
			n := min(max(2*cap(dst), 32<<10), start+limit+1)
			nb := make([]byte, len(dst), n)
			copy(nb, dst)
			dst = nb
		}
		n, err := r.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if err == io.EOF {
			if len(dst)-start > limit {
				return dst, errTooLarge
			}
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}
