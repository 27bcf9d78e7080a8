package forms

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/storage"
)

// Shape is what the requests of a spooling form route (POST /groupidentify,
// POST /usermap) look like: the field holding the items and their limits.
type Shape struct {
	// Field is the form field holding one JSON object or an array of them.
	Field string
	// Noun and TooMany word the refusal of more than MaxItems items: their
	// name ("mappings") and the reason label.
	Noun, TooMany string
	MaxItems      int
	// MaxBodyBytes: a request reaching it is 413, and so is an item whose
	// upstream form body alone would.
	MaxBodyBytes int
	// QueryFirst: the query's fields win over the body's and the query
	// counts toward MaxBodyBytes; else the body's win and only it counts.
	QueryFirst bool
}

// Each checks v, the value of s.Field, item by item with one, which is
// given the item's JSON compacted, as it is sent. A refusal of one whose Msg starts
// with "." or ":" is about the item: "Field[i]" is put before it. An item
// too large for one upstream request of apiKey (escaped, as sent) is 413.
func Each[T any](s Shape, apiKey string, v []byte, one func(i int, data []byte) (T, *ValidationError)) ([]T, *ValidationError) {
	raws, verr := Items(s.Field, v, s.MaxItems, s.TooMany, s.Noun)
	if verr != nil {
		return nil, verr
	}
	frame := (&delivery.Form{Field: s.Field, MaxBodyBytes: s.MaxBodyBytes}).Frame(storage.LaneKey{APIKey: apiKey})
	out := make([]T, 0, len(raws))
	var esc []byte // one item escaped, reused
	for i, raw := range raws {
		var buf bytes.Buffer
		if json.Compact(&buf, raw) != nil {
			return nil, Bad("invalid_json", "%s[%d]: invalid JSON", s.Field, i)
		}
		item, err := one(i, buf.Bytes())
		if err != nil {
			if err.Msg != "" && (err.Msg[0] == '.' || err.Msg[0] == ':') {
				err.Msg = fmt.Sprintf("%s[%d]%s", s.Field, i, err.Msg)
			}
			return nil, err
		}
		if esc, _ = frame.Record(esc, buf.Bytes()); frame.TooLarge(esc) {
			return nil, &ValidationError{Status: http.StatusRequestEntityTooLarge, Reason: "too_large",
				Msg: fmt.Sprintf("%s[%d]: too large for one upstream request (1 MB)", s.Field, i)}
		}
		out = append(out, item)
	}
	return out, nil
}

// Item is a valid item of a spooling form route.
type Item interface{ Record() storage.Record }

// Serve answers a request of a route of shape s: 413 when it reaches
// s.MaxBodyBytes; else, once the api_key is resolved (Intake.APIKey), parse
// checks the value of s.Field and its items' records are appended
// (Intake.Accept).
func Serve[T Item](in *Intake, w http.ResponseWriter, r *http.Request, s Shape, parse func(apiKey string, v []byte) ([]T, *ValidationError)) {
	f, err := ReadForm(r)
	n, vss := len(f.Body), []url.Values{f.Post, f.Query}
	if s.QueryFirst {
		n, vss = n+len(r.URL.RawQuery), []url.Values{f.Query, f.Post}
	}
	if err != nil || n >= s.MaxBodyBytes {
		in.Reject(w, &ValidationError{Status: http.StatusRequestEntityTooLarge, Reason: "too_large",
			Msg: fmt.Sprintf("Payload too large: %d bytes; the limit is under %d bytes (1 MB)", n, s.MaxBodyBytes)})
		return
	}
	apiKey, ok := in.APIKey(w, r, First("api_key", vss...))
	if !ok {
		return
	}
	items, verr := parse(apiKey, []byte(First(s.Field, vss...)))
	if verr != nil {
		in.Reject(w, verr)
		return
	}
	var b storage.Batch
	for _, it := range items {
		b.Add(it.Record())
	}
	in.Accept(w, apiKey, &b, len(items))
}
