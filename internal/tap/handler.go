package tap

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/svcrelay/relay/internal/adminroute"
)

// Bounds of a tap's duration.
const (
	DefaultDuration = time.Minute
	MaxDuration     = time.Hour
)

// dropReportEvery is how often a tap's client is told of new drops.
const dropReportEvery = time.Second

// Handler serves GET /relay/v1/tap: the events the query selects, one JSON
// object a line, until limit events were written, the duration ended, the
// client went away or the hub closed. Query parameters: where
// (ingest|delivered|dead), project (resolved by project to an api_key),
// api_key_hash, event_type, device, sample, limit, duration (Go syntax,
// at most MaxDuration), mask (true: property values masked).
//
// Event lines are {"where","api_key_hash","reason"?,"event"}; a line
// {"dropped":N} reports the total dropped so far when it grew; the last
// line is {"end":"limit"|"duration"|"stopped","events":N,"dropped":N}.
// More than MaxTaps at once: 429.
func (h *Hub) Handler(project func(name string) (apiKey string, ok bool)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		fail := func(status int, msg string) {
			adminroute.WriteJSON(w, status, map[string]any{"code": status, "error": msg})
		}
		var f Filter
		var err error
		if f.Where, err = ParseWhere(q.Get("where")); err != nil {
			fail(http.StatusBadRequest, err.Error())
			return
		}
		f.APIKeyHash, f.EventType, f.DeviceID = q.Get("api_key_hash"), q.Get("event_type"), q.Get("device")
		if name := q.Get("project"); name != "" {
			if f.APIKeyHash != "" {
				fail(http.StatusBadRequest, "project and api_key_hash exclude each other")
				return
			}
			key, ok := project(name)
			if !ok {
				fail(http.StatusNotFound, "no project "+strconv.Quote(name)+" in the credentials file")
				return
			}
			f.APIKeyHash = KeyHash([]byte(key))
		}
		var limit uint64
		if v := q.Get("limit"); v != "" {
			if limit, err = strconv.ParseUint(v, 10, 64); err != nil {
				fail(http.StatusBadRequest, "limit: want a count")
				return
			}
		}
		if v := q.Get("sample"); v != "" {
			if f.Sample, err = strconv.ParseUint(v, 10, 64); err != nil {
				fail(http.StatusBadRequest, "sample: want N (one event in N)")
				return
			}
		}
		dur := DefaultDuration
		if v := q.Get("duration"); v != "" {
			if dur, err = time.ParseDuration(v); err != nil || dur <= 0 || dur > MaxDuration {
				fail(http.StatusBadRequest, "duration: want a Go duration above 0 and at most "+MaxDuration.String())
				return
			}
		}
		mask := q.Get("mask") == "true" || q.Get("mask") == "1"

		t, err := h.Attach(f)
		switch {
		case errors.Is(err, ErrTooMany):
			w.Header().Set("Retry-After", "10")
			fail(http.StatusTooManyRequests, "too many taps attached (at most "+strconv.Itoa(h.cfg.MaxTaps)+"): try again later")
			return
		case err != nil:
			fail(http.StatusServiceUnavailable, err.Error())
			return
		}
		defer t.Detach()

		rc := http.NewResponseController(w)
		// The listener's write time-out is for ordinary answers: a tap
		// writes for its duration.
		_ = rc.SetWriteDeadline(time.Now().Add(dur + time.Minute))
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()

		end := time.NewTimer(dur)
		defer end.Stop()
		tick := time.NewTicker(dropReportEvery)
		defer tick.Stop()
		var n, reported uint64
		var line []byte
		finish := func(why string) {
			b, _ := json.Marshal(struct {
				End     string `json:"end"`
				Events  uint64 `json:"events"`
				Dropped uint64 `json:"dropped"`
			}{why, n, t.dropped.Load()})
			w.Write(append(b, '\n'))
			_ = rc.Flush()
		}
		for limit == 0 || n < limit {
			select {
			case it := <-t.c:
				if !Matches(f, it.Event) {
					continue
				}
				line = AppendLine(line[:0], it, mask)
				if _, err := w.Write(line); err != nil {
					return
				}
				n++
				if len(t.c) == 0 {
					if rc.Flush() != nil {
						return
					}
				}
			case <-tick.C:
				if d := t.dropped.Load(); d != reported {
					reported = d
					w.Write(strconv.AppendUint(append(line[:0], `{"dropped":`...), d, 10))
					w.Write([]byte("}\n"))
					if rc.Flush() != nil {
						return
					}
				}
			case <-end.C:
				finish("duration")
				return
			case <-t.h.done:
				finish("stopped")
				return
			case <-r.Context().Done():
				return
			}
		}
		finish("limit")
	})
}

// Matches checks what Pick only pre-filtered: the event's event_type.
func Matches(f Filter, ev []byte) bool {
	if f.EventType == "" {
		return true
	}
	var e struct {
		EventType string `json:"event_type"`
	}
	return json.Unmarshal(ev, &e) == nil && e.EventType == f.EventType
}

// maskedKeys are the objects whose values Mask replaces.
var maskedKeys = []string{"event_properties", "user_properties", "groups", "group_properties"}

// AppendLine appends it as a tap line (with its newline) to dst; with mask,
// property values are masked. Built by hand: the event is a spooled
// record, valid JSON already, and re-encoding it would cost the reader
// (which shares the CPUs with ingest) several times more.
func AppendLine(dst []byte, it Item, mask bool) []byte {
	ev := it.Event
	if mask {
		ev = maskEvent(it.Event)
	}
	dst = append(dst, `{"where":"`...)
	dst = append(dst, it.Where.String()...)
	dst = append(dst, `","api_key_hash":"`...)
	dst = append(dst, it.APIKeyHash...) // hex
	dst = append(dst, '"')
	if it.Reason != "" {
		r, _ := json.Marshal(it.Reason)
		dst = append(append(dst, `,"reason":`...), r...)
	}
	dst = append(append(dst, `,"event":`...), ev...)
	return append(dst, "}\n"...)
}

// maskEvent replaces every value inside the property objects of ev by
// "***", keeping their keys.
func maskEvent(ev []byte) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(ev, &m) != nil {
		return json.RawMessage(`"***"`)
	}
	for _, k := range maskedKeys {
		v, ok := m[k]
		if !ok {
			continue
		}
		var props map[string]json.RawMessage
		if json.Unmarshal(v, &props) != nil {
			m[k] = json.RawMessage(`"***"`)
			continue
		}
		for pk := range props {
			props[pk] = json.RawMessage(`"***"`)
		}
		m[k], _ = json.Marshal(props)
	}
	b, _ := json.Marshal(m)
	return b
}
