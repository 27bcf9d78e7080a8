// The feedback ingestion API (docs/upstream-api.md, "Feedback"): base
// --feedback-url, the project's key pair as Basic. The body is checked
// decoded (DecodedBody) and forwarded as sent. A request with a bad item is
// answered 400 as a whole, nothing sent, with the bad items in the
// upstream's answer shape (the relay does not rewrite bodies: the caller
// resends the good ones; `relay feedback` leaves bad items out itself).
// What the document does not state is left to the upstream.

package forward

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/credentials"
)

// Documented figures of the feedback API.
const (
	// FeedbackPath is the ingest endpoint, on the admin listener and upstream.
	FeedbackPath = "/api/1/ai-feedback/ingest"
	// FeedbackMaxItems is the most items per request (at least 1).
	FeedbackMaxItems = 100
	// FeedbackMaxBytes is the largest request body.
	FeedbackMaxBytes = 5_000_000
)

// Errors of CheckFeedback and CheckFeedbackItem.
var (
	// ErrBadFeedback is returned (wrapped) for a request the upstream does
	// not take as a whole.
	ErrBadFeedback = errors.New("bad feedback request")
	// ErrBadFeedbackItem is returned (wrapped) for an item breaking the rules.
	ErrBadFeedbackItem = errors.New("bad feedback item")
)

// FeedbackItemError is one entry of the answer's errors.
type FeedbackItemError struct {
	UniqueID string `json:"unique_id"`
	Error    string `json:"error"`
}

// FeedbackAnswer is the ingest answer.
type FeedbackAnswer struct {
	Ingested int                 `json:"ingested"`
	Failed   int                 `json:"failed"`
	Errors   []FeedbackItemError `json:"errors"`
}

// FeedbackError lists the bad items of a request.
type FeedbackError struct {
	Items []FeedbackItemError
}

func (e *FeedbackError) Error() string {
	return fmt.Sprintf("%d of the items break the feedback rules (first: %s: %s)", len(e.Items), e.Items[0].UniqueID, e.Items[0].Error)
}

// Unwrap makes errors.Is(err, ErrBadFeedbackItem) hold.
func (e *FeedbackError) Unwrap() error { return ErrBadFeedbackItem }

// CheckFeedbackItem checks one item (a JSON object) by the rules above and
// returns its unique_id as far as it could be read.
func CheckFeedbackItem(raw json.RawMessage) (uniqueID string, err error) {
	var it struct {
		UniqueID          any             `json:"unique_id"`
		ConversationParts json.RawMessage `json:"conversation_parts"`
	}
	if err := json.Unmarshal(raw, &it); err != nil {
		return "", fmt.Errorf("%w: not a JSON object", ErrBadFeedbackItem)
	}
	uniqueID, _ = it.UniqueID.(string)
	if len(it.ConversationParts) == 0 || string(it.ConversationParts) == "null" {
		return uniqueID, nil
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(it.ConversationParts, &parts); err != nil {
		return uniqueID, fmt.Errorf("%w: conversation_parts is not an array", ErrBadFeedbackItem)
	}
	for i, p := range parts {
		var part struct {
			Body              any             `json:"body"`
			ConversationParts json.RawMessage `json:"conversation_parts"`
		}
		if err := json.Unmarshal(p, &part); err != nil {
			return uniqueID, fmt.Errorf("%w: conversation_parts[%d] is not a JSON object", ErrBadFeedbackItem, i)
		}
		if s, ok := part.Body.(string); !ok || s == "" {
			return uniqueID, fmt.Errorf("%w: conversation_parts[%d]: body is required (a string of at least 1 character)", ErrBadFeedbackItem, i)
		}
		if len(part.ConversationParts) > 0 && string(part.ConversationParts) != "null" {
			return uniqueID, fmt.Errorf("%w: conversation_parts[%d]: conversation parts cannot be nested", ErrBadFeedbackItem, i)
		}
	}
	return uniqueID, nil
}

// CheckFeedback checks a whole request body (of at most FeedbackMaxBytes:
// the route's body limit): ErrBadFeedback (wrapped), or a *FeedbackError
// naming every bad item.
func CheckFeedback(body []byte) error {
	var req struct {
		SourceID any             `json:"source_id"`
		Items    json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return fmt.Errorf("%w: the body is not a JSON object: %v", ErrBadFeedback, err)
	}
	if s, ok := req.SourceID.(string); !ok || s == "" {
		return fmt.Errorf("%w: source_id is required (a string)", ErrBadFeedback)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(req.Items, &items); err != nil || string(bytes.TrimSpace(req.Items)) == "null" {
		return fmt.Errorf("%w: items is required (an array)", ErrBadFeedback)
	}
	if len(items) == 0 || len(items) > FeedbackMaxItems {
		return fmt.Errorf("%w: items must hold 1 to %d items, not %d", ErrBadFeedback, FeedbackMaxItems, len(items))
	}
	var bad []FeedbackItemError
	for _, it := range items {
		if id, err := CheckFeedbackItem(it); err != nil {
			bad = append(bad, FeedbackItemError{UniqueID: id, Error: err.Error()})
		}
	}
	if bad != nil {
		return &FeedbackError{Items: bad}
	}
	return nil
}

// ChunkFeedback groups items (each a JSON object, already checked) into
// request bodies {"source_id": sourceID, "items": [...]} of at most
// FeedbackMaxItems items and at most maxBytes bytes (0 means
// FeedbackMaxBytes). An item too large for a request of its own is returned
// in tooLarge (by index) instead.
func ChunkFeedback(sourceID string, items []json.RawMessage, maxBytes int) (bodies [][]byte, members [][]int, tooLarge []int) {
	if maxBytes <= 0 {
		maxBytes = FeedbackMaxBytes
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
		if idx != nil && (len(idx) == FeedbackMaxItems || len(cur)+1+len(it)+2 > maxBytes) {
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

// Feedback returns the feedback ingestion API described above.
func Feedback(c APIConfig) API {
	return API{
		Upstream: Upstream{API: "feedback", Kind: credentials.KindFeedback,
			Fallback: c.URL, Scheme: SchemeProjectBasic},
		Routes: []adminroute.Route{{Method: http.MethodPost, Path: FeedbackPath,
			Handler: Endpoint{BodyLimit: FeedbackMaxBytes, Check: feedbackCheck}}},
	}
}

func feedbackCheck(_ *http.Request, body []byte) *Problem {
	err := CheckFeedback(body)
	if fe := (*FeedbackError)(nil); errors.As(err, &fe) {
		return &Problem{Status: http.StatusBadRequest, Msg: err.Error() + "; nothing was sent",
			Extra: FeedbackAnswer{Failed: len(fe.Items), Errors: fe.Items}}
	}
	return BadIf(err)
}
