package sim

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"
)

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
	// line, headers and half of the body and closes the connection.
	DropMidResponse DropMode = "mid-response"
)

// DownMode says how the Sim behaves while down.
type DownMode string

// Down modes.
const (
	// DownRefuse closes the Serve listeners (connections are refused) and
	// cuts open connections. /sim/ routes on those listeners are refused
	// too; use ServeControl or a "for" duration to come back.
	DownRefuse DownMode = "refuse"
	// Down503 answers every ingest request 503 {"code":503,...}.
	Down503 DownMode = "503"
	// DownClose reads each ingest request and closes the connection without
	// answering; /sim/ routes keep working.
	DownClose DownMode = "close"
)

// Fault is an injected fault for the next Count ingest requests.
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
	// Count is how many requests it applies to; 0 means 1, negative means
	// every request until ClearFaults.
	Count int
	// Fraction, when in (0,1), is the probability that a request gets the
	// fault (only requests that got it use up Count); 0 means every request.
	Fraction float64
	// PathPrefix limits the fault to ingest paths with this prefix; "" means all.
	PathPrefix string
	// Ingest is what a Status or DropNoAnswer fault lets the request
	// ingest before it answers the fault: the document's "The request may
	// not have been accepted" read as accepted in full, in part, or (the
	// zero value) not at all.
	Ingest IngestMode
}

// IngestMode says what of a request a failed answer ingested.
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

type faultState struct {
	queue   []*Fault
	latency time.Duration
	down    DownMode
	upTimer *time.Timer
	rng     *rand.Rand
	applied int64
}

func (f *faultState) init(seed uint64) {
	f.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// Inject queues a fault. Faults apply in the order injected: a request takes
// the first queued fault whose PathPrefix matches (a fractional one may let
// it pass untouched).
func (s *Sim) Inject(f Fault) {
	if f.Count == 0 {
		f.Count = 1
	}
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	s.faults.queue = append(s.faults.queue, &f)
}

// FailNext answers the next n ingest requests with status and the default
// JSON body.
func (s *Sim) FailNext(n, status int) { s.Inject(Fault{Status: status, Count: n}) }

// DropNext drops the connection of the next n ingest requests.
func (s *Sim) DropNext(n int, mode DropMode) { s.Inject(Fault{Drop: mode, Count: n}) }

// SetLatency delays every ingest request by d (real time) until set to 0.
func (s *Sim) SetLatency(d time.Duration) {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	s.faults.latency = d
}

// ClearFaults removes every queued fault and the latency (not the down state).
func (s *Sim) ClearFaults() {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	s.faults.queue = nil
	s.faults.latency = 0
}

// PendingFaults returns how many queued faults remain.
func (s *Sim) PendingFaults() int {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	return len(s.faults.queue)
}

// Down takes the Sim down in mode until Up. With upAfter > 0 it comes up by
// itself after that long (real time).
func (s *Sim) Down(mode DownMode, upAfter time.Duration) error {
	if err := s.setDown(mode, upAfter); err != nil {
		return err
	}
	if mode == DownRefuse {
		return s.setListenersDown(true)
	}
	return nil
}

// setDown sets the down state; ingest requests see it at once (while the
// listeners are still open, DownRefuse acts as DownClose).
func (s *Sim) setDown(mode DownMode, upAfter time.Duration) error {
	if err := s.checkDownMode(mode); err != nil {
		return err
	}
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	s.faults.down = mode
	if s.faults.upTimer != nil {
		s.faults.upTimer.Stop()
		s.faults.upTimer = nil
	}
	if upAfter > 0 {
		s.faults.upTimer = time.AfterFunc(upAfter, func() {
			if err := s.Up(); err != nil {
				s.log.Sugar().Errorf("sim: coming up: %v", err)
			}
		})
	}
	return nil
}

// Up ends a Down.
func (s *Sim) Up() error {
	s.faultMu.Lock()
	was := s.faults.down
	s.faults.down = ""
	if s.faults.upTimer != nil {
		s.faults.upTimer.Stop()
		s.faults.upTimer = nil
	}
	s.faultMu.Unlock()
	if was == DownRefuse {
		return s.setListenersDown(false)
	}
	return nil
}

// IsDown reports the current down mode ("" when up).
func (s *Sim) IsDown() DownMode {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	return s.faults.down
}

// takeFault decides what happens to one ingest request.
func (s *Sim) takeFault(path string) (latency time.Duration, f Fault, ok bool, down DownMode) {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	latency = s.faults.latency
	down = s.faults.down
	if down != "" {
		return latency, Fault{}, false, down
	}
	for i, q := range s.faults.queue {
		if !strings.HasPrefix(path, q.PathPrefix) {
			continue
		}
		if q.Fraction > 0 && q.Fraction < 1 && s.faults.rng.Float64() >= q.Fraction {
			return latency, Fault{}, false, ""
		}
		f = *q
		if q.Count > 0 {
			q.Count--
			if q.Count == 0 {
				s.faults.queue = append(s.faults.queue[:i:i], s.faults.queue[i+1:]...)
			}
		}
		s.faults.applied++
		return latency, f, true, ""
	}
	return latency, Fault{}, false, ""
}

func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// writeFault answers with the fault's status and body.
func writeFault(w http.ResponseWriter, f Fault) {
	body, ct := f.Body, f.ContentType
	if body == nil {
		body = appendJSON(nil, errBody{Code: f.Status, Error: defaultErrorText(f.Status)})
		if ct == "" {
			ct = "application/json"
		}
	}
	if ct == "" {
		ct = "text/plain; charset=utf-8"
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(f.Status)
	w.Write(body)
}

func defaultErrorText(status int) string {
	if t := http.StatusText(status); t != "" {
		return t
	}
	return "Error"
}

// hijackClose closes the request's connection without answering.
func hijackClose(w http.ResponseWriter) bool {
	c, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// bufferedWriter captures a handler's answer so the middleware can drop it.
type bufferedWriter struct {
	h      http.Header
	status int
	buf    bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header { return b.h }
func (b *bufferedWriter) WriteHeader(code int) {
	if b.status == 0 {
		b.status = code
	}
}
func (b *bufferedWriter) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = 200
	}
	return b.buf.Write(p)
}
