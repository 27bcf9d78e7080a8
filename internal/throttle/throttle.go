package throttle

import (
	"cmp"
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Config configures a Throttle.
type Config struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// PaceShare is the share of the upstream's eps_threshold a paced key is
	// given, in (0, 1]; zero means DefaultPaceShare. Under 1 so that a
	// request's own events, counted in the upstream's average (the strict
	// reading), do not push a key paced at the limit over it.
	PaceShare float64
	// DefaultEPS is the events/s threshold assumed when an answer names no
	// eps_threshold; zero means 30 (the document's limit).
	DefaultEPS int
	// PaceForget is how long a paced key is remembered after its last use
	// (a send, a 429, an admitted request); zero means 10 minutes.
	PaceForget time.Duration
	// MaxKeys caps the entries of each internal map; zero means 4,000,000.
	// Past it, new keys are not paced (their pauses are still recorded).
	MaxKeys int
	// PaceAll paces every key from its first Take, not only after a 429:
	// it starts with a full bucket of DefaultEPS events (its cap, which
	// never grows past it) refilled at PaceShare*DefaultEPS. For a
	// backfill, whose keys carry long histories that would otherwise each
	// meet a 429 first. False: only refused keys are paced.
	PaceAll bool
}

// Defaults of Config's zero values.
const (
	DefaultPaceShare  = 0.9
	DefaultEPS        = 30
	DefaultPaceForget = 10 * time.Minute
	DefaultMaxKeys    = 4_000_000
)

// Validate reports a configuration error.
func (c Config) Validate() error {
	if c.PaceShare < 0 || c.PaceShare > 1 || c.DefaultEPS < 0 || c.PaceForget < 0 || c.MaxKeys < 0 {
		return errors.New("throttle: config value out of range")
	}
	return nil
}

// Throttle holds per-key pauses and pacing. See the package doc.
type Throttle struct {
	cfg Config
	now func() time.Time

	// npaused and npaced mirror len(paused) and len(paced) so that the hot
	// paths skip the lock when nothing is paused or paced (the common case).
	npaused, npaced atomic.Int64
	// gen counts pauses: a caller that checked pauses at gen g need not
	// check again while Gen() is still g.
	gen atomic.Uint64

	mu          sync.Mutex
	paused      map[string]time.Time
	pausedSwept int // len(paused) after the last sweep
	paced       map[string]*pace
	pacedSwept  int
}

// pace is the adaptive pacing of one key: a token bucket refilled at rate
// events/s whose size is the per-request cap.
type pace struct {
	rate   float64 // events/s: PaceShare * the answer's eps_threshold
	eps    float64 // the answer's eps_threshold: the cap never grows past it
	cap    float64 // most events of the key in one request (>= 1)
	ceil   float64 // the cap never grows to a share that was refused (>= 1)
	grow   float64 // admitted requests since the cap last grew
	tokens float64
	at     time.Time // of the last refill
	used   time.Time // last Take, Refused or Admitted
}

// New returns a Throttle. reg may be nil; it registers
// relay_throttle_paused_keys and relay_throttle_paced_keys.
func New(cfg Config, reg prometheus.Registerer) (*Throttle, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.MaxKeys = cmp.Or(cfg.MaxKeys, DefaultMaxKeys)
	cfg.PaceShare = cmp.Or(cfg.PaceShare, DefaultPaceShare)
	cfg.DefaultEPS = cmp.Or(cfg.DefaultEPS, DefaultEPS)
	cfg.PaceForget = cmp.Or(cfg.PaceForget, DefaultPaceForget)
	t := &Throttle{cfg: cfg, now: cfg.Now, paused: map[string]time.Time{}, paced: map[string]*pace{}}
	if t.now == nil {
		t.now = time.Now
	}
	f := promauto.With(reg)
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "relay_throttle_paused_keys",
		Help: "Devices and users the upstream asked to pause (429, daily quota) whose pause has not expired.",
	}, func() float64 { return float64(t.PausedKeys()) })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "relay_throttle_paced_keys",
		Help: "Devices and users sent at a paced rate because the upstream refused them with a 429.",
	}, func() float64 { return float64(t.PacedKeys()) })
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
	t.pauseLocked(keys, until, now)
}

func (t *Throttle) pauseLocked(keys []string, until, now time.Time) {
	for _, k := range keys {
		if old, ok := t.paused[k]; !ok || until.After(old) {
			t.paused[k] = until
		}
	}
	if len(t.paused) > 2*t.pausedSwept+1024 {
		t.sweepPausedLocked(now)
	}
	t.npaused.Store(int64(len(t.paused)))
	t.gen.Add(1)
}

// Gen changes whenever a pause is recorded: a batch whose keys were checked
// against the pauses at Gen() == g needs no second check while it is still g.
func (t *Throttle) Gen() uint64 { return t.gen.Load() }

// Share is a key named in a 429 and how many of the refused request's
// events were its own (0 when unknown).
type Share struct {
	Key   string
	Share int
}

