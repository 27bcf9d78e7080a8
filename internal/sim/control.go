package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

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

// registerControl registers the /sim/ control routes (never faulted):
//
//	GET  /sim/healthz                       200 {"ok":true}
//	GET  /sim/stats                         Stats, plus "down" and "pending_faults"
//	GET  /sim/events?api_key=K&after=SEQ&limit=N
//	                                        {"events":[Ingested...]} (api_key optional)
//	GET  /sim/requests?after=SEQ&limit=N    {"requests":[Record...]}
//	POST /sim/reset                         Reset
//	POST /sim/fault                         body FaultSpec: queue a fault
//	POST /sim/faults/clear                  ClearFaults
//	POST /sim/latency?d=250ms               SetLatency
//	POST /sim/down?mode=refuse|503|close&for=5s
//	POST /sim/up
//	POST /sim/silence?device_id=D           Silence
//	POST /sim/unsilence?device_id=D         Unsilence
//	POST /sim/quota?n=N                     SetDailyQuota
func (s *Sim) registerControl() {
	m := s.ctlMux
	ok := func(w http.ResponseWriter) { writeJSON(w, 200, map[string]bool{"ok": true}) }
	bad := func(w http.ResponseWriter, err error) {
		writeJSON(w, 400, map[string]string{"error": err.Error()})
	}
	m.HandleFunc("GET /sim/healthz", func(w http.ResponseWriter, r *http.Request) { ok(w) })
	m.HandleFunc("GET /sim/stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, struct {
			Stats
			Down          DownMode `json:"down"`
			PendingFaults int      `json:"pending_faults"`
		}{s.Stats(), s.IsDown(), s.PendingFaults()})
	})
	m.HandleFunc("GET /sim/events", func(w http.ResponseWriter, r *http.Request) {
		after, limit, err := afterLimit(r)
		if err != nil {
			bad(w, err)
			return
		}
		var evs []Ingested
		if k := r.URL.Query().Get("api_key"); k != "" {
			evs = s.Events(k)
		} else {
			evs = s.AllEvents()
		}
		// Hand-built so that each "raw" is the event's bytes exactly as
		// received (encoding/json would compact and HTML-escape them).
		b := []byte(`{"events":[`)
		n := 0
		for _, e := range evs {
			if e.Seq <= after || n >= limit {
				continue
			}
			if n > 0 {
				b = append(b, ',')
			}
			n++
			raw := e.Raw
			e.Raw = nil
			obj := appendJSON(nil, e) // ends with "raw":null}
			obj = bytes.TrimSuffix(obj, []byte(`"raw":null}`))
			b = append(b, obj...)
			b = append(b, `"raw":`...)
			b = append(b, raw...)
			b = append(b, '}')
		}
		b = append(b, "]}"...)
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	})
	m.HandleFunc("GET /sim/requests", func(w http.ResponseWriter, r *http.Request) {
		after, limit, err := afterLimit(r)
		if err != nil {
			bad(w, err)
			return
		}
		out := []Record{}
		for _, rec := range s.Requests() {
			if rec.Seq > after && len(out) < limit {
				out = append(out, rec)
			}
		}
		writeJSON(w, 200, map[string][]Record{"requests": out})
	})
	m.HandleFunc("POST /sim/reset", func(w http.ResponseWriter, r *http.Request) { s.Reset(); ok(w) })
	m.HandleFunc("POST /sim/fault", func(w http.ResponseWriter, r *http.Request) {
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
	m.HandleFunc("POST /sim/faults/clear", func(w http.ResponseWriter, r *http.Request) { s.ClearFaults(); ok(w) })
	m.HandleFunc("POST /sim/latency", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("d"))
		if err != nil {
			bad(w, err)
			return
		}
		s.SetLatency(d)
		ok(w)
	})
	m.HandleFunc("POST /sim/down", func(w http.ResponseWriter, r *http.Request) {
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
			if err := s.setListenersDown(true); err != nil {
				s.log.Sugar().Errorf("sim: down: %v", err)
			}
		}
	})
	m.HandleFunc("POST /sim/up", func(w http.ResponseWriter, r *http.Request) {
		if err := s.Up(); err != nil {
			bad(w, err)
			return
		}
		ok(w)
	})
	m.HandleFunc("POST /sim/silence", func(w http.ResponseWriter, r *http.Request) {
		s.Silence(r.URL.Query().Get("device_id"))
		ok(w)
	})
	m.HandleFunc("POST /sim/unsilence", func(w http.ResponseWriter, r *http.Request) {
		s.Unsilence(r.URL.Query().Get("device_id"))
		ok(w)
	})
	m.HandleFunc("POST /sim/quota", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil || n < 0 {
			bad(w, fmt.Errorf("quota: bad n %q", r.URL.Query().Get("n")))
			return
		}
		s.SetDailyQuota(n)
		ok(w)
	})
}

func (s *Sim) checkDownMode(mode DownMode) error {
	switch mode {
	case DownRefuse, Down503, DownClose:
		return nil
	}
	return fmt.Errorf("sim: unknown down mode %q", mode)
}

func afterLimit(r *http.Request) (after int64, limit int, err error) {
	q := r.URL.Query()
	limit = 1 << 30
	if v := q.Get("after"); v != "" {
		if after, err = strconv.ParseInt(v, 10, 64); err != nil {
			return 0, 0, fmt.Errorf("after: %w", err)
		}
	}
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 0 {
			return 0, 0, fmt.Errorf("bad limit %q", v)
		}
	}
	return after, limit, nil
}
