package throttle

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Throttle.
type Config struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// PaceEPS is the events per second each key may be given by Take; zero
	// disables pacing (Take always allows).
	PaceEPS float64
	// PaceBurst is the bucket size of the pacing; zero means PaceEPS*10
	// (the upstream averages its limit over a window of some seconds).
	PaceBurst float64
	// MaxKeys caps the entries of each internal map; zero means 4,000,000.
	MaxKeys int
}

// Validate reports a configuration error.
func (c Config) Validate() error {
	if c.PaceEPS < 0 || c.PaceBurst < 0 || c.MaxKeys < 0 {
		return errors.New("throttle: negative config value")
	}
	return nil
}

// Throttle holds per-key pauses and pacing buckets. See the package doc.
type Throttle struct {
	cfg   Config
	now   func() time.Time
	burst float64

	// npaused mirrors len(paused) so that PausedUntil skips the lock when
	// nothing is paused (the common case).
	npaused atomic.Int64

	mu          sync.Mutex
	paused      map[string]time.Time
	pausedSwept int // len(paused) after the last sweep
	buckets     map[string]*bucket
	bucketSwept int

	gauge prometheus.GaugeFunc
}

type bucket struct {
	tokens float64
	at     time.Time
}

// New returns a Throttle. reg may be nil; it registers
// relay_throttle_paused_keys (keys with an unexpired pause).
func New(cfg Config, reg prometheus.Registerer) (*Throttle, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = 4_000_000
	}
	t := &Throttle{cfg: cfg, now: cfg.Now, paused: map[string]time.Time{}, buckets: map[string]*bucket{}}
	if t.now == nil {
		t.now = time.Now
	}
	t.burst = cfg.PaceBurst
	if t.burst == 0 {
		t.burst = cfg.PaceEPS * 10
	}
	if t.burst < 1 {
		t.burst = 1
	}
	t.gauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "relay_throttle_paused_keys",
		Help: "Devices and users the upstream asked to pause (429, daily quota) whose pause has not expired.",
	}, func() float64 { return float64(t.PausedKeys()) })
	if reg != nil {
		if err := reg.Register(t.gauge); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// Pause pauses every key until until (never shortening a longer pause).
func (t *Throttle) Pause(keys []string, until time.Time) {
	now := t.now()
	if !until.After(now) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		if old, ok := t.paused[k]; !ok || until.After(old) {
			t.paused[k] = until
		}
	}
	if len(t.paused) > 2*t.pausedSwept+1024 {
		t.sweepPausedLocked(now)
	}
	t.npaused.Store(int64(len(t.paused)))
}

// PauseUntilNextDay pauses keys until the next UTC midnight (devices over
// their daily quota) and returns that time.
func (t *Throttle) PauseUntilNextDay(keys []string) time.Time {
	until := NextUTCDay(t.now())
	t.Pause(keys, until)
	return until
}

// NextUTCDay returns the first instant of the UTC day after now.
func NextUTCDay(now time.Time) time.Time {
	y, m, d := now.UTC().Date()
	return time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
}

// PausedUntil returns when key's pause ends, or the zero time when key is
// not paused. It does not allocate.
func (t *Throttle) PausedUntil(key []byte) time.Time {
	if t.npaused.Load() == 0 {
		return time.Time{}
	}
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	u, ok := t.paused[string(key)]
	if !ok {
		return time.Time{}
	}
	if !u.After(now) {
		delete(t.paused, string(key))
		t.npaused.Store(int64(len(t.paused)))
		return time.Time{}
	}
	return u
}

// AnyPaused reports whether some key may be paused; when it is false,
// PausedUntil is zero for every key. Lets callers skip building keys.
func (t *Throttle) AnyPaused() bool { return t.npaused.Load() != 0 }

// PausedKeys is the number of keys with an unexpired pause.
func (t *Throttle) PausedKeys() int {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweepPausedLocked(now)
	return len(t.paused)
}

func (t *Throttle) sweepPausedLocked(now time.Time) {
	for k, u := range t.paused {
		if !u.After(now) {
			delete(t.paused, k)
		}
	}
	t.pausedSwept = len(t.paused)
	t.npaused.Store(int64(len(t.paused)))
}

// Pacing reports whether Take can refuse.
func (t *Throttle) Pacing() bool { return t.cfg.PaceEPS > 0 }

// Take takes n tokens (events) of key's pacing bucket. It returns true when
// they were taken, else false and the time at which n tokens (at most the
// burst) will be there. Without pacing it always returns true.
func (t *Throttle) Take(key []byte, n int) (bool, time.Time) {
	if t.cfg.PaceEPS <= 0 {
		return true, time.Time{}
	}
	now := t.now()
	need := float64(n)
	if need > t.burst {
		need = t.burst
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	b, ok := t.buckets[string(key)]
	if !ok {
		if len(t.buckets) > 2*t.bucketSwept+1024 {
			t.sweepBucketsLocked(now)
		}
		if len(t.buckets) >= t.cfg.MaxKeys {
			return true, time.Time{} // over the cap: no pacing for new keys
		}
		b = &bucket{tokens: t.burst, at: now}
		t.buckets[string(key)] = b
	}
	if el := now.Sub(b.at); el > 0 {
		b.tokens += el.Seconds() * t.cfg.PaceEPS
		if b.tokens > t.burst {
			b.tokens = t.burst
		}
		b.at = now
	}
	if b.tokens >= need {
		b.tokens -= need
		return true, time.Time{}
	}
	wait := time.Duration((need - b.tokens) / t.cfg.PaceEPS * float64(time.Second))
	return false, now.Add(wait)
}

func (t *Throttle) sweepBucketsLocked(now time.Time) {
	full := time.Duration(t.burst / t.cfg.PaceEPS * float64(time.Second))
	for k, b := range t.buckets {
		if now.Sub(b.at) >= full {
			delete(t.buckets, k)
		}
	}
	t.bucketSwept = len(t.buckets)
}

// Buckets is the number of pacing buckets held (for tests of the bound).
func (t *Throttle) Buckets() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.buckets)
}
