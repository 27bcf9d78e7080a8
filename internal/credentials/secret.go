package credentials

import (
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"os"

	"go.uber.org/zap/zapcore"
)

// Redacted is what every formatting of a Secret prints.
const Redacted = "[redacted]"

// Secret is an upstream credential (API key, secret key, management API key,
// SCIM token). Every way of printing it — fmt with any verb, %#v, JSON, text
// and YAML marshalling, zap and slog — yields Redacted; only Reveal returns
// the value, and is called only where the value goes onto the wire to the
// upstream that needs it.
//
// The value sits behind a pointer, so that even fmt's reflection over
// unexported fields (a struct that embeds a Project in an unexported field,
// a bad verb) prints an address, never the value. The zero value is the
// empty (absent) secret. Secrets are compared with Equal, not ==.
type Secret struct{ p *string }

// NewSecret returns a Secret holding v; "" gives the zero Secret.
func NewSecret(v string) Secret {
	if v == "" {
		return Secret{}
	}
	return Secret{&v}
}

// Reveal returns the secret's value. Call it only to put the value into an
// upstream request.
func (s Secret) Reveal() string {
	if s.p == nil {
		return ""
	}
	return *s.p
}

// IsZero reports whether the secret is empty (absent from the file).
func (s Secret) IsZero() bool { return s.p == nil || *s.p == "" }

// String returns Redacted.
func (Secret) String() string { return Redacted }

// Format writes Redacted for every verb (a Go-syntax placeholder for %#v),
// so that no verb, width or flag prints the value.
func (s Secret) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		_, _ = io.WriteString(f, `credentials.Secret{`+Redacted+`}`)
		return
	}
	_, _ = io.WriteString(f, Redacted)
}

// MarshalJSON returns the JSON string Redacted.
func (Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + Redacted + `"`), nil }

// MarshalText returns Redacted (used by YAML and other text encoders).
func (Secret) MarshalText() ([]byte, error) { return []byte(Redacted), nil }

// LogValue returns Redacted for log/slog.
func (Secret) LogValue() slog.Value { return slog.StringValue(Redacted) }

// MarshalLogObject logs the secret as {"redacted":true} when it is passed to
// zap.Object; zap.Any and zap.Stringer print Redacted.
func (s Secret) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddBool("redacted", true)
	enc.AddBool("set", !s.IsZero())
	return nil
}

// BasicAuth returns the value of an Authorization header for HTTP Basic
// authentication with apiKey as user and secretKey as password:
// "Basic base64(apiKey:secretKey)". The result holds the secrets: put it only
// on the wire.
func BasicAuth(apiKey, secretKey Secret) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(apiKey.Reveal()+":"+secretKey.Reveal()))
}

// Bearer returns the value of an Authorization header carrying s as a bearer
// token: "Bearer <s>". The result holds the secret: put it only on the wire.
func Bearer(s Secret) string { return "Bearer " + s.Reveal() }

// ReadSecretFile reads a regular file of secrets of at most maxBytes, and
// reports whether group or others may read it (mode & 0o044), for the caller
// to warn about. Its errors name the file, never its content.
func ReadSecretFile(path string, maxBytes int64) (data []byte, readableByOthers bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, false, err
	}
	if !fi.Mode().IsRegular() {
		return nil, false, fmt.Errorf("%s: not a regular file", path)
	}
	if data, err = io.ReadAll(io.LimitReader(f, maxBytes+1)); err != nil {
		return nil, false, err
	}
	if int64(len(data)) > maxBytes {
		clear(data)
		return nil, false, fmt.Errorf("%s: larger than %d bytes", path, maxBytes)
	}
	return data, fi.Mode().Perm()&0o044 != 0, nil
}
