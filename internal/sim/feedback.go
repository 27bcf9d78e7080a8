package sim

import (
	"cmp"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// This file holds the feedback route and what the data APIs (feedback,
// DSAR, user deletion, export) share: apiRoute streams the answer straight
// to the client (export archives are gigabytes), needs HTTP Basic with an
// accepted api key as the user name (else 401) and decodes a gzip body
// (another encoding: 415); handlers read the body with a limit of their
// own. Their state lives in closures: /sim/reset does not clear it.

// Feedback limits of the document.
const (
	// FeedbackMaxItems is the most items one request may hold (at least 1).
	FeedbackMaxItems = 100
	// FeedbackMaxBytes is the largest request body ("5 MB", read as 5,000,000
	// bytes); larger is 413.
	FeedbackMaxBytes = 5_000_000
	// FeedbackMaxBody is the simulator's own longest item or part body in
	// characters (the document gives no figure; longer is a per-item error,
	// its example "a body that is too long").
	FeedbackMaxBody = 10_000
)

// FeedbackItem is a stored feedback item or conversation part (the
// document's Item fields).
type FeedbackItem struct {
	UniqueID          string         `json:"unique_id"`
	Body              string         `json:"body,omitempty"`
	Author            string         `json:"author,omitempty"`
	UserID            string         `json:"user_id,omitempty"`
	Email             string         `json:"email,omitempty"`
	CreatedAt         string         `json:"created_at,omitempty"`
	URL               string         `json:"url,omitempty"`
	ConversationParts []FeedbackItem `json:"conversation_parts,omitempty"`
	// Updates counts how many requests wrote this item (1 on first ingest).
	Updates int `json:"updates"`
}

type feedbackError struct {
	UniqueID string `json:"unique_id"`
	Error    string `json:"error"`
}

type feedbackAnswer struct {
	Ingested int             `json:"ingested"`
	Failed   int             `json:"failed"`
	Errors   []feedbackError `json:"errors"`
}

// registerFeedback registers POST /api/1/ai-feedback/ingest and the control
// route GET /sim/feedback?api_key=K&source_id=S (stored items, by unique_id).
//
// Rules: body over FeedbackMaxBytes 413; not a JSON object with a non-empty
// string source_id and an items array: 400; 0 or more than FeedbackMaxItems
// items: 400. Per item (reported in errors, the others ingested): unique_id
// required; body at most FeedbackMaxBody characters; created_at, when set,
// RFC 3339; each conversation part needs a unique_id, a body of 1 to
// FeedbackMaxBody characters and no conversation_parts of its own. A good
// item is upserted by unique_id within (api key, source): set fields replace
// stored ones, parts are upserted by their unique_id.
func (s *Sim) registerFeedback() {
	sources := map[string]map[string]*FeedbackItem{} // api key + "\x00" + source_id -> unique_id -> item
	s.apiRoute("POST /api/1/ai-feedback/ingest", func(w http.ResponseWriter, r *http.Request, key string) (int, any) {
		body, err := io.ReadAll(io.LimitReader(r.Body, FeedbackMaxBytes+1))
		if err != nil {
			return apiFail(http.StatusBadRequest, "could not read the request body")
		}
		if len(body) > FeedbackMaxBytes {
			return apiFail(http.StatusRequestEntityTooLarge, fmt.Sprintf("payload larger than %d bytes", FeedbackMaxBytes))
		}
		var req struct {
			SourceID *string           `json:"source_id"`
			Items    []json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			return apiFail(http.StatusBadRequest, "invalid JSON body: "+err.Error())
		}
		switch {
		case req.SourceID == nil || *req.SourceID == "":
			return apiFail(http.StatusBadRequest, "source_id is required")
		case len(req.Items) == 0 || len(req.Items) > FeedbackMaxItems:
			return apiFail(http.StatusBadRequest, fmt.Sprintf("items must hold 1 to %d items, not %d", FeedbackMaxItems, len(req.Items)))
		}
		ans := feedbackAnswer{Errors: []feedbackError{}}
		good := make([]FeedbackItem, 0, len(req.Items))
		for _, raw := range req.Items {
			it, err := checkFeedbackItem(raw)
			if err != nil {
				ans.Failed++
				ans.Errors = append(ans.Errors, feedbackError{UniqueID: it.UniqueID, Error: err.Error()})
				continue
			}
			good = append(good, it)
		}
		s.mu.Lock()
		src := entry(sources, key+"\x00"+*req.SourceID, func() map[string]*FeedbackItem { return map[string]*FeedbackItem{} })
		for _, it := range good { // set fields replace stored ones; parts are upserted by unique_id
			old := entry(src, it.UniqueID, func() *FeedbackItem { return &FeedbackItem{UniqueID: it.UniqueID} })
			old.Updates++
			old.Body, old.Author, old.UserID = cmp.Or(it.Body, old.Body), cmp.Or(it.Author, old.Author), cmp.Or(it.UserID, old.UserID)
			old.Email, old.CreatedAt, old.URL = cmp.Or(it.Email, old.Email), cmp.Or(it.CreatedAt, old.CreatedAt), cmp.Or(it.URL, old.URL)
			for _, p := range it.ConversationParts {
				p.Updates = 1
				if i := slices.IndexFunc(old.ConversationParts, func(o FeedbackItem) bool { return o.UniqueID == p.UniqueID }); i >= 0 {
					p.Updates += old.ConversationParts[i].Updates
					old.ConversationParts[i] = p
				} else {
					old.ConversationParts = append(old.ConversationParts, p)
				}
			}
			ans.Ingested++
		}
		s.mu.Unlock()
		return http.StatusOK, ans
	})
	s.readout("GET /sim/feedback", func(q url.Values) any {
		src := sources[q.Get("api_key")+"\x00"+q.Get("source_id")]
		return map[string]any{"items": views(sortedKeys(src), func(id string) any { return src[id] })}
	})
}

// checkFeedbackItem decodes one item and applies the per-item rules. The
// returned item carries the unique_id as far as it could be read, also on
// error.
func checkFeedbackItem(raw json.RawMessage) (FeedbackItem, error) {
	var it struct {
		FeedbackItem
		ConversationParts []json.RawMessage `json:"conversation_parts"`
	}
	if err := json.Unmarshal(raw, &it); err != nil { // a mistyped field: the others are read
		return FeedbackItem{UniqueID: it.UniqueID}, errors.New("invalid item: " + err.Error())
	}
	out := it.FeedbackItem
	out.ConversationParts = nil
	if err := checkFeedbackFields(&out); err != nil {
		return out, err
	}
	for i, praw := range it.ConversationParts {
		var p struct {
			FeedbackItem
			ConversationParts json.RawMessage `json:"conversation_parts"`
		}
		if err := json.Unmarshal(praw, &p); err != nil {
			return out, fmt.Errorf("conversation_parts[%d]: invalid part: %v", i, err)
		}
		switch {
		case len(p.ConversationParts) > 0 && string(p.ConversationParts) != "null":
			return out, fmt.Errorf("conversation_parts[%d]: conversation parts cannot be nested", i)
		case p.Body == "":
			return out, fmt.Errorf("conversation_parts[%d]: body is required", i)
		}
		if err := checkFeedbackFields(&p.FeedbackItem); err != nil {
			return out, fmt.Errorf("conversation_parts[%d]: %w", i, err)
		}
		out.ConversationParts = append(out.ConversationParts, p.FeedbackItem)
	}
	return out, nil
}

func checkFeedbackFields(it *FeedbackItem) error {
	switch {
	case it.UniqueID == "":
		return errors.New("unique_id is required")
	case utf8.RuneCountInString(it.Body) > FeedbackMaxBody:
		return fmt.Errorf("body is too long (more than %d characters)", FeedbackMaxBody)
	}
	if it.CreatedAt != "" {
		if _, err := time.Parse(time.RFC3339, it.CreatedAt); err != nil {
			return errors.New("created_at is not an ISO 8601 timestamp")
		}
	}
	return nil
}

// apiRoute registers a data API route (see the top of this file); h gets
// the Basic user name (an api key) and returns its answer (see writeAnswer).
func (s *Sim) apiRoute(pattern string, h func(w http.ResponseWriter, r *http.Request, key string) (int, any)) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		s.serve(&Exchange{W: w, R: r, Direct: true, Streams: true, h: routeHandler{serve: func(w http.ResponseWriter, r *http.Request, in *incoming) (int, any) {
			key, _, ok := r.BasicAuth()
			if ok {
				in.Rec.KeyLabel = KeyLabel(key)
			}
			if !ok || !s.validKey(key) {
				w.Header().Set("WWW-Authenticate", `Basic realm="svc"`)
				return apiFail(http.StatusUnauthorized, "invalid or missing Basic authentication")
			}
			if status, msg := decodeBody(r); status != 0 {
				return apiFail(status, msg)
			}
			return h(w, r, key)
		}}})
	})
}

