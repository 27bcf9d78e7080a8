package delivery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/storage"
)

// Defaults of FormConfig's zero values that differ from Config's.
const (
	formRetryMax      = 30 * time.Second
	formMaxRetryAfter = 5 * time.Minute
	formLinger        = 100 * time.Millisecond
	formReadBytes     = 4 << 20
)

// Pacer paces requests; Acquire blocks until n records may be sent for the
// lane's api_key and returns a function to call when the answer arrived.
type Pacer interface {
	Acquire(ctx context.Context, apiKey string, n int) (release func(), err error)
}

// FormTiming is the part of a FormConfig a form kind's own Config embeds.
type FormTiming struct {
	// MaxAge: a record still undelivered this long after acceptance goes to
	// dead letters ("expired"); zero means DefaultMaxEventAge.
	MaxAge time.Duration
	// RetryInitial and RetryMax bound the backoff; zero means 500ms and 30s.
	RetryInitial, RetryMax time.Duration
	// MaxRetryAfter clamps an upstream Retry-After; zero means 5 minutes.
	MaxRetryAfter time.Duration
	// Linger is how long a lane waits for more records when its request is
	// not full; zero means 100ms, negative means no wait.
	Linger time.Duration
	// Gzip sends bodies gzip-compressed.
	Gzip bool
}

// ValidateAs reports a negative duration of t (Linger excepted) or among
// more (the form kind's own), as "<name>: negative duration".
func (t FormTiming) ValidateAs(name string, more ...time.Duration) error {
	neg := t.MaxAge < 0 || t.RetryInitial < 0 || t.RetryMax < 0 || t.MaxRetryAfter < 0
	for _, d := range more {
		neg = neg || d < 0
	}
	if neg {
		return errors.New(name + ": negative duration")
	}
	return nil
}

// FormConfig configures the delivery of a form kind (group identify, user
// mappings): NewForm, the lane runner every kind shares.
type FormConfig struct {
	// Name prefixes metrics (relay_<Name>_...) and log messages. Required.
	Name string
	// Lanes is the lane kind delivered. Required (KindEvents is refused).
	Lanes storage.Kind
	// Kind packs records into requests: a *Form. Required.
	Kind Kind
	// URL returns the full upstream URL for an api_key. Required.
	URL func(apiKey string) string
	// FormTiming: max age, retries, linger, gzip.
	FormTiming
	// ThrottleWait is the least wait after a 429 without Retry-After; zero
	// means the backoff's next interval.
	ThrottleWait time.Duration
	// ReadBytes bounds the chunk bytes read from the spool at once; zero
	// means 4 MiB.
	ReadBytes int
	// Pacer, when not nil, paces every request.
	Pacer Pacer

	// Store holds the records and takes the dead letters (the local
	// spool's or the fleet's, restricted to Lanes). Required.
	Store Store
}

// Store is the store as delivery uses it.
type Store interface {
	storage.Owner
	storage.DeadWriter
}

// Validate reports a configuration error.
func (c FormConfig) Validate() error {
	switch {
	case c.Name == "":
		return errors.New("delivery: Name required")
	case c.Lanes == storage.KindEvents:
		return errors.New("delivery: Lanes must not be events")
	case c.Kind == nil:
		return errors.New("delivery: Kind required")
	case c.URL == nil:
		return errors.New("delivery: URL required")
	case c.Store == nil:
		return errors.New("delivery: Store required")
	case c.ThrottleWait < 0, c.ReadBytes < 0:
		return errors.New("delivery: negative limit or duration")
	}
	if f, ok := c.Kind.(*Form); ok {
		switch {
		case f.Field == "":
			return errors.New("delivery: Form.Field required")
		case f.MaxItems <= 0:
			return fmt.Errorf("delivery: Form.MaxItems %d <= 0", f.MaxItems)
		case f.MaxBodyBytes <= 0:
			return fmt.Errorf("delivery: Form.MaxBodyBytes %d <= 0", f.MaxBodyBytes)
		case f.MaxWeight < 0:
			return errors.New("delivery: negative Form.MaxWeight")
		}
	}
	return c.FormTiming.ValidateAs("delivery")
}

// ProjectURL returns a FormConfig.URL: base + path, where a project's own
// base of kind (credentials.KindIngest, ...) overrides base for its
// api_key. creds (may be nil) and base are read at every call: a reload
// takes effect at once.
func ProjectURL(creds *credentials.Ref, kind string, base *baseurl.Ref, path string) func(apiKey string) string {
	return func(apiKey string) string {
		b := base.Load()
		if p, ok := creds.Load().ProjectByAPIKey(apiKey); ok {
			b = strings.TrimRight(p.URL(kind, b), "/")
		}
		return b + path
	}
}
