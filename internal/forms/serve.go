package forms

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/storage"
)

// Shape is the requests of a spooling form route: the field holding the
// items, the words and reason of the refusal of more than MaxItems, the
// size a request (or one item's upstream form body) must stay under,
// whether the query's fields win over the body's and count in its size,
// and the fields an item may have.
type Shape struct {
	Field, Noun, TooMany   string
	MaxItems, MaxBodyBytes int
	QueryFirst             bool
	ItemFields             []string
}

// Each checks v, the value of s.Field: one JSON object or a JSON array of
// 1 to s.MaxItems, else a 400 naming the field: missing_field (missing,
// empty, an empty array), invalid_json, or s.TooMany. Then item by item:
// an object of s.ItemFields, given to one with its null members left out
// and its JSON compacted as it is sent. A refusal starting with "." or ":"
// gets "Field[i]" before it. An item too large for one upstream request of
// apiKey is 413.
func Each[T any](s Shape, apiKey string, v []byte, one func(i int, obj map[string]json.RawMessage, data []byte) (T, *ValidationError)) ([]T, *ValidationError) {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return nil, Bad("missing_field", "%s: missing or empty", s.Field)
	}
	var raws []json.RawMessage
	switch v[0] {
	case '[':
		if err := json.Unmarshal(v, &raws); err != nil {
			return nil, Bad("invalid_json", "%s: invalid JSON array of objects: %s", s.Field, jsonErr(err))
		}
	case '{':
		if !json.Valid(v) {
			return nil, Bad("invalid_json", "%s: invalid JSON object", s.Field)
		}
		raws = []json.RawMessage{v}
	default:
		return nil, Bad("invalid_json", "%s: must be a JSON array of objects (or one object)", s.Field)
	}
	if len(raws) == 0 {
		return nil, Bad("missing_field", "%s: empty array", s.Field)
	}
	if len(raws) > s.MaxItems {
		return nil, Bad(s.TooMany, "%s: %d %s; at most %d per request", s.Field, len(raws), s.Noun, s.MaxItems)
	}
	frame := (&delivery.Form{Field: s.Field, MaxBodyBytes: s.MaxBodyBytes}).Frame(storage.LaneKey{APIKey: apiKey})
	out := make([]T, 0, len(raws))
	var esc []byte // one item escaped, reused
	for i, raw := range raws {
		var buf bytes.Buffer
		json.Compact(&buf, raw) // valid: read above
		obj, err := object(s.ItemFields, buf.Bytes())
		var item T
		if err == nil {
			item, err = one(i, obj, buf.Bytes())
		}
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

// object reads an item: an object of fields only, its null members left
// out (absent).
func object(fields []string, data []byte) (map[string]json.RawMessage, *ValidationError) {
	var obj map[string]json.RawMessage
	if data[0] != '{' || json.Unmarshal(data, &obj) != nil {
		return nil, Bad("invalid_type", ": must be an object")
	}
	for k, v := range obj {
		if !slices.Contains(fields, k) {
			return nil, Bad("unknown_field", ".%s: unknown field (allowed: %s)", k, strings.Join(fields, ", "))
		}
		if string(v) == "null" {
			delete(obj, k)
		}
	}
	return obj, nil
}

// String is the string member k of an item's obj ("" when absent).
func String(obj map[string]json.RawMessage, k string) (s string, err *ValidationError) {
	if v, ok := obj[k]; ok && json.Unmarshal(v, &s) != nil {
		return "", Bad("invalid_type", ".%s: must be a string", k)
	}
	return s, nil
}

// Item is a valid item of a spooling form route.
type Item interface{ Record() storage.Record }

// Handler answers the requests of shape s: a request's body (bounded by
// the admin listener) and, for an application/x-www-form-urlencoded body, its fields
// (malformed ones skipped) and the query's are read; parse checks the
// value of s.Field (given s), and the items' records are appended to the
// lane of the api_key: 200 {"code":200,"<Field>":<n>} once the store holds
// them, else 503 (SpoolFailed).
func Handler[T Item](in *Intake, s Shape, parse func(s Shape, apiKey string, v []byte) ([]T, *ValidationError)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		post := url.Values{}
		if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct == "application/x-www-form-urlencoded" {
			post, _ = url.ParseQuery(string(body))
		}
		n, vss := len(body), []url.Values{post, r.URL.Query()}
		if s.QueryFirst {
			n, vss = n+len(r.URL.RawQuery), []url.Values{vss[1], post}
		}
		if err != nil || n >= s.MaxBodyBytes {
			in.Reject(w, &ValidationError{Status: http.StatusRequestEntityTooLarge, Reason: "too_large",
				Msg: fmt.Sprintf("Payload too large: %d bytes; the limit is under %d bytes (1 MB)", n, s.MaxBodyBytes)})
			return
		}
		// The first value of a field in the first of vss that has it.
		first := func(name string) string {
			for _, vs := range vss {
				if v := vs[name]; len(v) > 0 {
					return v[0]
				}
			}
			return ""
		}
		apiKey, verr := APIKey(in.creds.Load(), r.Header.Get("X-Relay-Project"), first("api_key"))
		if verr != nil {
			in.Reject(w, verr)
			return
		}
		items, verr := parse(s, apiKey, []byte(first(s.Field)))
		if verr != nil {
			in.Reject(w, verr)
			return
		}
		var b storage.Batch
		for _, it := range items {
			b.Add(it.Record())
		}
		// No request id: the fleet makes a fresh one (the local spool has no
		// retries to absorb).
		if err := in.st.Append(context.Background(), storage.Request{Kind: in.cfg.Kind, APIKey: []byte(apiKey), Batch: &b}); err != nil {
			in.SpoolFailed(w, err)
			return
		}
		in.accepted.Add(float64(len(items)))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"code":200,%q:%d}`, in.cfg.Field, len(items))
	})
}
