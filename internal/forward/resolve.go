package forward

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/valyala/fasthttp"
)

// Scheme is the upstream authentication a route needs.
type Scheme int

const (
	// SchemeProjectBasic: Basic api_key:secret_key of the project
	// (classifiers, taxonomy, deletion, feedback).
	SchemeProjectBasic Scheme = iota + 1
	// SchemeOrgBasic: Basic api_key:secret_key of the project's
	// organization (DSAR).
	SchemeOrgBasic
	// SchemeManagementBearer: Bearer management_api_key of the project's
	// organization (experiment management).
	SchemeManagementBearer
	// SchemeSCIMBearer: Bearer scim_token of the project's organization
	// (SCIM provisioning).
	SchemeSCIMBearer
)

// String names the scheme for logs and errors.
func (s Scheme) String() string {
	switch s {
	case SchemeProjectBasic:
		return "project-basic"
	case SchemeOrgBasic:
		return "organization-basic"
	case SchemeManagementBearer:
		return "management-bearer"
	case SchemeSCIMBearer:
		return "scim-bearer"
	}
	return fmt.Sprintf("Scheme(%d)", int(s))
}

// Upstream says where a route's API lives and how it authenticates.
type Upstream struct {
	// API names the API in metrics, logs and errors ("scim").
	API string
	// Kind is the credentials kind of the base (credentials.KindSCIM, ...),
	// used to find a per-project or per-organization override.
	Kind string
	// Fallback is the flag's base (--scim-url, ...); "" when not set.
	Fallback string
	// Flag names the flag in error messages ("--scim-url").
	Flag string
	// Scheme is the authentication the upstream needs.
	Scheme Scheme
}

// Resolved is a Target plus who the call is for.
type Resolved struct {
	Target
	// Project is the project named by X-Relay-Project, or for pass-through
	// Basic auth the project whose api_key the caller sent (nil when none).
	Project *credentials.Project
	// Org is the organization of Project (nil when none).
	Org *credentials.Organization
	// Injected reports whether Authorization carries injected credentials.
	Injected bool
	// Key identifies the caller's upstream account for client-side limits:
	// "project:NAME" or "org:NAME" (by the scheme's scope) when known, else
	// "auth:" and a short SHA-256 of the caller's Authorization (the secret
	// itself is never kept), or "anonymous".
	Key string
}