// decodeBody gzip-decodes r.Body on the fly for Content-Encoding: gzip;
// another encoding than identity is 415, a bad gzip header 400.
func decodeBody(r *http.Request) (status int, msg string) {
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return http.StatusBadRequest, "undecodable gzip body"
		}
		r.Body = io.NopCloser(zr)
		r.Header.Del("Content-Encoding")
	default:
		return http.StatusUnsupportedMediaType, "unsupported Content-Encoding"
	}
	return 0, ""
}

// apiFail is the {"error": msg} answer of every API but ingestion, group
// identify and user mapping (codeError).
func apiFail(status int, msg string) (int, any) { return status, map[string]string{"error": msg} }

// SvcID is the simulator's internal user identifier (svc_id) of user userID
// of the project with api key apiKey: stable, positive, below 10^12.
func SvcID(apiKey, userID string) int64 {
	h := fnv.New64a()
	h.Write([]byte(apiKey))
	h.Write([]byte{0})
	h.Write([]byte(userID))
	return int64(h.Sum64()%1_000_000_000_000) + 1
}

// appID is the simulator's project number (the exported "app") of api key
// apiKey: stable, positive, below 10^7.
func appID(apiKey string) int64 {
	h := fnv.New64a()
	h.Write([]byte(apiKey))
	return int64(h.Sum64()%10_000_000) + 1
}
