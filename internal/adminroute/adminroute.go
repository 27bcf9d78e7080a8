// Package adminroute is what the admin listener (internal/adminapi) and the
// packages that offer it routes (group identify, user mapping, the forwarded
// upstream APIs of internal/forward, /relay/v1) share: the one Route type,
// CheckPath, the one rule for which request paths the listener serves,
// WriteJSON, the relay's own JSON answers, and StatusWriter.
//
// # One path
//
// The admin listener refuses (400) every request whose raw path CheckPath
// refuses, before routing. What remains has one meaning: the decoded path
// (http.Request.URL.Path) that http.ServeMux routes, and the escaped path
// (URL.EscapedPath) that internal/forward sends upstream, name the same
// segments, because no escape in it decodes to a separator, a dot or an
// escape, and no segment is empty, "." or "..". Forwarders call CheckPath
// again before they send anything.
package adminroute

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/admintoken"
)

// Route is one method and path pattern on the admin listener.
type Route struct {
	// Method is the HTTP method, e.g. http.MethodGet (GET also serves HEAD).
	Method string
	// Path is an http.ServeMux path pattern: literal segments and {name}
	// wildcards ("/relay/v1/lanes/{label}"); a trailing "/" matches every
	// path under it. It is also the route label of the listener's metrics.
	Path string
	// Mode says where the admin token travels: admintoken.ModeOwn for the
	// relay's own routes, admintoken.ModeForward for routes whose caller
	// may pass its own upstream Authorization through.
	Mode admintoken.Mode
	// Handler serves the request after the token check; the admin token
	// has been stripped from the request's headers.
	Handler http.Handler
	// MaxBody bounds the request body; 0 means the listener's bound
	// (adminapi.Config.MaxRequestBodySize). A route taking whole files
	// (a backfill's input) sets its own.
	MaxBody int64
}

// Pattern is the route's http.ServeMux pattern, "METHOD PATH".
func (r Route) Pattern() string { return r.Method + " " + r.Path }

// WriteJSON answers status with v as JSON (one line), never cached.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"encoding the answer failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// StatusWriter keeps the status of the answer written through it.
type StatusWriter struct {
	http.ResponseWriter
	// Status is the answer's status, 0 until its head is written.
	Status int
}

func (w *StatusWriter) WriteHeader(code int) {
	if w.Status == 0 && code >= 200 {
		w.Status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *StatusWriter) Write(p []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// LogLines is the writer of a standard library logger (log.New(w, "", 0))
// of net/http or promhttp: each line is logged as a warning under Msg, the
// line (passed through Redact when set) in a field, so that a sampler per
// message bounds them.
type LogLines struct {
	Log    *zap.Logger
	Msg    string
	Redact func(string) string
}

func (l LogLines) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	if l.Redact != nil {
		line = l.Redact(line)
	}
	l.Log.Warn(l.Msg, zap.String("detail", line))
	return len(p), nil
}

// CheckPath reports whether raw, a request's path as sent (before any
// decoding, without the query), is one the admin listener serves. It
// refuses:
//   - a path not starting with "/" (absolute-form, "*", CONNECT targets);
//   - an empty segment ("//") other than a trailing "/", and a segment
//     that is "." or "..";
//   - raw bytes outside printable ASCII (NUL, controls, space, non-ASCII),
//     '\' and ';' (path parameters);
//   - a malformed escape, and escapes of '/', '\', '.', '%' (double
//     encoding), ';', controls and NUL;
//   - a path whose decoded form is not valid UTF-8 (overlong encodings
//     such as %C0%AF).
//
// A path it accepts decodes segment by segment into the path that routing
// sees, and encodes back into the path that forwarding sends.
func CheckPath(raw string) bool {
	if raw == "" || raw[0] != '/' {
		return false
	}
	decoded := make([]byte, 0, len(raw))
	segStart := 1
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c <= ' ' || c >= 0x7f, c == '\\' || c == ';' || c == '#':
			return false
		case c == '%':
			n, err := strconv.ParseUint(raw[i+1:min(i+3, len(raw))], 16, 8)
			if err != nil || i+2 >= len(raw) {
				return false
			}
			d := byte(n)
			if d < 0x20 || d == 0x7f || strings.IndexByte(`/\.%;`, d) >= 0 {
				return false
			}
			decoded = append(decoded, d)
			i += 2
			continue
		case c == '/' && i > 0:
			seg := raw[segStart:i]
			if seg == "" || seg == "." || seg == ".." {
				return false
			}
			segStart = i + 1
		}
		decoded = append(decoded, c)
	}
	if last := raw[segStart:]; last == "." || last == ".." {
		return false
	}
	return utf8.Valid(decoded)
}

// RawPath returns the path of r as the client sent it (no query), for
// CheckPath: the request line's path, or the path of an absolute-form
// request URI ("" for "*" and CONNECT's authority form).
func RawPath(r *http.Request) string {
	u := r.RequestURI
	if u == "" { // a request built in a test or by a client, not read by a server
		return r.URL.EscapedPath()
	}
	if i := strings.IndexByte(u, '?'); i >= 0 {
		u = u[:i]
	}
	if strings.HasPrefix(u, "/") {
		return u
	}
	if _, rest, ok := strings.Cut(u, "://"); ok {
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			return rest[i:]
		}
	}
	return ""
}
