// The user deletion API (docs/upstream-api.md, "User deletion"): base
// --analytics-url, the project's key pair as Basic. Limits per project: 1
// POST per DeletionPostInterval and deletionMaxParallel calls in flight.

package forward

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/ratelimit"
)

// Documented figures of the user deletion API.
const (
	// DeletionPath is the root of the deletion routes.
	DeletionPath = "/api/2/deletions/users"
	// DeletionMaxIDs is the most ids (svc_ids and user_ids together) per POST.
	DeletionMaxIDs = 100
	// DeletionPostInterval is the least time between two POSTs of a project.
	DeletionPostInterval = time.Second
	// deletionMaxParallel is the most requests of a project in flight.
	deletionMaxParallel = 8
	// DeletionMaxQueryMonths is the longest GET range.
	DeletionMaxQueryMonths = 6
	// DeletionQueryDays is the range the document suggests for finding the
	// job of a request: the request day plus 30 days.
	DeletionQueryDays = 30
)

// ErrBadDeletion is returned (wrapped) for a deletion request the upstream
// does not take.
var ErrBadDeletion = errors.New("bad deletion request")

// DeletionRequest is the POST body.
type DeletionRequest struct {
	SvcIDs               []int64  `json:"svc_ids,omitempty"`
	UserIDs              []string `json:"user_ids,omitempty"`
	Requester            string   `json:"requester,omitempty"`
	IgnoreInvalidID      bool     `json:"ignore_invalid_id,omitempty"`
	DeleteFromOrg        bool     `json:"delete_from_org,omitempty"`
	IncludeMappedUserIDs bool     `json:"include_mapped_user_ids,omitempty"`
}

// CheckDeletion checks a POST body (see the rules above) without decoding
// the ids' own values.
func CheckDeletion(body []byte) error {
	var raw struct {
		SvcIDs  json.RawMessage `json:"svc_ids"`
		UserIDs json.RawMessage `json:"user_ids"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return fmt.Errorf("%w: the body is not a JSON object: %v", ErrBadDeletion, err)
	}
	n := 0
	for name, v := range map[string]json.RawMessage{"svc_ids": raw.SvcIDs, "user_ids": raw.UserIDs} {
		if len(v) == 0 || string(v) == "null" {
			continue
		}
		var l []json.RawMessage
		if err := json.Unmarshal(v, &l); err != nil {
			return fmt.Errorf("%w: %s is not an array", ErrBadDeletion, name)
		}
		n += len(l)
	}
	if n == 0 || n > DeletionMaxIDs {
		return fmt.Errorf("%w: send 1 to %d ids (svc_ids and user_ids together), not %d", ErrBadDeletion, DeletionMaxIDs, n)
	}
	return nil
}

// CheckDeletionDays checks a GET range: both days YYYY-MM-DD, end not
// before start, at most DeletionMaxQueryMonths apart.
func CheckDeletionDays(start, end string) error {
	s, err1 := time.Parse(time.DateOnly, start)
	e, err2 := time.Parse(time.DateOnly, end)
	switch {
	case err1 != nil || err2 != nil:
		return fmt.Errorf("%w: start_day and end_day are required, as YYYY-MM-DD", ErrBadDeletion)
	case e.Before(s):
		return fmt.Errorf("%w: end_day %s is before start_day %s", ErrBadDeletion, end, start)
	case e.After(s.AddDate(0, DeletionMaxQueryMonths, 0)):
		return fmt.Errorf("%w: start_day %s to end_day %s is longer than six months", ErrBadDeletion, start, end)
	}
	return nil
}

// DeletionUser is one entry of a job's svc_ids.
type DeletionUser struct {
	SvcID          int64  `json:"svc_id"`
	Requester      string `json:"requester"`
	RequestedOnDay string `json:"requested_on_day"`
	UserID         string `json:"user_id,omitempty"`
}

// DeletionJob is a deletion job (the POST answer and the GET list's
// entries).
type DeletionJob struct {
	Day                 string            `json:"day"`
	Status              string            `json:"status"`
	SvcIDs              []DeletionUser    `json:"svc_ids"`
	App                 json.RawMessage   `json:"app,omitempty"`
	InvalidIDs          []json.RawMessage `json:"invalid_ids,omitempty"`
	ActiveScrubDoneDate string            `json:"active_scrub_done_date,omitempty"`
}

// Deletion returns the user deletion API described above; cfg changes its
// base and limits.
func Deletion(cfg APIConfig) API {
	return API{
		Upstream: Upstream{API: "deletion", Kind: credentials.KindAnalytics, Fallback: cfg.URL,
			Scheme: SchemeProjectBasic},
		Limits: []Limit{
			{
				Config: cfg.Over(ratelimit.Config{Name: "deletion_post", Limit: 1, Window: DeletionPostInterval}),
				Cost:   costOf(http.MethodPost, 1, 0),
				Says:   "1 POST per second per project",
			},
			{
				Config: cfg.Over(ratelimit.Config{Name: "deletion", MaxInFlight: deletionMaxParallel}),
				Says:   strconv.Itoa(deletionMaxParallel) + " requests in parallel per project",
			},
		},
		Routes: []adminroute.Route{
			{Method: http.MethodPost, Path: DeletionPath, Handler: Endpoint{BodyLimit: 4 << 20, Check: deletionPost}},
			{Method: http.MethodGet, Path: DeletionPath, Handler: Endpoint{Check: deletionList}},
			{Method: http.MethodDelete, Path: DeletionPath + "/{svc_id}/{day}", Handler: Endpoint{Check: deletionRemove}},
		},
	}
}

func deletionPost(_ *http.Request, body []byte) *Problem { return BadIf(CheckDeletion(body)) }

func deletionList(r *http.Request, _ []byte) *Problem {
	q := r.URL.Query()
	return BadIf(CheckDeletionDays(q.Get("start_day"), q.Get("end_day")))
}

func deletionRemove(r *http.Request, _ []byte) *Problem {
	id, err := strconv.ParseInt(r.PathValue("svc_id"), 10, 64)
	if _, derr := time.Parse(time.DateOnly, r.PathValue("day")); err != nil || id <= 0 || derr != nil {
		return Bad("want %s/{svc_id}/{YYYY-MM-DD} with a positive integer svc_id", DeletionPath)
	}
	return nil
}
