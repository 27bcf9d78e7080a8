package admintoken

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"github.com/valyala/fasthttp"
)

// Mode says where a route reads the admin token (see the package doc).
type Mode int

const (
	// ModeOwn is for the relay's own routes, /groupidentify and /usermap:
	// the token in Authorization (or Proxy-Authorization).
	ModeOwn Mode = iota
	// ModeForward is for forwarding routes: the token in
	// Proxy-Authorization, or in Authorization when X-Relay-Project names a
	// project. Any Mode other than ModeOwn behaves as ModeForward.
	ModeForward
)

// HeaderProject is the header by which a caller names the project whose
// credentials the relay injects.
const HeaderProject = "X-Relay-Project"

// Challenge is the value of WWW-Authenticate / Proxy-Authenticate on a 401.
const Challenge = `Bearer realm="relay-admin"`

// MaxFileBytes is the largest token file Load reads.
const MaxFileBytes = 4096

// Token is a configured admin token. The zero value is not usable: build it
// with New or Load. A nil *Token means no admin token is configured.
type Token struct {
	key              [32]byte // random HMAC key
	sum              [sha256.Size]byte
	readableByOthers bool

	// replaced is the token put in force by SetFrom (issue 24: SIGHUP);
	// nil until then. match checks against it when set.
	replaced atomic.Pointer[Token]
}

// SetFrom puts n's token in force in t for every request checked after it
// returns (a reload); n must not be nil.
func (t *Token) SetFrom(n *Token) {
	if r := n.replaced.Load(); r != nil {
		n = r
	}
	t.replaced.Store(n)
}

// Errors of New and Load. They never contain the token.
var (
	// ErrEmpty is returned when the token (after trimming white space) is
	// empty.
	ErrEmpty = errors.New("admin token is empty")
	// ErrBadChar is returned when the token has a character that cannot
	// travel in an HTTP header as a bearer token: white space inside it, a
	// control character, or a non-ASCII byte.
	ErrBadChar = errors.New("admin token has white space, control or non-ASCII characters")
	// ErrBoth is returned by Load when both a token and a token file are
	// given.
	ErrBoth = errors.New("both an admin token and an admin token file are given; use one")
)

// New returns a Token for token, trimmed of surrounding white space (a
// header value cannot carry it). Only visible ASCII (0x21 to 0x7e) is
// accepted.
func New(token string) (*Token, error) {
	tok := bytes.TrimSpace([]byte(token))
	if len(tok) == 0 {
		return nil, ErrEmpty
	}
	for _, c := range tok {
		if c < 0x21 || c > 0x7e {
			return nil, ErrBadChar
		}
	}
	t := &Token{}
	if _, err := rand.Read(t.key[:]); err != nil {
		return nil, fmt.Errorf("admin token: %w", err)
	}
	t.sum = t.mac(tok)
	return t, nil
}

