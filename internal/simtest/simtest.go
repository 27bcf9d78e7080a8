// Package simtest holds the simulated upstream's test-only parts: fault
// injection (Sim: a sim.Sim with a fault queue, latency, a down state and
// listeners that can refuse; serve.go plays each failure on the model's
// sim.Exchange, its seam sim.Faults), the /sim/ routes that drive it and turn the
// model's knobs, the functions that turn them in process and read the
// model's read-outs (knobs.go: Silence(s, d), MappedTo(s, key, user), ...;
// s a sim.Sim or a Sim), and the Go client of the /sim/ routes (Control).
//
// The product (sandbox mode, `relay sim`) serves internal/sim alone, whose
// /sim/ routes only read (events, requests, stats, per-group logs). Only
// _test.go files and test helpers (test/..., forwardtest, formstest)
// import this package, so none of it is compiled into the relay binary.
//
// Routes a Sim adds to the model's read-outs (JSON answers {"ok":true} or {"error":"..."}):
//
//	POST /sim/reset                         Sim.Reset
//	POST /sim/fault          FaultSpec JSON: {"status":503,"count":3,"fraction":0.5,
//	                         "body":"any text","content_type":"text/html",
//	                         "drop":"no-answer|mid-request|after-ingest|mid-response",
//	                         "latency":"250ms","path_prefix":"/batch","ingest":"half"}
//	POST /sim/faults/clear                  Sim.ClearFaults
//	POST /sim/latency?d=250ms               Sim.SetLatency
//	POST /sim/down?mode=refuse|503|close&for=5s
//	POST /sim/up
//	GET  /sim/faults                        FaultState: the down mode, pending faults
//	POST /sim/silence?device_id=D           Silence
//	POST /sim/unsilence?device_id=D         Unsilence
//	POST /sim/quota?n=N                     SetDailyQuota
//	POST /sim/dsar/config                   DSARConfig JSON: SetDSAR
//	POST /sim/export/config                 ExportConfig JSON: SetExport
//	POST /sim/usermap?limit=N&window=D&api_key=K&org=O&secret=S&reject_user_id=U
//	                                        SetUserMapRate, SetUserMapOrg, SetSecretKey,
//	                                        RejectUserID (each when given)
package simtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/svcrelay/relay/internal/sim"
	"go.uber.org/zap"
)

// ErrClosed is returned by Serve after Close, and by Up after Close.
var ErrClosed = sim.ErrClosed

// DropMode says how an injected fault drops the connection.
type DropMode string

// Drop modes.
const (
	// DropNone answers normally (or with Fault.Status).
	DropNone DropMode = ""
	// DropNoAnswer reads the request, then closes the connection without
	// answering. Nothing is ingested.
	DropNoAnswer DropMode = "no-answer"
	// DropMidRequest reads about half of the request body, then closes the
	// connection (an upload cut off). Nothing is ingested.
	DropMidRequest DropMode = "mid-request"
	// DropAfterIngest handles the request normally (a 200 ingests its
	// events), then closes the connection without answering: the lost
	// answer a retry with insert_id makes safe.
	DropAfterIngest DropMode = "after-ingest"
	// DropMidResponse handles the request normally, then sends the status
	// line, headers and half of the body and closes the connection (a
	// streaming data API's answer is cut after 64 KiB instead).
	DropMidResponse DropMode = "mid-response"
)

// DownMode says how the Sim behaves while down.
type DownMode string

// Down modes.
const (
	// DownRefuse: connections are refused (the listeners are closed and
	// open connections cut; a request that still arrives is dropped as
	// with DownClose).
	DownRefuse DownMode = "refuse"
	// Down503 answers every upstream request 503 {"code":503,...}.
	Down503 DownMode = "503"
	// DownClose reads each upstream request and closes the connection
	// without answering; /sim/ routes keep working.
	DownClose DownMode = "close"
)

// IngestMode says what of a request a failed answer ingested: the
// document's "The request may not have been accepted" read as accepted in
// full, in part, or (the zero value) not at all.
type IngestMode string

