package sim

import (
	"bytes"
	"math"
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
		after, limit, ok := afterLimit(w, r)
		if !ok {
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
			if e.Seq <= int64(after) || n >= limit {
				continue
			}
			if n > 0 {
				b = append(b, ',')
			}
			n++
			raw := e.Raw
			e.Raw = nil
			b = bytes.TrimSuffix(appendJSON(b, e), []byte("null}")) // it ended with "raw":null}
			b = append(append(b, raw...), '}')
		}
		writeJSON(w, http.StatusOK, append(b, "]}"...))
	})
	m.HandleFunc("GET /sim/requests", func(w http.ResponseWriter, r *http.Request) {
		after, limit, ok := afterLimit(w, r)
		if !ok {
			return
		}
		out := []Record{}
		for _, rec := range s.Requests() {
			if rec.Seq > int64(after) && len(out) < limit {
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

// afterLimit reads the read-outs' after and limit, answering 400 when
// they are not integers (limit >= 0).
func afterLimit(w http.ResponseWriter, r *http.Request) (after, limit int, ok bool) {
	q := r.URL.Query()
	after, ok1 := queryInt(q, "after", 0, math.MinInt, math.MaxInt)
	limit, ok2 := queryInt(q, "limit", math.MaxInt, 0, math.MaxInt)
	if !ok1 || !ok2 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "after and limit must be integers, limit >= 0"})
	}
	return after, limit, ok1 && ok2
}

// queryInt reads the integer query parameter name, def when absent; ok is
// false when it is not an integer from lo to hi.
func queryInt(q url.Values, name string, def, lo, hi int) (n int, ok bool) {
	v := q.Get(name)
	if v == "" {
		return def, true
	}
	n, err := strconv.Atoi(v)
	return n, err == nil && n >= lo && n <= hi
}
