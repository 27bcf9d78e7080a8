package admintoken

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/svcrelay/relay/internal/credentials"
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
	digest           [sha256.Size]byte // of the token alone: Same compares two Tokens
	n                int               // the token's length, for Strip's search
	readableByOthers bool
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
	t.digest = sha256.Sum256(tok)
	t.n = len(tok)
	return t, nil
}

// Same reports whether t and u hold the same token (both nil: none), in
// constant time.
func (t *Token) Same(u *Token) bool {
	if t == nil || u == nil {
		return t == u
	}
	return subtle.ConstantTimeCompare(t.digest[:], u.digest[:]) == 1
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
	data, readable, err := credentials.ReadSecretFile(tokenFile, MaxFileBytes)
	if err != nil {
		return nil, fmt.Errorf("admin token file: %w", err)
	}
	t, err := New(string(data))
	clear(data)
	if err != nil {
		return nil, fmt.Errorf("admin token file %s: %w", tokenFile, err)
	}
	t.readableByOthers = readable
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
func (t *Token) match(v string) (bearer, ok bool) {
	const scheme = "bearer"
	if len(v) <= len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) ||
		(v[len(scheme)] != ' ' && v[len(scheme)] != '\t') {
		return false, false
	}
	tok := strings.TrimSpace(v[len(scheme):])
	if tok == "" {
		return false, false
	}
	return true, t.equal(tok)
}

// equal compares s with the token in constant time (over HMAC sums).
func (t *Token) equal(s string) bool {
	sum := t.mac([]byte(s))
	return subtle.ConstantTimeCompare(sum[:], t.sum[:]) == 1
}

// scan reports whether any value of header presents a Bearer token
// (presented) and whether one is the admin token (ok).
func (t *Token) scan(h http.Header, header string) (presented, ok bool) {
	for _, v := range h.Values(header) {
		b, m := t.match(v)
		presented = presented || b
		ok = ok || m
	}
	return presented, ok
}

// carries reports whether a header value carries the admin token in any
// form: as a word of the value itself (Bearer, Token, Digest's
// username="<token>", a cookie's value, the bare value), of its
// percent-decoded form, or of any base64 word decoded (HTTP Basic with the
// token as the user, the password or the whole pair). Candidates are
// compared as Check compares (HMAC sums), though only a caller that
// presented the token reaches Strip.
func (t *Token) carries(v string) bool {
	if t.holds(v) {
		return true
	}
	if u, err := url.PathUnescape(v); err == nil && u != v && t.holds(u) {
		return true
	}
	// '=' splits too: base64 padding, and the "name=" of a cookie or an
	// auth-param before its value.
	for _, f := range strings.FieldsFunc(v, func(c rune) bool { return !isWord(c) && c != '+' && c != '/' && c != '-' && c != '_' }) {
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			if dec, err := enc.DecodeString(f); err == nil && t.holds(string(dec)) {
				return true
			}
		}
	}
	return false
}

// holds reports whether s has the token as a word: a substring of the
// token's length with a word boundary (start or end of s, or a letter or
// digit next to anything else) at both ends. Only the substrings between
// boundaries are compared, so a value costs an HMAC per separator byte,
// not per byte.
func (t *Token) holds(s string) bool {
	n := t.n
	boundary := func(i int) bool {
		return i == 0 || i == len(s) || !isWord(rune(s[i-1])) || !isWord(rune(s[i]))
	}
	for i := 0; i+n <= len(s); i++ {
		if boundary(i) && boundary(i+n) && t.equal(s[i:i+n]) {
			return true
		}
	}
	return false
}

func isWord(c rune) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func readsAuthorization(r *http.Request, mode Mode) bool {
	return mode == ModeOwn || r.Header.Get(HeaderProject) != ""
}

// Check reports whether r may reach a route of mode: ok, or the status to
// answer (401 with the challenge headers set on w, or 403). A nil Token
// lets every request through.
func (t *Token) Check(w http.ResponseWriter, r *http.Request, mode Mode) (status int, ok bool) {
	if t == nil {
		return 0, true
	}
	inAuth := readsAuthorization(r, mode)
	presented, ok := t.scan(r.Header, "Proxy-Authorization")
	if !ok && inAuth {
		var p bool
		p, ok = t.scan(r.Header, "Authorization")
		presented = presented || p
	}
	switch {
	case ok:
		return 0, true
	case presented:
		return http.StatusForbidden, false
	}
	if inAuth {
		w.Header().Set("WWW-Authenticate", Challenge)
	}
	if mode != ModeOwn {
		w.Header().Set("Proxy-Authenticate", Challenge)
	}
	return http.StatusUnauthorized, false
}

// Strip removes the admin token from r's headers before a handler (and an
// upstream) sees them: Proxy-Authorization always; Authorization when the
// mode reads the admin token there (ModeOwn; ModeForward with
// X-Relay-Project); and every value of every header that carries the admin
// token in whatever form (see carries: Digest, cookies,
// X-Forwarded-Authorization, custom headers). A caller's own upstream
// Authorization that does not carry the token is kept.
func (t *Token) Strip(r *http.Request, mode Mode) {
	r.Header.Del("Proxy-Authorization")
	if readsAuthorization(r, mode) {
		r.Header.Del("Authorization")
	}
	if t == nil {
		return
	}
	for name, vals := range r.Header {
		keep := vals[:0:0]
		for _, v := range vals {
			if !t.carries(v) {
				keep = append(keep, v)
			}
		}
		switch {
		case len(keep) == len(vals):
		case len(keep) == 0:
			delete(r.Header, name)
		default:
			r.Header[name] = keep
		}
	}
}

// Require returns a handler that checks the admin token of mode (answering
// 401 or 403 as text), strips it (Strip), and calls next.
func (t *Token) Require(mode Mode, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status, ok := t.Check(w, r, mode); !ok {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(status)
			switch {
			case status == http.StatusForbidden:
				io.WriteString(w, "wrong admin token\n")
			case mode == ModeOwn:
				io.WriteString(w, "admin token required: Authorization: Bearer <token>\n")
			default:
				io.WriteString(w, "admin token required: Proxy-Authorization: Bearer <token> "+
					"(or Authorization: Bearer <token> with "+HeaderProject+")\n")
			}
			return
		}
		t.Strip(r, mode)
		next.ServeHTTP(w, r)
	})
}

// String returns a redacted placeholder.
func (t *Token) String() string { return "admintoken.Token{[redacted]}" }

// Format prints the redacted placeholder for every verb.
func (t Token) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, t.String()) }
