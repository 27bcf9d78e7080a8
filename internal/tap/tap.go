package tap

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/storage"
)

// Where is the point of the pipeline a tap watches.
type Where uint8

// The points.
const (
	Ingest    Where = iota // accepted at ingest (answered 200, spooled)
	Delivered              // accepted by the upstream (answered 200)
	Dead                   // stored as a dead letter
	numWhere
)

var whereNames = [numWhere]string{"ingest", "delivered", "dead"}

func (w Where) String() string { return whereNames[w] }

// ParseWhere parses "ingest", "delivered" or "dead"; "" means Ingest.
func ParseWhere(s string) (Where, error) {
	if s == "" {
		return Ingest, nil
	}
	if i := slices.Index(whereNames[:], s); i >= 0 {
		return Where(i), nil
	}
	return 0, fmt.Errorf("where %q: want ingest, delivered or dead", s)
}

// KeyHash is the name of an api_key on a tap line: the first 8 bytes of
// its SHA-256, in hex. The key itself is never shown.
func KeyHash(apiKey []byte) string {
	h := sha256.Sum256(apiKey)
	return hex.EncodeToString(h[:8])
}

// Filter selects the events a tap gets; zero fields match everything.
type Filter struct {
	Where      Where
	APIKeyHash string // KeyHash of the api_key
	EventType  string
	DeviceID   string
	// Sample keeps one matching event in Sample; 0 and 1 keep all.
	Sample uint64
}

// Config configures a Hub.
type Config struct {
	// MaxTaps is the most taps attached at once; 0 means DefaultMaxTaps.
	MaxTaps int
	// Buffer is each tap's buffer, in events; 0 means DefaultBuffer.
	Buffer int
}

// Defaults.
const (
	DefaultMaxTaps = 4
	DefaultBuffer  = 1024
)

// ErrTooMany is returned by Attach when Config.MaxTaps taps are attached.
var ErrTooMany = errors.New("tap: too many taps attached")

// ErrClosed is returned by Attach after Close.
var ErrClosed = errors.New("tap: closed")

// Item is one event a tap got.
type Item struct {
	Where      Where
	APIKeyHash string
	Reason     string // a dead letter's reason
	Event      []byte // the event object (a copy)
}

// Tap is one attached watcher. Its owner reads c until h.done is closed or
// it has seen enough, then calls Detach.
type Tap struct {
	h       *Hub
	f       Filter
	devKey  []byte // "d:" + DeviceID: the OrderKey of the device's events
	typeTok []byte // `"EventType"`: present in every event of that type
	c       chan Item
	seen    atomic.Uint64 // matching events, for Sample
	dropped atomic.Uint64 // matching events dropped because c was full
}

// Hub hands events to the attached taps. The zero value is not usable: see
// New. A nil *Hub has no taps.
type Hub struct {
	cfg  Config
	nAt  [numWhere]atomic.Int32 // taps attached per Where: all a hot path reads when 0
	taps atomic.Pointer[[]*Tap] // snapshot for Pick
	mu   sync.Mutex             // guards attaching, detaching, closed
	done chan struct{}          // closed by Close (the relay stops)
	shut bool

	dropped prometheus.Counter
	sent    [numWhere]prometheus.Counter
}

// New returns a Hub with its metrics registered on reg (nil: none).
func New(cfg Config, reg prometheus.Registerer) (*Hub, error) {
	if cfg.MaxTaps < 0 || cfg.Buffer < 0 {
		return nil, errors.New("tap: negative MaxTaps or Buffer")
	}
	cfg.MaxTaps, cfg.Buffer = cmp.Or(cfg.MaxTaps, DefaultMaxTaps), cmp.Or(cfg.Buffer, DefaultBuffer)
	h := &Hub{cfg: cfg, done: make(chan struct{})}
	h.taps.Store(new([]*Tap))
	f := promauto.With(reg)
	h.dropped = f.NewCounter(prometheus.CounterOpts{
		Name: "relay_tap_dropped_events_total",
		Help: "Events a live tap matched but dropped because its reader was behind (the tap's buffer was full).",
	})
	sent := f.NewCounterVec(prometheus.CounterOpts{
		Name: "relay_tap_events_total",
		Help: "Events handed to live taps, by where they were tapped.",
	}, []string{"where"})
	for w := range numWhere {
		h.sent[w] = sent.WithLabelValues(w.String())
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "relay_tap_attached",
		Help: "Live taps attached (relay tap).",
	}, func() float64 { return float64(len(h.snapshot())) })
	return h, nil
}

// Active reports whether a tap watching w is attached: the one atomic load
// a hot path pays before calling Pick.
func (h *Hub) Active(w Where) bool { return h != nil && h.nAt[w].Load() > 0 }

