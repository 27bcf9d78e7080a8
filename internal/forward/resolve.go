package forward

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/credentials"
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

// Upstream says where an API lives and how it authenticates.
type Upstream struct {
	// API names the API in metrics, logs and errors ("scim").
	API string
	// Kind is the credentials kind of the base (credentials.KindSCIM, ...),
	// used to find a per-project or per-organization override.
	Kind string
	// Fallback is the flag's base (--scim-url, ...), read at every request
	// (a reload may change it); nil or "" when not set.
	Fallback *baseurl.Ref
	// Scheme is the authentication the upstream needs.
	Scheme Scheme
}

// Problem is a local answer: the status and message for the caller, in the
// API's error format (see API.Errors). It never holds a secret.
type Problem struct {
	Status int
	Msg    string
	// Type is the SCIM scimType of the answer ("invalidValue"); "" for none
	// and for other formats.
	Type string
	// Extra, when not nil, is a JSON object whose fields the JSON error
	// format adds to the answer (feedback's per-item errors).
	Extra any
}

// Bad returns a 400 Problem with a formatted message.
func Bad(format string, args ...any) *Problem {
	return &Problem{Status: http.StatusBadRequest, Msg: fmt.Sprintf(format, args...)}
}

// BadIf returns err as a 400 Problem; nil when err is nil.
func BadIf(err error) *Problem {
	if err == nil {
		return nil
	}
	return Bad("%v", err)
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
func Resolve(req *http.Request, creds *credentials.Store, u Upstream) (Target, *Problem) {
	r := Target{API: u.API}
	// project is the one named by X-Relay-Project, or for pass-through
	// Basic auth the one whose api_key the caller sent (nil when none).
	var project *credentials.Project
	name := req.Header.Get(admintoken.HeaderProject)
	if name != "" {
		p, ok := creds.Project(name)
		if !ok {
			msg := fmt.Sprintf("%s names no project of the relay's credentials file", admintoken.HeaderProject)
			if creds == nil {
				msg = fmt.Sprintf("%s given but the relay has no --credentials file", admintoken.HeaderProject)
			}
			return r, &Problem{Status: http.StatusBadRequest, Msg: msg}
		}
		project = p
		org := p.Org()
		what := map[Scheme]string{SchemeOrgBasic: "api_key and secret_key",
			SchemeManagementBearer: "management_api_key", SchemeSCIMBearer: "scim_token"}[u.Scheme]
		switch {
		case u.Scheme == SchemeProjectBasic:
			r.Authorization, r.Key = credentials.BasicAuth(p.APIKey, p.SecretKey), "project:"+p.Name
		case what == "":
			return r, &Problem{Status: http.StatusInternalServerError, Msg: "relay: route has no authentication scheme"}
		case org == nil:
			return r, &Problem{Status: http.StatusBadRequest, Msg: fmt.Sprintf(
				"project %q is in no organization of the credentials file; %s needs the organization's %s", p.Name, u.API, what)}
		case u.Scheme == SchemeOrgBasic:
			r.Authorization, r.Key = credentials.BasicAuth(org.APIKey, org.SecretKey), "org:"+org.Name
		default:
			tok := org.ManagementAPIKey
			if u.Scheme == SchemeSCIMBearer {
				tok = org.SCIMToken
			}
			if tok.IsZero() {
				return r, &Problem{Status: http.StatusBadRequest, Msg: fmt.Sprintf(
					"organization %q of project %q has no %s in the credentials file", org.Name, p.Name, what)}
			}
			r.Authorization, r.Key = credentials.Bearer(tok), "org:"+org.Name
		}
	} else {
		auth := []byte(req.Header.Get("Authorization"))
		r.Key = "anonymous"
		if len(auth) > 0 {
			sum := sha256.Sum256(auth)
			r.Key = "auth:" + hex.EncodeToString(sum[:8])
		}
		// The caller's own key pair may be one of the file's: its project
		// (and so its region and limits) is then known.
		if key, ok := basicUser(auth); ok && (u.Scheme == SchemeProjectBasic || u.Scheme == SchemeOrgBasic) {
			if p, ok := creds.ProjectByAPIKey(key); ok {
				project = p
				if u.Scheme == SchemeProjectBasic {
					r.Key = "project:" + p.Name
				}
			}
		}
	}
	if r.Base = project.URL(u.Kind, u.Fallback.Load()); r.Base == "" {
		return r, &Problem{Status: http.StatusBadGateway, Msg: fmt.Sprintf(
			"no upstream configured for %s: set --%s-url (or %s_url in the credentials file)", u.API, u.Kind, u.Kind)}
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

// DecodedBody reads the request body, decoded by its Content-Encoding
// (gzip, deflate, zstd; none or identity: as is), at most limit bytes, for
// local validation, and puts the body back as it was sent, so that the body
// forwarded upstream is untouched. An undecodable body or an unknown
// encoding is an error wrapping ErrUndecodable (answer it 400); a body
// larger than limit, sent or decoded, one wrapping ErrBodyTooLarge (413).
func DecodedBody(r *http.Request, limit int) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, int64(limit)+1))
	r.Body.Close()
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, fmt.Errorf("%w: %w", ErrBodyTooLarge, err)
		}
		return nil, fmt.Errorf("read request body: %w", err)
	}
	if len(raw) > limit {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrBodyTooLarge, limit)
	}
	r.Body = io.NopCloser(bytes.NewReader(raw))
	r.ContentLength = int64(len(raw))
	enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding")))
	var dec io.ReadCloser
	switch enc {
	case "", "identity":
		return raw, nil
	case "gzip", "x-gzip":
		dec, err = gzip.NewReader(bytes.NewReader(raw))
	case "deflate":
		dec, err = zlib.NewReader(bytes.NewReader(raw))
	case "zstd":
		var z *zstd.Decoder
		if z, err = zstd.NewReader(bytes.NewReader(raw), zstd.WithDecoderConcurrency(1)); err == nil {
			dec = z.IOReadCloser()
		}
	default:
		return nil, fmt.Errorf("%w: Content-Encoding %q is not one the relay decodes (gzip, deflate, zstd)", ErrUndecodable, enc)
	}
	if err != nil {
		return nil, fmt.Errorf("%w (Content-Encoding %q): %w", ErrUndecodable, enc, err)
	}
	defer dec.Close()
	b, err := io.ReadAll(io.LimitReader(dec, int64(limit)+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w (Content-Encoding %q): %w", ErrUndecodable, enc, err)
	case len(b) > limit:
		return nil, fmt.Errorf("%w: decoded, more than %d bytes", ErrBodyTooLarge, limit)
	}
	return b, nil
}

// ErrUndecodable is returned by DecodedBody for a body its Content-Encoding
// does not decode.
var ErrUndecodable = errors.New("request body could not be decoded by its Content-Encoding")