// Ingest modes.
const (
	// IngestNone: nothing (a non-200 answer ingests nothing).
	IngestNone IngestMode = ""
	// IngestAll: the request is handled (ingested when valid and under the
	// limits), then the fault is answered instead.
	IngestAll IngestMode = "all"
	// IngestHalf: the first half of the request's events are handled so.
	IngestHalf IngestMode = "half"
)

// Fault is an injected fault for the next Count requests: how the upstream
// fails a request (the answer it sends instead of its own, or how it drops
// the connection, and what of the request it ingested first) and which
// requests get it.
type Fault struct {
	// Status is the HTTP status to answer (e.g. 500, 502, 503, 504, or any
	// other); 0 with Drop set drops instead; 0 without Drop only applies Latency.
	Status int
	// Body is the answer's body; nil means {"code":Status,"error":"..."}.
	// Any bytes (also non-JSON) are sent as given.
	Body []byte
	// ContentType of Body; "" means application/json for the default body
	// and text/plain otherwise.
	ContentType string
	// Drop drops the connection instead of answering (see DropMode).
	Drop DropMode
	// Latency is added (real time) before the request is handled.
	Latency time.Duration
	// Ingest is what a Status or DropNoAnswer fault lets the request ingest
	// before it answers the fault (see IngestMode).
	Ingest IngestMode
	// Count is how many requests it applies to; 0 means 1, negative means
	// every request until ClearFaults.
	Count int
	// Fraction, when in (0,1), is the probability that a request gets the
	// fault (only requests that got it use up Count); 0 means every request.
	Fraction float64
	// PathPrefix limits the fault to paths with this prefix; "" means all.
	PathPrefix string
}

// Sim is a sim.Sim with fault injection: a queue of faults, a latency, a
// down state, listeners that can refuse connections, and the routes of
// the package doc. Create it with New.
type Sim struct {
	*sim.Sim

	// mu guards the fault state; it is never held while calling the Sim.
	mu      sync.Mutex
	queue   []*Fault
	latency time.Duration
	down    DownMode
	upTimer *time.Timer
	rng     *rand.Rand

	lnMu      sync.Mutex
	listeners []*switchListener
	closed    bool
	ctlSrv    *http.Server
}

// New returns a simulator with fault injection and the routes of the
// package doc (see sim.New; cfg.Faults is replaced). Fractional faults are
// drawn from a generator seeded with seed (0 means 1).
func New(cfg sim.Config, log *zap.Logger) *Sim { return NewSeeded(cfg, log, 1) }

// NewSeeded is New with the seed of fractional faults.
func NewSeeded(cfg sim.Config, log *zap.Logger, seed uint64) *Sim {
	if seed == 0 {
		seed = 1
	}
	if log == nil {
		log = zap.NewNop()
	}
	s := &Sim{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	cfg.Faults = hooks{s}
	s.Sim = sim.New(cfg, log)
	s.ctlSrv = &http.Server{Handler: s.ControlHandler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: zap.NewStdLog(log)}
	return s
}

// hooks is the Sim's sim.Faults.
type hooks struct{ s *Sim }

func (h hooks) Serve(x *sim.Exchange)                 { h.s.serve(x) }
func (h hooks) Routes(_ *sim.Sim, ctl *http.ServeMux) { h.s.routes(ctl) }

// Count returns the number of events ingested (duplicates excluded), also
// those Config.Keep no longer keeps.
func (s *Sim) Count() int64 { return s.Stats().Ingested }

// Duplicates returns how many events were recognised as duplicates.
func (s *Sim) Duplicates() int64 { return s.Stats().Duplicates }

// Inject queues a fault. Faults apply in the order injected: a request takes
// the first queued fault whose PathPrefix matches (a fractional one may let
// it pass untouched).
func (s *Sim) Inject(f Fault) {
	if f.Count == 0 {
		f.Count = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, &f)
}

// FailNext answers the next n requests with status and the default JSON
// body.
func (s *Sim) FailNext(n, status int) { s.Inject(Fault{Status: status, Count: n}) }

// DropNext drops the connection of the next n requests.
func (s *Sim) DropNext(n int, mode DropMode) { s.Inject(Fault{Drop: mode, Count: n}) }

// SetLatency delays every request by d (real time) until set to 0.
func (s *Sim) SetLatency(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = d
}

// ClearFaults removes every queued fault and the latency (not the down state).
func (s *Sim) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = nil
	s.latency = 0
}