// Load returns the admin token given directly (token) or in a file
// (tokenFile, whose content is trimmed of surrounding white space, trailing
// newline included). At most one may be set; with neither it returns nil,
// nil: no admin token configured. A file that group or others may read is
// accepted, and reported by ReadableByOthers for the caller to warn about.
func Load(token, tokenFile string) (*Token, error) {
	switch {
	case token != "" && tokenFile != "":
		return nil, ErrBoth
	case token != "":
		return New(token)
	case tokenFile == "":
		return nil, nil
	}
	f, err := os.Open(tokenFile)
	if err != nil {
		return nil, fmt.Errorf("admin token file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("admin token file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("admin token file %s: not a regular file", tokenFile)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("admin token file: %w", err)
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("admin token file %s: larger than %d bytes", tokenFile, MaxFileBytes)
	}
	t, err := New(string(data))
	clear(data)
	if err != nil {
		return nil, fmt.Errorf("admin token file %s: %w", tokenFile, err)
	}
	t.readableByOthers = fi.Mode().Perm()&0o044 != 0
	return t, nil
}

// ReadableByOthers reports whether the token came from a file that group or
// others may read (mode & 0o044); the caller should log a warning. False for
// a nil Token and a token given directly.
func (t *Token) ReadableByOthers() bool { return t != nil && t.readableByOthers }

func (t *Token) mac(b []byte) [sha256.Size]byte {
	m := hmac.New(sha256.New, t.key[:])
	m.Write(b)
	var out [sha256.Size]byte
	m.Sum(out[:0])
	return out
}

// match reports whether v is "Bearer <token>" (scheme case-insensitive) and
// whether the token is t's. A Bearer with nothing after it is not a token.
func (t *Token) match(v []byte) (bearer, ok bool) {
	const scheme = "bearer"
	if len(v) <= len(scheme) || !bytes.EqualFold(v[:len(scheme)], []byte(scheme)) ||
		(v[len(scheme)] != ' ' && v[len(scheme)] != '\t') {
		return false, false
	}
	tok := bytes.TrimSpace(v[len(scheme):])
	if len(tok) == 0 {
		return false, false
	}
	if r := t.replaced.Load(); r != nil {
		t = r
	}
	sum := t.mac(tok)
	return true, subtle.ConstantTimeCompare(sum[:], t.sum[:]) == 1
}

// scan reports whether any value of header carries a bearer token and
// whether one carries t's.
func (t *Token) scan(ctx *fasthttp.RequestCtx, header string) (presented, ok bool) {
	// PeekAll reuses one buffer per header set: finish with it here.
	for _, v := range ctx.Request.Header.PeekAll(header) {
		b, m := t.match(v)
		presented = presented || b
		ok = ok || m
	}
	return presented, ok
}

// readsAuthorization reports whether mode reads the admin token from
// Authorization for this request.
func readsAuthorization(ctx *fasthttp.RequestCtx, mode Mode) bool {
	return mode == ModeOwn || len(ctx.Request.Header.Peek(HeaderProject)) > 0
}

// Check checks the admin token of the request for a route of mode. It returns
// ok when the token is right (or t is nil); otherwise status is 401 (no
// token presented where mode reads it; Check then sets the Bearer challenge
// headers on ctx.Response) or 403 (a wrong token). status is 0 when ok. The
// caller writes the status and body (Require does).
func (t *Token) Check(ctx *fasthttp.RequestCtx, mode Mode) (status int, ok bool) {
	if t == nil {
		return 0, true
	}
	inAuth := readsAuthorization(ctx, mode)
	presented, ok := t.scan(ctx, fasthttp.HeaderProxyAuthorization)
	if !ok && inAuth {
		var p bool
		p, ok = t.scan(ctx, fasthttp.HeaderAuthorization)
		presented = presented || p
	}
	switch {
	case ok:
		return 0, true
	case presented:
		return fasthttp.StatusForbidden, false
	}
	if inAuth {
		ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, Challenge)
	}
	if mode != ModeOwn {
		ctx.Response.Header.Set(fasthttp.HeaderProxyAuthenticate, Challenge)
	}
	return fasthttp.StatusUnauthorized, false
}

// Strip removes the admin token headers from the request before it is
// handled or forwarded: Proxy-Authorization always; Authorization when mode
// reads it as the admin token (ModeOwn, or ModeForward with X-Relay-Project)
// or when it carries t's token. A caller's own Authorization on a forwarding
// route without X-Relay-Project stays untouched. t may be nil.
func (t *Token) Strip(ctx *fasthttp.RequestCtx, mode Mode) {
	h := &ctx.Request.Header
	h.Del(fasthttp.HeaderProxyAuthorization)
	strip := readsAuthorization(ctx, mode)
	if !strip && t != nil {
		_, strip = t.scan(ctx, fasthttp.HeaderAuthorization)
	}
	if strip {
		h.Del(fasthttp.HeaderAuthorization)
	}
}

// Require wraps next for a route of mode: a request failing Check is
// answered with its status and a short text body; one passing it has the
// admin token headers stripped (Strip) and goes to next. With a nil t every
// request passes (still stripped).
func (t *Token) Require(mode Mode, next fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if status, ok := t.Check(ctx, mode); !ok {
			ctx.Response.Header.SetContentType("text/plain; charset=utf-8")
			ctx.SetStatusCode(status)
			switch {
			case status == fasthttp.StatusForbidden:
				ctx.SetBodyString("wrong admin token\n")
			case mode == ModeOwn:
				ctx.SetBodyString("admin token required: Authorization: Bearer <token>\n")
			default:
				ctx.SetBodyString("admin token required: Proxy-Authorization: Bearer <token> " +
					"(or Authorization: Bearer <token> with " + HeaderProject + ")\n")
			}
			return
		}
		t.Strip(ctx, mode)
		next(ctx)
	}
}

// String returns a redacted placeholder.
func (t *Token) String() string { return "admintoken.Token{[redacted]}" }

// Format prints the redacted placeholder for every verb.
func (t *Token) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, t.String()) }

// String of a Mode, for logs.
func (m Mode) String() string {
	switch m {
	case ModeOwn:
		return "own"
	case ModeForward:
		return "forward"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}