// Refused records a 429 (or a silenced 400's throttled devices) naming
// keys: each is paused until until and then paced, eps being the answer's
// eps_threshold (0: Config.DefaultEPS). A key not paced yet starts with a
// per-request cap of half its share (at most eps, at least 1); a key
// already paced and not paused now (a further refusal, not one more answer
// to a request sent before the first) halves its cap, and from then on its
// cap never grows back to the refused share.
func (t *Throttle) Refused(keys []Share, until time.Time, eps int) {
	now := t.now()
	if eps <= 0 {
		eps = t.cfg.DefaultEPS
	}
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = k.Key
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		p := t.paced[k.Key]
		if p == nil {
			if !t.roomLocked(now) {
				continue
			}
			c := float64(eps)
			if k.Share > 0 {
				c = min(c, float64(max(1, k.Share/2)))
			}
			// The first refusal says little about the share the upstream
			// takes (the key may have been over the rate with any share):
			// the cap may grow back to eps.
			p = &pace{cap: c, ceil: float64(eps), tokens: c, at: now}
			t.paced[k.Key] = p
		} else if u, ok := t.paused[k.Key]; !ok || !u.After(now) {
			refused := p.cap
			if k.Share > 0 {
				refused = min(refused, float64(k.Share))
			}
			p.cap = max(1, float64(int(refused)/2))
			p.ceil = max(1, min(p.ceil, refused-1))
			p.tokens = min(p.tokens, p.cap)
			p.grow = 0
		}
		p.eps = float64(eps)
		p.rate = float64(eps) * t.cfg.PaceShare
		p.used = now
	}
	t.npaced.Store(int64(len(t.paced)))
	t.pauseLocked(names, until, now)
}

// PauseUntilNextDay pauses keys until the next UTC midnight (devices over
// their daily quota) and returns that time.
func (t *Throttle) PauseUntilNextDay(keys []string) time.Time {
	y, m, d := t.now().UTC().Date()
	until := time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
	t.Pause(keys, until)
	return until
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

// AnyPaced reports whether some key may be paced; when it is false, Take
// always allows.
func (t *Throttle) AnyPaced() bool { return t.cfg.PaceAll || t.npaced.Load() != 0 }

// PausedKeys is the number of keys with an unexpired pause.
func (t *Throttle) PausedKeys() int {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweepPausedLocked(now)
	return len(t.paused)
}

// PacedKeys is the number of keys paced now.
func (t *Throttle) PacedKeys() int {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweepPacedLocked(now)
	return len(t.paced)
}

func (t *Throttle) sweepPausedLocked(now time.Time) {
	t.pausedSwept = sweep(t.paused, &t.npaused, func(u time.Time) bool { return !u.After(now) })
}

func (t *Throttle) sweepPacedLocked(now time.Time) {
	t.pacedSwept = sweep(t.paced, &t.npaced, func(p *pace) bool { return now.Sub(p.used) >= t.cfg.PaceForget })
}

// roomLocked reports whether a new key may be paced (MaxKeys), sweeping
// the paced keys first when their map doubled since the last sweep.
func (t *Throttle) roomLocked(now time.Time) bool {
	if len(t.paced) > 2*t.pacedSwept+1024 {
		t.sweepPacedLocked(now)
	}
	return len(t.paced) < t.cfg.MaxKeys
}

// sweep deletes m's entries that are gone, stores what is left in n and
// returns it.
func sweep[V any](m map[string]V, n *atomic.Int64, gone func(V) bool) int {
	maps.DeleteFunc(m, func(_ string, v V) bool { return gone(v) })
	n.Store(int64(len(m)))
	return len(m)
}

// Take takes one event's token from each paced key among a and b (an
// event's device and user keys; b may be nil). It returns true when every
// paced key had a token (then all were taken), else false and the time at
// which they all will have a full request's worth (their cap). paced says
// whether a or b is paced (for Admitted). Keys not paced always allow.
func (t *Throttle) Take(a, b []byte) (ok bool, at time.Time, paced bool) {
	if !t.AnyPaced() {
		return true, time.Time{}, false
	}
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	pa := t.pacedLocked(a, now)
	var pb *pace
	if len(b) > 0 && string(b) != string(a) {
		pb = t.pacedLocked(b, now)
	}
	if pa == nil && pb == nil {
		return true, time.Time{}, false
	}
	for _, p := range [2]*pace{pa, pb} {
		if p != nil && p.tokens < 1 {
			// Refused: come back when a whole request's worth (the cap) is
			// there, so that a paced backlog goes in requests of cap
			// events, not of one.
			// At least a millisecond: a bucket a rounding error short
			// of a token must not be retried at the same instant.
			wait := max(time.Millisecond, time.Duration((p.cap-p.tokens)/p.rate*float64(time.Second)))
			if w := now.Add(wait); w.After(at) {
				at = w
			}
		}
	}
	if !at.IsZero() {
		return false, at, true
	}
	for _, p := range [2]*pace{pa, pb} {
		if p != nil {
			p.tokens--
		}
	}
	return true, time.Time{}, true
}

// pacedLocked returns key's pace refilled up to now, nil when key is not
// paced.
func (t *Throttle) pacedLocked(key []byte, now time.Time) *pace {
	if len(key) == 0 {
		return nil
	}
	p := t.paced[string(key)]
	if p == nil {
		if !t.cfg.PaceAll || !t.roomLocked(now) {
			return nil
		}
		eps := float64(t.cfg.DefaultEPS)
		p = &pace{rate: eps * t.cfg.PaceShare, eps: eps, cap: eps, ceil: eps, tokens: eps, at: now}
		t.paced[string(key)] = p
		t.npaced.Store(int64(len(t.paced)))
	}
	if el := now.Sub(p.at); el > 0 {
		p.tokens = min(p.cap, p.tokens+el.Seconds()*p.rate)
		p.at = now
	}
	p.used = now
	return p
}

// Admitted reports a request the upstream took (200) that carried events of
// the paced keys: each one's cap grows by one event after as many admitted
// requests as the cap (slowly: the last refusal showed where the limit is),
// never past the eps_threshold nor to a share that was refused.
func (t *Throttle) Admitted(keys []string) {
	if len(keys) == 0 {
		return
	}
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		p := t.paced[k]
		if p == nil {
			continue
		}
		p.used = now
		p.grow++
		if p.grow >= p.cap && p.cap < p.ceil && p.cap < p.eps {
			p.cap++
			p.grow = 0
		}
	}
}
