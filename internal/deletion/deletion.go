package deletion

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/ratelimit"
)

// Documented figures.
const (
	// PathUsers is the root of the deletion routes.
	PathUsers = "/api/2/deletions/users"
	// MaxIDs is the most ids (svc_ids and user_ids together) per POST.
	MaxIDs = 100
	// PostInterval is the least time between two POSTs of a project.
	PostInterval = time.Second
	// MaxParallel is the most requests of a project in flight.
	MaxParallel = 8
	// MaxQueryMonths is the longest GET range.
	MaxQueryMonths = 6
	// QueryDays is the range the document suggests for finding the job of a
	// request: the request day plus 30 days.
	QueryDays = 30
)

// Job states.
const (
	StatusStaging   = "staging"
	StatusSubmitted = "submitted"
	StatusDone      = "done"
)

// ErrBadRequest is returned (wrapped) for a request the upstream does not take.
var ErrBadRequest = errors.New("bad deletion request")

// Request is the POST body.
type Request struct {
	SvcIDs               []int64  `json:"svc_ids,omitempty"`
	UserIDs              []string `json:"user_ids,omitempty"`
	Requester            string   `json:"requester,omitempty"`
	IgnoreInvalidID      bool     `json:"ignore_invalid_id,omitempty"`
	DeleteFromOrg        bool     `json:"delete_from_org,omitempty"`
	IncludeMappedUserIDs bool     `json:"include_mapped_user_ids,omitempty"`
}

// Validate checks the id count.
func (r Request) Validate() error { return checkCount(len(r.SvcIDs) + len(r.UserIDs)) }

func checkCount(n int) error {
	if n == 0 || n > MaxIDs {
		return fmt.Errorf("%w: send 1 to %d ids (svc_ids and user_ids together), not %d", ErrBadRequest, MaxIDs, n)
	}
	return nil
}

// CheckBody checks a POST body (see the package doc) without decoding the
// ids' own values.
func CheckBody(body []byte) error {
	var raw struct {
		SvcIDs  json.RawMessage `json:"svc_ids"`
		UserIDs json.RawMessage `json:"user_ids"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return fmt.Errorf("%w: the body is not a JSON object: %v", ErrBadRequest, err)
	}
	n := 0
	for name, v := range map[string]json.RawMessage{"svc_ids": raw.SvcIDs, "user_ids": raw.UserIDs} {
		if len(v) == 0 || string(v) == "null" {
			continue
		}
		var l []json.RawMessage
		if err := json.Unmarshal(v, &l); err != nil {
			return fmt.Errorf("%w: %s is not an array", ErrBadRequest, name)
		}
		n += len(l)
	}
	return checkCount(n)
}

// CheckDays checks a GET range: both days YYYY-MM-DD, end not before start,
// at most MaxQueryMonths apart.
func CheckDays(start, end string) error {
	s, err1 := time.Parse(time.DateOnly, start)
	e, err2 := time.Parse(time.DateOnly, end)
	switch {
	case err1 != nil || err2 != nil:
		return fmt.Errorf("%w: start_day and end_day are required, as YYYY-MM-DD", ErrBadRequest)
	case e.Before(s):
		return fmt.Errorf("%w: end_day %s is before start_day %s", ErrBadRequest, end, start)
	case e.After(s.AddDate(0, MaxQueryMonths, 0)):
		return fmt.Errorf("%w: start_day %s to end_day %s is longer than six months", ErrBadRequest, start, end)
	}
	return nil
}

// User is one entry of a job's svc_ids.
type User struct {
	SvcID          int64  `json:"svc_id"`
	Requester      string `json:"requester"`
	RequestedOnDay string `json:"requested_on_day"`
	UserID         string `json:"user_id,omitempty"`
}

// Job is a deletion job (the POST answer and the GET list's entries).
type Job struct {
	Day                 string            `json:"day"`
	Status              string            `json:"status"`
	SvcIDs              []User            `json:"svc_ids"`
	App                 json.RawMessage   `json:"app,omitempty"`
	InvalidIDs          []json.RawMessage `json:"invalid_ids,omitempty"`
	ActiveScrubDoneDate string            `json:"active_scrub_done_date,omitempty"`
}

// API returns the deletion API as forward data: base cfg.URL
// (--analytics-url), the project's key pair as Basic, the routes with
// their checks, and the limits per project: 1 POST per PostInterval,
// MaxParallel calls in flight (each as cfg changes it).
func API(cfg forward.APIConfig) forward.API {
	return forward.API{
		Upstream: forward.Upstream{API: "deletion", Kind: credentials.KindAnalytics, Fallback: cfg.URL,
			Flag: "--analytics-url", Scheme: forward.SchemeProjectBasic},
		Limits: []forward.Limit{
			{
				Config: cfg.Over(ratelimit.Config{Name: "deletion_post", Limit: 1, Window: PostInterval}),
				Cost: func(method string) int {
					if method == http.MethodPost {
						return 1
					}
					return 0
				},
				Says: "1 POST per second per project",
			},
			{
				Config: cfg.Over(ratelimit.Config{Name: "deletion", MaxInFlight: MaxParallel}),
				Says:   strconv.Itoa(MaxParallel) + " requests in parallel per project",
			},
		},
		Routes: []forward.Route{
			{Method: http.MethodPost, Path: PathUsers, BodyLimit: 4 << 20, Check: checkPost},
			{Method: http.MethodGet, Path: PathUsers, Check: checkList},
			{Method: http.MethodDelete, Path: PathUsers + "/{svc_id}/{day}", Check: checkRemove},
		},
	}
}

func checkPost(_ *http.Request, body []byte) *forward.Problem { return forward.BadIf(CheckBody(body)) }

func checkList(r *http.Request, _ []byte) *forward.Problem {
	q := r.URL.Query()
	return forward.BadIf(CheckDays(q.Get("start_day"), q.Get("end_day")))
}

func checkRemove(r *http.Request, _ []byte) *forward.Problem {
	id, err := strconv.ParseInt(r.PathValue("svc_id"), 10, 64)
	if _, derr := time.Parse(time.DateOnly, r.PathValue("day")); err != nil || id <= 0 || derr != nil {
		return forward.Bad("want %s/{svc_id}/{YYYY-MM-DD} with a positive integer svc_id", PathUsers)
	}
	return nil
}
