package feedback

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
)

// Documented figures.
const (
	// Path is the ingest endpoint, on the admin listener and upstream.
	Path = "/api/1/ai-feedback/ingest"
	// MaxItems is the most items per request (at least 1).
	MaxItems = 100
	// MaxBytes is the largest request body.
	MaxBytes = 5_000_000
)

// Errors of CheckRequest and CheckItem.
var (
	// ErrBadRequest is returned (wrapped) for a request the upstream does
	// not take as a whole.
	ErrBadRequest = errors.New("bad feedback request")
	// ErrTooLarge is returned for a body over MaxBytes.
	ErrTooLarge = errors.New("feedback request body too large")
	// ErrBadItem is returned (wrapped) for an item breaking the rules.
	ErrBadItem = errors.New("bad feedback item")
)

// ItemError is one entry of the answer's errors.
type ItemError struct {
	UniqueID string `json:"unique_id"`
	Error    string `json:"error"`
}

// Answer is the ingest answer.
type Answer struct {
	Ingested int         `json:"ingested"`
	Failed   int         `json:"failed"`
	Errors   []ItemError `json:"errors"`
}

// RequestError lists the bad items of a request.
type RequestError struct {
	Items []ItemError
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("%d of the items break the feedback rules (first: %s: %s)", len(e.Items), e.Items[0].UniqueID, e.Items[0].Error)
}

// Unwrap makes errors.Is(err, ErrBadItem) hold.
func (e *RequestError) Unwrap() error { return ErrBadItem }

// CheckItem checks one item (a JSON object) by the package doc's rules and
// returns its unique_id as far as it could be read.
func CheckItem(raw json.RawMessage) (uniqueID string, err error) {
	var it struct {
		UniqueID          any             `json:"unique_id"`
		ConversationParts json.RawMessage `json:"conversation_parts"`
	}
	if err := json.Unmarshal(raw, &it); err != nil {
		return "", fmt.Errorf("%w: not a JSON object", ErrBadItem)
	}
	uniqueID, _ = it.UniqueID.(string)
	if len(it.ConversationParts) == 0 || string(it.ConversationParts) == "null" {
		return uniqueID, nil
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(it.ConversationParts, &parts); err != nil {
		return uniqueID, fmt.Errorf("%w: conversation_parts is not an array", ErrBadItem)
	}
	for i, p := range parts {
		var part struct {
			Body              any             `json:"body"`
			ConversationParts json.RawMessage `json:"conversation_parts"`
		}
		if err := json.Unmarshal(p, &part); err != nil {
			return uniqueID, fmt.Errorf("%w: conversation_parts[%d] is not a JSON object", ErrBadItem, i)
		}
		if s, ok := part.Body.(string); !ok || s == "" {
			return uniqueID, fmt.Errorf("%w: conversation_parts[%d]: body is required (a string of at least 1 character)", ErrBadItem, i)
		}
		if len(part.ConversationParts) > 0 && string(part.ConversationParts) != "null" {
			return uniqueID, fmt.Errorf("%w: conversation_parts[%d]: conversation parts cannot be nested", ErrBadItem, i)
		}
	}
	return uniqueID, nil
}

// CheckRequest checks a whole request body: ErrTooLarge, ErrBadRequest
// (wrapped), or a *RequestError naming every bad item.
func CheckRequest(body []byte) error {
	if len(body) > MaxBytes {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, len(body), MaxBytes)
	}
	var req struct {
		SourceID any             `json:"source_id"`
		Items    json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return fmt.Errorf("%w: the body is not a JSON object: %v", ErrBadRequest, err)
	}
	if s, ok := req.SourceID.(string); !ok || s == "" {
		return fmt.Errorf("%w: source_id is required (a string)", ErrBadRequest)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(req.Items, &items); err != nil || string(bytes.TrimSpace(req.Items)) == "null" {
		return fmt.Errorf("%w: items is required (an array)", ErrBadRequest)
	}
	if len(items) == 0 || len(items) > MaxItems {
		return fmt.Errorf("%w: items must hold 1 to %d items, not %d", ErrBadRequest, MaxItems, len(items))
	}
	var bad []ItemError
	for _, it := range items {
		if id, err := CheckItem(it); err != nil {
			bad = append(bad, ItemError{UniqueID: id, Error: err.Error()})
		}
	}
	if bad != nil {
		return &RequestError{Items: bad}
	}
	return nil
}

// Chunk groups items (each a JSON object, already checked) into request
// bodies {"source_id": sourceID, "items": [...]} of at most MaxItems items
// and at most maxBytes bytes (0 means MaxBytes). An item too large for a
// request of its own is returned in tooLarge (by index) instead.
func Chunk(sourceID string, items []json.RawMessage, maxBytes int) (bodies [][]byte, members [][]int, tooLarge []int) {
	if maxBytes <= 0 {
		maxBytes = MaxBytes
	}
	src, _ := json.Marshal(sourceID)
	head := append(append([]byte(`{"source_id":`), src...), `,"items":[`...)
	var cur []byte
	var idx []int
	flush := func() {
		if idx != nil {
			bodies = append(bodies, append(cur, "]}"...))
			members = append(members, idx)
		}
		cur, idx = nil, nil
	}
	for i, it := range items {
		if len(head)+len(it)+2 > maxBytes {
			tooLarge = append(tooLarge, i)
			continue
		}
		if idx != nil && (len(idx) == MaxItems || len(cur)+1+len(it)+2 > maxBytes) {
			flush()
		}
		if idx == nil {
			cur = append([]byte(nil), head...)
		} else {
			cur = append(cur, ',')
		}
		cur = append(cur, it...)
		idx = append(idx, i)
	}
	flush()
	return bodies, members, tooLarge
}

// API is the feedback ingestion API as forward data: base --feedback-url
// (url), the project's key pair as Basic, and POST Path checked by
// CheckRequest (a request breaking the rules is answered locally, with the
// per-item errors, and nothing is sent).
func API(url string) forward.API {
	return forward.API{
		Upstream: forward.Upstream{API: "feedback", Kind: credentials.KindFeedback,
			Fallback: url, Flag: "--feedback-url", Scheme: forward.SchemeProjectBasic},
		Routes: []forward.Route{{Method: http.MethodPost, Path: Path, BodyLimit: MaxBytes, Check: check}},
	}
}

func check(_ *http.Request, body []byte) *forward.Problem {
	err := CheckRequest(body)
	var re *RequestError
	switch {
	case errors.Is(err, ErrTooLarge):
		return &forward.Problem{Status: http.StatusRequestEntityTooLarge, Msg: err.Error()}
	case errors.As(err, &re):
		return &forward.Problem{Status: http.StatusBadRequest, Msg: err.Error() + "; nothing was sent",
			Extra: Answer{Failed: len(re.Items), Errors: re.Items}}
	}
	return forward.BadIf(err)
}
