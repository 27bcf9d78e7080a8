package event

import (
	"maps"
	"slices"
	"strconv"
	"unicode/utf8"
)

// The upstream's error messages (the "error" body field) that Parse returns,
// from the ingestion document's Errors section.
const (
	msgMissingBody   = "Missing request body"
	msgInvalidJSON   = "Invalid JSON request body"
	msgMissingField  = "Request missing required field"
	msgInvalidEvent  = "Invalid event JSON"
	msgInvalidAPIKey = "Invalid API key"
	msgInvalidFields = "Invalid field values on some events"
)

// Error is a rejection in the upstream's own form: the HTTP status and the
// JSON body fields of the ingestion document's Errors section.
//
// Parse fills the per-event maps like this:
//   - events_with_missing_fields: "event_type" when it is absent, null or "";
//     "user_id" and "device_id" (both, same index) when the event has neither
//     id (absent, null or "").
//   - events_with_invalid_fields: a field whose value has the wrong type for
//     the Event table (a null counts as absent, not as invalid), a time that is
//     not integer milliseconds, an integer outside int64, an event_properties
//     or user_properties object nested deeper than 40 layers, an all-zero
//     device_id, and the id(s) that min_id_length removed when the event is
//     left with neither id.
//
// Msg is "Invalid field values on some events" when InvalidFields is set,
// even when MissingFields is set too (the document lists it for invalid
// values and for bad time values), and "Request missing required field" when
// only MissingFields is set (the message the document gives for missing
// fields).
type Error struct {
	Status int    // HTTP status, also the body's "code"
	Msg    string // the body's "error", e.g. "Invalid field values on some events"
	// MissingField names the missing request-level field ("api_key", "events").
	MissingField string
	// InvalidFields and MissingFields map a field name to the index of the
	// first event with that error (a one-element slice, as the upstream sends).
	InvalidFields map[string][]int
	MissingFields map[string][]int
}

func (e *Error) Error() string { return e.Msg }

func newError(msg string) *Error { return &Error{Status: 400, Msg: msg} }

func newMissingField(field string) *Error {
	return &Error{Status: 400, Msg: msgMissingField, MissingField: field}
}

// AppendJSON appends the upstream's JSON body for e to dst. Keys come in a
// fixed order: code, error, missing_field, events_with_invalid_fields,
// events_with_missing_fields (empty ones left out), map keys sorted.
func (e *Error) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"code":`...)
	dst = strconv.AppendInt(dst, int64(e.Status), 10)
	dst = append(dst, `,"error":`...)
	dst = appendJSONString(dst, []byte(e.Msg))
	if e.MissingField != "" {
		dst = append(dst, `,"missing_field":`...)
		dst = appendJSONString(dst, []byte(e.MissingField))
	}
	if len(e.InvalidFields) > 0 {
		dst = append(dst, `,"events_with_invalid_fields":`...)
		dst = appendIndexMap(dst, e.InvalidFields)
	}
	if len(e.MissingFields) > 0 {
		dst = append(dst, `,"events_with_missing_fields":`...)
		dst = appendIndexMap(dst, e.MissingFields)
	}
	return append(dst, '}')
}

func appendIndexMap(dst []byte, m map[string][]int) []byte {
	dst = append(dst, '{')
	for n, k := range slices.Sorted(maps.Keys(m)) {
		if n > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, []byte(k))
		dst = AppendIndexes(append(dst, ':'), m[k])
	}
	return append(dst, '}')
}

// AppendIndexes appends the event indexes idx as a JSON array.
func AppendIndexes(dst []byte, idx []int) []byte {
	dst = append(dst, '[')
	for j, i := range idx {
		if j > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, int64(i), 10)
	}
	return append(dst, ']')
}

// appendJSONString appends s as a JSON string, escaping '"', '\\' and control
// bytes, and replacing invalid UTF-8 by U+FFFD.
func appendJSONString(dst, s []byte) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		// Copy a run of bytes that stay as they are (all of an IP
		// address) in one append.
		j := i
		for j < len(s) && s[j] >= 0x20 && s[j] < utf8.RuneSelf && s[j] != '"' && s[j] != '\\' {
			j++
		}
		dst = append(dst, s[i:j]...)
		if i = j; i == len(s) {
			break
		}
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, "\ufffd"...)
			} else {
				dst = append(dst, s[i:i+size]...)
			}
			i += size
			continue
		}
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, `\u00`...)
			dst = append(dst, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&15])
		default:
			dst = append(dst, c)
		}
		i++
	}
	return append(dst, '"')
}
