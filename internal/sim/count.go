package sim

import (
	"net/http"
	"strconv"
)

// serveCountOnly is /2/httpapi in CountOnly mode: count, answer 200.
func (s *Sim) serveCountOnly(w http.ResponseWriter, r *http.Request, in *incoming) {
	if in.TooLarge {
		codeError(w, http.StatusRequestEntityTooLarge, ErrTextTooLarge)
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

// CountEvents counts the elements of the top-level "events" array of a JSON
// envelope with a cheap scan (no validation; malformed input gives some
// count, never a panic).
func CountEvents(body []byte) int {
	depth := 0
	lastKey := ""
	inEvents := false
	n := 0
	sawValue := false
	for i := 0; i < len(body); i++ {
		switch c := body[i]; c {
		case '"':
			end := stringEnd(body, i)
			if depth == 1 && !inEvents && end < len(body) {
				lastKey = string(body[i+1 : end])
			}
			if inEvents && depth == 2 {
				sawValue = true
			}
			i = end
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

// stringEnd returns the index of the quote that closes the JSON string
// opening at b[i], or len(b) when it is not closed.
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return len(b)
}