// PendingFaults returns how many queued faults remain.
func (s *Sim) PendingFaults() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// Reset clears the faults and the latency, then resets the Sim (sim.Sim.Reset).
func (s *Sim) Reset() {
	s.ClearFaults()
	s.Sim.Reset()
}

// Down takes the Sim down in mode until Up. With upAfter > 0 it comes up by
// itself after that long (real time). DownRefuse closes the Serve listeners
// and cuts their connections (so /sim/ routes on them are refused too: use
// ServeControl or upAfter to come back).
func (s *Sim) Down(mode DownMode, upAfter time.Duration) error {
	if err := s.setDown(mode, upAfter); err != nil {
		return err
	}
	if mode == DownRefuse {
		return s.setListenersDown(true)
	}
	return nil
}

// setDown sets the down state; requests see it at once (while the
// listeners are still open, DownRefuse acts as DownClose).
func (s *Sim) setDown(mode DownMode, upAfter time.Duration) error {
	switch mode {
	case DownRefuse, Down503, DownClose:
	default:
		return fmt.Errorf("simtest: unknown down mode %q", mode)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = mode
	if s.upTimer != nil {
		s.upTimer.Stop()
		s.upTimer = nil
	}
	if upAfter > 0 {
		s.upTimer = time.AfterFunc(upAfter, func() { s.Up() }) //nolint:errcheck // ErrClosed after Close
	}
	return nil
}

// Up ends a Down.
func (s *Sim) Up() error {
	s.mu.Lock()
	was := s.down
	s.down = ""
	if s.upTimer != nil {
		s.upTimer.Stop()
		s.upTimer = nil
	}
	s.mu.Unlock()
	if was == DownRefuse {
		return s.setListenersDown(false)
	}
	return nil
}

// IsDown reports the current down mode ("" when up).
func (s *Sim) IsDown() DownMode {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.down
}

// take decides what happens to one request: latency to add before it is
// handled, the fault to apply when ok, and the down mode when not "" (then
// f and ok are ignored).
func (s *Sim) take(path string) (latency time.Duration, f Fault, ok bool, down DownMode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	latency = s.latency
	if s.down != "" {
		return latency, Fault{}, false, s.down
	}
	for i, q := range s.queue {
		if !strings.HasPrefix(path, q.PathPrefix) {
			continue
		}
		if q.Fraction > 0 && q.Fraction < 1 && s.rng.Float64() >= q.Fraction {
			return latency, Fault{}, false, ""
		}
		f = *q
		if q.Count > 0 {
			q.Count--
			if q.Count == 0 {
				s.queue = append(s.queue[:i:i], s.queue[i+1:]...)
			}
		}
		return latency, f, true, ""
	}
	return latency, Fault{}, false, ""
}

// Serve serves on ln until Close. The Sim keeps ln's address so that Down
// with DownRefuse can close it and Up can listen on it again.
func (s *Sim) Serve(ln net.Listener) error {
	s.lnMu.Lock()
	if s.closed {
		s.lnMu.Unlock()
		ln.Close()
		return ErrClosed
	}
	sl := newSwitchListener(ln, s.IsDown() == DownRefuse)
	s.listeners = append(s.listeners, sl)
	s.lnMu.Unlock()
	return s.Sim.Serve(sl)
}

// ServeControl serves only the /sim/ routes on ln until Close; it is never
// affected by faults or Down.
func (s *Sim) ServeControl(ln net.Listener) error {
	err := s.ctlSrv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return ErrClosed
	}
	return err
}