// Error is a local answer: status and message for the caller. It never
// holds a secret.
type Error struct {
	Status int
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// Write writes e to ctx as JSON (see WriteError).
func (e *Error) Write(ctx *fasthttp.RequestCtx) { WriteError(ctx, e.Status, e.Msg) }

// WriteError answers ctx locally: status and {"error": msg, "source":
// "relay"} (application/json), so that callers can tell the relay's own
// answers from the upstream's.
func WriteError(ctx *fasthttp.RequestCtx, status int, msg string) {
	b, _ := json.Marshal(struct {
		Error  string `json:"error"`
		Source string `json:"source"`
	}{msg, "relay"})
	ctx.Response.Reset()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(append(b, '\n'))
}

// Resolve finds the Target of a request for u. With X-Relay-Project: NAME
// it injects NAME's credentials in u.Scheme (the admin listener has already
// removed the admin token from Authorization); without, the caller's
// Authorization passes through. The base is the project's (or its
// organization's) override of u.Kind, else u.Fallback: it is never taken
// from the request.
//
// Errors (local answers): 400 when X-Relay-Project names no project of the
// credentials file, or the project lacks what u.Scheme needs (no
// organization, no management_api_key, no scim_token); 502 when no base is
// configured for u.
func Resolve(ctx *fasthttp.RequestCtx, creds *credentials.Store, u Upstream) (Resolved, *Error) {
	r := Resolved{Target: Target{API: u.API}}
	name := string(ctx.Request.Header.Peek(admintoken.HeaderProject))
	if name != "" {
		p, ok := creds.Project(name)
		if !ok {
			msg := fmt.Sprintf("%s names no project of the relay's credentials file", admintoken.HeaderProject)
			if creds == nil {
				msg = fmt.Sprintf("%s given but the relay has no --credentials file", admintoken.HeaderProject)
			}
			return r, &Error{fasthttp.StatusBadRequest, msg}
		}
		r.Project, r.Org, r.Injected = p, p.Org(), true
		org := p.Org()
		needOrg := func(what string) *Error {
			if org == nil {
				return &Error{fasthttp.StatusBadRequest, fmt.Sprintf(
					"project %q is in no organization of the credentials file; %s needs the organization's %s", p.Name, u.API, what)}
			}
			return nil
		}
		switch u.Scheme {
		case SchemeProjectBasic:
			r.Authorization = credentials.BasicAuth(p.APIKey, p.SecretKey)
			r.Key = "project:" + p.Name
		case SchemeOrgBasic:
			if e := needOrg("api_key and secret_key"); e != nil {
				return r, e
			}
			r.Authorization = credentials.BasicAuth(org.APIKey, org.SecretKey)
			r.Key = "org:" + org.Name
		case SchemeManagementBearer:
			if e := needOrg("management_api_key"); e != nil {
				return r, e
			}
			if org.ManagementAPIKey.IsZero() {
				return r, &Error{fasthttp.StatusBadRequest, fmt.Sprintf(
					"organization %q of project %q has no management_api_key in the credentials file", org.Name, p.Name)}
			}
			r.Authorization = credentials.Bearer(org.ManagementAPIKey)
			r.Key = "org:" + org.Name
		case SchemeSCIMBearer:
			if e := needOrg("scim_token"); e != nil {
				return r, e
			}
			if org.SCIMToken.IsZero() {
				return r, &Error{fasthttp.StatusBadRequest, fmt.Sprintf(
					"organization %q of project %q has no scim_token in the credentials file", org.Name, p.Name)}
			}
			r.Authorization = credentials.Bearer(org.SCIMToken)
			r.Key = "org:" + org.Name
		default:
			return r, &Error{fasthttp.StatusInternalServerError, "relay: route has no authentication scheme"}
		}
	} else {
		auth := ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)
		if (u.Scheme == SchemeProjectBasic || u.Scheme == SchemeOrgBasic) && len(auth) > 0 {
			// The caller's own key pair may be one of the file's: its
			// project (and so its region and limits) is then known.
			if key, ok := basicUser(auth); ok {
				if p, ok := creds.ProjectByAPIKey(key); ok {
					r.Project, r.Org = p, p.Org()
					if u.Scheme == SchemeProjectBasic {
						r.Key = "project:" + p.Name
					}
				}
			}
		}
		if r.Key == "" {
			if len(auth) > 0 {
				sum := sha256.Sum256(auth)
				r.Key = "auth:" + hex.EncodeToString(sum[:8])
			} else {
				r.Key = "anonymous"
			}
		}
	}
	switch {
	case r.Project != nil:
		r.Base = r.Project.URL(u.Kind, u.Fallback)
	case r.Org != nil:
		r.Base = r.Org.URL(u.Kind, u.Fallback)
	default:
		r.Base = u.Fallback
	}
	if r.Base == "" {
		return r, &Error{fasthttp.StatusBadGateway, fmt.Sprintf(
			"no upstream configured for %s: set %s (or %s_url in the credentials file)", u.API, u.Flag, u.Kind)}
	}
	return r, nil
}

// basicUser returns the user name of a Basic Authorization value.
func basicUser(auth []byte) (string, bool) {
	const p = "basic "
	if len(auth) <= len(p) || !bytes.EqualFold(auth[:len(p)], []byte(p)) {
		return "", false
	}
	dec, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(auth[len(p):])))
	if err != nil {
		return "", false
	}
	user, _, ok := bytes.Cut(dec, []byte{':'})
	return string(user), ok && len(user) > 0
}

// DecodedBody returns the request body decoded by its Content-Encoding
// (gzip, deflate, br, zstd; none or identity: as is), at most limit bytes,
// for local validation. The body forwarded upstream stays as sent. An
// undecodable body, an unknown encoding or one decoding past limit is an
// error (answer it 400 or 413).
func DecodedBody(ctx *fasthttp.RequestCtx, limit int) ([]byte, error) {
	enc := bytes.TrimSpace(ctx.Request.Header.ContentEncoding())
	if len(enc) == 0 || bytes.EqualFold(enc, []byte("identity")) {
		return ctx.Request.Body(), nil
	}
	b, err := ctx.Request.BodyUncompressedWithLimit(limit)
	if err != nil {
		return nil, fmt.Errorf("decode request body (Content-Encoding %q): %w", enc, err)
	}
	return b, nil
}

// RetryAfter reads a Retry-After header of an answer: delay seconds or an
// HTTP date (relative to now). ok is false when absent or unreadable.
func RetryAfter(h *fasthttp.ResponseHeader, now time.Time) (d time.Duration, ok bool) {
	v := strings.TrimSpace(string(h.Peek(fasthttp.HeaderRetryAfter)))
	if v == "" {
		return 0, false
	}
	if n, err := strconv.Atoi(v); err == nil {
		return max(time.Duration(n)*time.Second, 0), n >= 0
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
