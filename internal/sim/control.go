package sim

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
)

// registerControl registers the store's /sim/ read-outs (package doc).
func (s *Sim) registerControl() {
	m := s.ctlMux
	m.HandleFunc("GET /sim/healthz", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, map[string]bool{"ok": true}) })
	m.HandleFunc("GET /sim/stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, s.Stats())
	})
	m.HandleFunc("GET /sim/events", func(w http.ResponseWriter, r *http.Request) {
		after, limit, err := afterLimit(r)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
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
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
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
}

// readout registers a /sim/ read-out answering view's value as JSON,
// taken and encoded with s.mu held (view reads route group state).
func (s *Sim) readout(pattern string, view func(q url.Values) any) {
	s.ctlMux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, locked(&s.mu, func() []byte { return appendJSON(nil, view(r.URL.Query())) }))
	})
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