// Start listens on addr (e.g. "127.0.0.1:0") and serves in a new goroutine
// until Close. It returns the base URL ("http://127.0.0.1:PORT").
func (s *Sim) Start(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("simtest: listen: %w", err)
	}
	go s.Serve(ln) //nolint:errcheck // ends with ErrClosed at Close
	return "http://" + ln.Addr().String(), nil
}

// Close stops serving: listeners are closed and connections dropped.
func (s *Sim) Close() error {
	s.lnMu.Lock()
	s.closed = true
	ls := s.listeners
	s.listeners = nil
	s.lnMu.Unlock()
	var errs []error
	for _, l := range ls {
		if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, s.Sim.Close(), s.ctlSrv.Close())
	s.mu.Lock()
	if s.upTimer != nil {
		s.upTimer.Stop()
	}
	s.mu.Unlock()
	return errors.Join(errs...)
}

// setListenersDown closes (down) or reopens (up) every Serve listener;
// going down cuts their connections.
func (s *Sim) setListenersDown(down bool) error {
	s.lnMu.Lock()
	ls := append([]*switchListener(nil), s.listeners...)
	s.lnMu.Unlock()
	var firstErr error
	for _, l := range ls {
		if down {
			l.goDown()
		} else if err := l.goUp(); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// FaultSpec is the JSON form of a Fault for POST /sim/fault.
type FaultSpec struct {
	Status      int     `json:"status,omitempty"`
	Body        *string `json:"body,omitempty"` // sent as given (may be non-JSON)
	ContentType string  `json:"content_type,omitempty"`
	Drop        string  `json:"drop,omitempty"`    // "no-answer", "mid-request", "after-ingest", "mid-response"
	Latency     string  `json:"latency,omitempty"` // Go duration, e.g. "250ms"
	Count       int     `json:"count,omitempty"`
	Fraction    float64 `json:"fraction,omitempty"`
	PathPrefix  string  `json:"path_prefix,omitempty"`
	Ingest      string  `json:"ingest,omitempty"` // "", "all", "half": what a status or no-answer fault ingests
}

// Fault converts the spec.
func (f FaultSpec) Fault() (Fault, error) {
	out := Fault{Status: f.Status, ContentType: f.ContentType, Drop: DropMode(f.Drop),
		Count: f.Count, Fraction: f.Fraction, PathPrefix: f.PathPrefix, Ingest: IngestMode(f.Ingest)}
	switch out.Ingest {
	case IngestNone, IngestAll, IngestHalf:
	default:
		return Fault{}, fmt.Errorf("unknown ingest mode %q", f.Ingest)
	}
	if f.Body != nil {
		out.Body = []byte(*f.Body)
	}
	switch out.Drop {
	case DropNone, DropNoAnswer, DropMidRequest, DropAfterIngest, DropMidResponse:
	default:
		return Fault{}, fmt.Errorf("unknown drop mode %q", f.Drop)
	}
	if f.Latency != "" {
		d, err := time.ParseDuration(f.Latency)
		if err != nil {
			return Fault{}, fmt.Errorf("latency: %w", err)
		}
		out.Latency = d
	}
	if out.Status != 0 && (out.Status < 100 || out.Status > 999) {
		return Fault{}, fmt.Errorf("bad status %d", out.Status)
	}
	if out.Fraction < 0 || out.Fraction > 1 {
		return Fault{}, fmt.Errorf("fraction %v outside [0,1]", out.Fraction)
	}
	return out, nil
}

// routes adds the routes of the package doc to the Sim's control mux ctl.
func (s *Sim) routes(ctl *http.ServeMux) {
	ok := func(w http.ResponseWriter) { writeJSON(w, http.StatusOK, map[string]bool{"ok": true}) }
	bad := func(w http.ResponseWriter, err error) {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
	}
	ctl.HandleFunc("POST /sim/reset", func(w http.ResponseWriter, r *http.Request) { s.Reset(); ok(w) })
	ctl.HandleFunc("POST /sim/fault", func(w http.ResponseWriter, r *http.Request) {
		var spec FaultSpec
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&spec); err != nil {
			bad(w, fmt.Errorf("fault: %w", err))
			return
		}
		f, err := spec.Fault()
		if err != nil {
			bad(w, err)
			return
		}
		s.Inject(f)
		ok(w)
	})
	ctl.HandleFunc("POST /sim/faults/clear", func(w http.ResponseWriter, r *http.Request) { s.ClearFaults(); ok(w) })
	ctl.HandleFunc("POST /sim/latency", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("d"))
		if err != nil {
			bad(w, err)
			return
		}
		s.SetLatency(d)
		ok(w)
	})
	ctl.HandleFunc("POST /sim/down", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		var upAfter time.Duration
		if v := q.Get("for"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				bad(w, err)
				return
			}
			upAfter = d
		}
		mode := DownMode(q.Get("mode"))
		if mode == "" {
			mode = DownRefuse
		}
		// The state first (ingest requests see it at once), then the answer,
		// then the listeners: going down for "refuse" cuts this connection too.
		if err := s.setDown(mode, upAfter); err != nil {
			bad(w, err)
			return
		}
		ok(w)
		http.NewResponseController(w).Flush()
		if mode == DownRefuse {
			s.setListenersDown(true) //nolint:errcheck // closing listeners; the answer is sent
		}
	})
	ctl.HandleFunc("POST /sim/dsar/config", func(w http.ResponseWriter, r *http.Request) {
		var c DSARConfig
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&c); err != nil {
			bad(w, fmt.Errorf("dsar config: %w", err))
			return
		}
		if err := SetDSAR(s, c); err != nil {
			bad(w, err)
			return
		}
		ok(w)
	})
	ctl.HandleFunc("POST /sim/export/config", func(w http.ResponseWriter, r *http.Request) {
		var c ExportConfig
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&c); err != nil {
			bad(w, fmt.Errorf("export config: %w", err))
			return
		}
		if err := SetExport(s, c); err != nil {
			bad(w, err)
			return
		}
		ok(w)
	})
	ctl.HandleFunc("POST /sim/usermap", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		var limit int
		var window time.Duration
		if v := q.Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				bad(w, fmt.Errorf("usermap: bad limit %q", v))
				return
			}
			limit = n
		}
		if v := q.Get("window"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				bad(w, fmt.Errorf("usermap: bad window %q", v))
				return
			}
			window = d
		}
		SetUserMapRate(s, limit, window)
		if k := q.Get("api_key"); k != "" {
			if o := q.Get("org"); o != "" {
				SetUserMapOrg(s, k, o)
			}
			if sec := q.Get("secret"); sec != "" {
				SetSecretKey(s, k, sec)
			}
		}
		if u := q.Get("reject_user_id"); u != "" {
			RejectUserID(s, u)
		}
		ok(w)
	})
	ctl.HandleFunc("GET /sim/faults", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, FaultState{Down: s.IsDown(), PendingFaults: s.PendingFaults()})
	})
	ctl.HandleFunc("POST /sim/up", func(w http.ResponseWriter, r *http.Request) {
		if err := s.Up(); err != nil {
			bad(w, err)
			return
		}
		ok(w)
	})
	ctl.HandleFunc("POST /sim/silence", func(w http.ResponseWriter, r *http.Request) {
		Silence(s, r.URL.Query().Get("device_id"))
		ok(w)
	})
	ctl.HandleFunc("POST /sim/unsilence", func(w http.ResponseWriter, r *http.Request) {
		Unsilence(s, r.URL.Query().Get("device_id"))
		ok(w)
	})
	ctl.HandleFunc("POST /sim/quota", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil || n < 0 {
			bad(w, fmt.Errorf("quota: bad n %q", r.URL.Query().Get("n")))
			return
		}
		SetDailyQuota(s, n)
		ok(w)
	})
}

// FaultState is the answer of GET /sim/faults.
type FaultState struct {
	Down          DownMode `json:"down"`
	PendingFaults int      `json:"pending_faults"`
}

// writeJSON answers v with a Content-Length (POST /sim/down cuts the
// connection right after the answer is flushed).
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b) //nolint:errcheck // the client went away
}
