package delivery

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/svcrelay/relay/internal/storage"
)

// Config configures a Pipeline. Only cmd/relay fills it from flags.
type Config struct {
	// Live are the settings SetLive may change while running.
	Live
	// ShardsPerLane is the number of shards (requests in flight) per lane;
	// zero means 4.
	ShardsPerLane int
	// MaxReadAheadBytes bounds, per lane, the memory held by events read
	// and not yet delivered or dead-lettered (see the package doc); zero
	// means DefaultMaxReadAheadBytes.
	MaxReadAheadBytes int
	// MaxReadAheadTotalBytes bounds the same for all lanes together; zero
	// means DefaultMaxReadAheadTotalBytes.
	MaxReadAheadTotalBytes int
	// RetryInitial and RetryMax shape the backoff; zero means 500ms and
	// 60s.
	RetryInitial, RetryMax time.Duration
	// MaxRetryAfter clamps an upstream Retry-After; zero means RetryMax.
	MaxRetryAfter time.Duration
	// DrainTimeout is how long in-flight requests may finish after Run's
	// context ends before they are abandoned; zero means 5s.
	DrainTimeout time.Duration
	// Check, when not nil, gives the Frame.Check of an api_key's lanes
	// (the tracking plan, internal/plan).
	Check func(apiKey string) func(data []byte, verdict uint64) (rec []byte, reason string, answer []byte)
	// OnDead, when set, is given the dead letters of each flush once they
	// are durable (the live tap); it must not block.
	OnDead func([]storage.DeadLetter)
}

// Defaults.
const (
	DefaultMaxBatchEvents = 1000
	// MaxMaxBatchEvents is the largest MaxBatchEvents: the upstream takes
	// fewer than 2000 events per request.
	MaxMaxBatchEvents    = 1999
	DefaultMaxBatchBytes = 1_000_000
	DefaultFlushInterval = 200 * time.Millisecond
	DefaultThrottlePause = 30 * time.Second
	DefaultMaxEventAge   = 6 * 24 * time.Hour
	DefaultShardsPerLane = 4
	// DefaultMaxReadAheadBytes is about what one lane needs to drain at
	// full speed: the relay drained a 2M-event backlog (~500-byte events)
	// to a counting sink at ~420k events/s with 4 MiB, ~490k with 8, ~510k
	// with 16 and ~500k with 64. Under a load of 1000-event requests with
	// the relay's memory limit (then 128 MiB, now 120), more read-ahead
	// took heap from the accept path (16 MiB: -18% events accepted, 64
	// MiB: -40%). 8 MiB is twice what the default 4 shards need for a full
	// batch in flight and one ready.
	DefaultMaxReadAheadBytes = 8 << 20
	// DefaultMaxReadAheadTotalBytes lets three lanes read ahead fully.
	// With 100 busy lanes the budget is full and held as heap: at 32 MiB
	// their peak RSS was 144-150 MiB, at 24 MiB 138-139 MiB for the same
	// events/s (16 MiB: 133-136 MiB, 2% fewer events/s).
	DefaultMaxReadAheadTotalBytes = 24 << 20
	DefaultRetryInitial           = 500 * time.Millisecond
	DefaultRetryMax               = 60 * time.Second
	DefaultDrainTimeout           = 5 * time.Second
)

// Validate reports a configuration error.
func (c Config) Validate() error {
	var errs []error
	if c.IngestURL == "" {
		errs = append(errs, errors.New("ingest URL is required"))
	} else if !strings.HasPrefix(c.IngestURL, "http://") && !strings.HasPrefix(c.IngestURL, "https://") {
		errs = append(errs, fmt.Errorf("ingest URL %q is not http(s)", c.IngestURL))
	}
	if c.MaxBatchEvents < 0 || c.MaxBatchEvents > MaxMaxBatchEvents {
		errs = append(errs, fmt.Errorf("max batch events %d not in 1..%d", c.MaxBatchEvents, MaxMaxBatchEvents))
	}
	if c.MaxBatchBytes < 0 || (c.MaxBatchBytes > 0 && c.MaxBatchBytes < 1024) {
		errs = append(errs, fmt.Errorf("max batch bytes %d below 1024", c.MaxBatchBytes))
	}
	if c.FlushInterval < 0 || c.ThrottlePause < 0 || c.MaxEventAge < 0 || c.RetryInitial < 0 || c.RetryMax < 0 || c.DrainTimeout < 0 || c.MaxRetryAfter < 0 {
		errs = append(errs, errors.New("negative duration"))
	}
	if c.ShardsPerLane < 0 || c.ShardsPerLane > 1024 {
		errs = append(errs, fmt.Errorf("shards per lane %d not in 1..1024", c.ShardsPerLane))
	}
	if c.MaxReadAheadBytes < 0 || c.MaxReadAheadTotalBytes < 0 {
		errs = append(errs, errors.New("negative read-ahead"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delivery config: %w", err)
	}
	return nil
}

func (c Config) withDefaults() Config {
	c.MaxBatchEvents = cmp.Or(c.MaxBatchEvents, DefaultMaxBatchEvents)
	c.MaxBatchBytes = cmp.Or(c.MaxBatchBytes, DefaultMaxBatchBytes)
	c.FlushInterval = cmp.Or(c.FlushInterval, DefaultFlushInterval)
	c.ThrottlePause = cmp.Or(c.ThrottlePause, DefaultThrottlePause)
	c.MaxEventAge = cmp.Or(c.MaxEventAge, DefaultMaxEventAge)
	c.RetryInitial = cmp.Or(c.RetryInitial, DefaultRetryInitial)
	c.RetryMax = max(cmp.Or(c.RetryMax, DefaultRetryMax), c.RetryInitial)
	c.MaxRetryAfter = cmp.Or(c.MaxRetryAfter, c.RetryMax)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, DefaultDrainTimeout)
	c.ShardsPerLane = cmp.Or(c.ShardsPerLane, DefaultShardsPerLane)
	c.MaxReadAheadBytes = cmp.Or(c.MaxReadAheadBytes, DefaultMaxReadAheadBytes)
	c.MaxReadAheadTotalBytes = cmp.Or(c.MaxReadAheadTotalBytes, DefaultMaxReadAheadTotalBytes)
	c.IngestURL = strings.TrimRight(c.IngestURL, "/")
	return c
}
