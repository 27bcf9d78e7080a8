package sim

import (
	"net/http"
	"strconv"
)

// serveCountOnly is /2/httpapi in CountOnly mode: count, answer 200.
func (s *Sim) serveCountOnly(w http.ResponseWriter, r *http.Request, in *incoming) {
	if in.TooLarge {
		writeJSON(w, http.StatusRequestEntityTooLarge, errBody{Code: 413, Error: ErrTextTooLarge})
		return
	}
	n := CountEvents(in.Body)
	in.Rec.Events = n
	s.counted.Add(int64(n))
	var b [128]byte
	out := append(b[:0], `{"code":200,"events_ingested":`...)
	out = strconv.AppendInt(out, int64(n), 10)
	out = append(out, `,"payload_size_bytes":`...)
	out = strconv.AppendInt(out, int64(len(in.Body)), 10)
	out = append(out, `,"server_upload_time":`...)
	out = strconv.AppendInt(out, s.cfg.Now().UnixMilli(), 10)
	out = append(out, '}')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(http.StatusOK)
	w.Write(out)
}

// Counted returns the number of events CountOnly mode counted.
func (s *Sim) Counted() int64 { return s.counted.Load() }

// CountEvents counts the elements of the top-level "events" array of a JSON
// envelope with a cheap scan (no validation; malformed input gives some
// count, never a panic).
func CountEvents(body []byte) int {
	depth := 0
	inStr := false
	keyStart := -1
	lastKey := ""
	inEvents := false
	n := 0
	sawValue := false
	for i := 0; i < len(body); i++ {
		c := body[i]
		if inStr {
			switch c {
			case '\\':
				i++
			case '"':
				inStr = false
				if depth == 1 && keyStart >= 0 {
					lastKey = string(body[keyStart:i])
				}
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
			if depth == 1 && !inEvents {
				keyStart = i + 1
			} else {
				keyStart = -1
			}
			if inEvents && depth == 2 {
				sawValue = true
			}
		case '{', '[':
			if depth == 1 && c == '[' && lastKey == "events" {
				inEvents = true
				sawValue = false
			} else if inEvents && depth == 2 {
				sawValue = true
			}
			depth++
		case '}', ']':
			depth--
			if inEvents && depth == 1 {
				if sawValue {
					n++
				}
				inEvents = false
				lastKey = ""
			}
		case ',':
			if inEvents && depth == 2 {
				n++
			} else if depth == 1 {
				lastKey = ""
			}
		case ' ', '\t', '\n', '\r', ':':
		default:
			if inEvents && depth == 2 {
				sawValue = true
			}
		}
	}
	return n
}