// storeLocked puts taps in force (a new slice: Pick may read the old one)
// and sets the counts; h.mu is held.
func (h *Hub) storeLocked(taps []*Tap) {
	h.taps.Store(&taps)
	var at [numWhere]int32
	for _, t := range taps {
		at[t.f.Where]++
	}
	for w := range at {
		h.nAt[w].Store(at[w])
	}
}

// Attach attaches a tap with filter f.
func (h *Hub) Attach(f Filter) (*Tap, error) {
	if f.Where >= numWhere {
		return nil, fmt.Errorf("tap: bad where %d", f.Where)
	}
	t := &Tap{h: h, f: f, c: make(chan Item, h.cfg.Buffer)}
	if f.DeviceID != "" {
		t.devKey = []byte(event.DeviceKeyPrefix + f.DeviceID)
	}
	if f.EventType != "" {
		t.typeTok, _ = json.Marshal(f.EventType)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.shut {
		return nil, ErrClosed
	}
	if len(h.snapshot()) >= h.cfg.MaxTaps {
		return nil, ErrTooMany
	}
	h.storeLocked(append(slices.Clone(h.snapshot()), t))
	return t, nil
}

// Detach removes t; its channel is never closed (Send may hold it).
func (t *Tap) Detach() {
	h := t.h
	h.mu.Lock()
	defer h.mu.Unlock()
	h.storeLocked(slices.DeleteFunc(slices.Clone(h.snapshot()), func(o *Tap) bool { return o == t }))
}

func (h *Hub) snapshot() []*Tap { return *h.taps.Load() }

// Close ends every tap (Done is closed) and refuses new ones.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.shut {
		h.shut = true
		close(h.done)
	}
}

// Picked are copies of records taps want, not yet handed to them: for a
// caller whose records are consumed by the step that must succeed first
// (the spool's Append takes the batch's memory).
type Picked []picked

type picked struct {
	t  *Tap
	it Item
}

// Pick returns copies of the records of one api_key at where (reason: a
// dead letter's, else "") the attached taps want (nil when none), to be
// handed over by Send, which never blocks.
func (h *Hub) Pick(where Where, apiKey []byte, reason string, recs []storage.Record) Picked {
	if !h.Active(where) {
		return nil
	}
	var out Picked
	keyHash := KeyHash(apiKey)
	for _, t := range h.snapshot() {
		if t.f.Where != where || t.f.APIKeyHash != "" && t.f.APIKeyHash != keyHash {
			continue
		}
		for i := range recs {
			if t.wants(&recs[i]) {
				out = append(out, picked{t, Item{Where: where, APIKeyHash: keyHash, Reason: reason, Event: bytes.Clone(recs[i].Data)}})
			}
		}
	}
	return out
}

// wants applies t's filter and sampling to r.
func (t *Tap) wants(r *storage.Record) bool {
	if t.devKey != nil && !bytes.Equal(r.OrderKey, t.devKey) {
		return false
	}
	// A necessary condition, checked exactly by the reader (Matches).
	if t.typeTok != nil && !bytes.Contains(r.Data, t.typeTok) {
		return false
	}
	n := t.f.Sample
	return n <= 1 || (t.seen.Add(1)-1)%n == 0
}

// Send hands the picked items to their taps; one whose buffer is full is
// dropped and counted.
func (p Picked) Send() {
	for _, x := range p {
		select {
		case x.t.c <- x.it:
			x.t.h.sent[x.it.Where].Inc()
		default:
			x.t.dropped.Add(1)
			x.t.h.dropped.Inc()
		}
	}
}

// PublishDead offers dead letters (of any lanes).
func (h *Hub) PublishDead(dls []storage.DeadLetter) {
	if !h.Active(Dead) {
		return
	}
	for i := range dls {
		d := &dls[i]
		h.Pick(Dead, []byte(d.Lane.APIKey), d.Reason, []storage.Record{d.Record}).Send()
	}
}

// PublishBody offers the events of an upstream request body (the
// envelope {"api_key", "events"}), at where.
func (h *Hub) PublishBody(where Where, body []byte) {
	if !h.Active(where) {
		return
	}
	var req event.Request
	if e := event.Parse(body, &req); e != nil {
		return
	}
	// Every order key in one buffer, sized first: no slice is moved.
	n := 0
	for i := range req.Events {
		n += len(event.DeviceKeyPrefix) + max(len(req.Events[i].DeviceID), len(req.Events[i].UserID))
	}
	keys := make([]byte, 0, n)
	recs := make([]storage.Record, len(req.Events))
	for i := range req.Events {
		ev := &req.Events[i]
		start := len(keys)
		keys = ev.OrderKey(keys)
		recs[i] = storage.Record{OrderKey: keys[start:len(keys):len(keys)], Data: ev.Raw}
	}
	h.Pick(where, req.APIKey, "", recs).Send()
}
