package dsar

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
	// PathRequests is the root of the DSAR routes.
	PathRequests = "/api/2/dsar/requests"
	// Budget is the cost allowed per BudgetWindow for all DSAR endpoints.
	Budget       = 14400
	BudgetWindow = time.Hour
	// CostPost and CostGet are the costs of one call.
	CostPost = 8
	CostGet  = 1
	// URLLifetime is how long the urls of a done request stay valid.
	URLLifetime = 48 * time.Hour
	// MaxRedirects bounds the redirects followed for one output.
	MaxRedirects = 3
)

// Job states named by the document (others exist, unnamed).
const (
	StatusDone   = "done"
	StatusFailed = "failed"
)

// ErrBadRequest is returned (wrapped) by Request.Validate.
var ErrBadRequest = errors.New("bad DSAR request")

// Request is the create body.
type Request struct {
	UserID    string `json:"userId,omitempty"`
	SvcID     int64  `json:"svcId,omitempty"`
	StartDate string `json:"startDate"`
	EndDate   string `json:"endDate"`
}

// Validate checks the rules of the package doc.
func (r Request) Validate() error {
	if r.UserID == "" && r.SvcID <= 0 {
		return fmt.Errorf("%w: userId or svcId is required", ErrBadRequest)
	}
	s, err1 := time.Parse(time.DateOnly, r.StartDate)
	e, err2 := time.Parse(time.DateOnly, r.EndDate)
	switch {
	case err1 != nil || err2 != nil:
		return fmt.Errorf("%w: startDate and endDate are required, as YYYY-MM-DD", ErrBadRequest)
	case e.Before(s):
		return fmt.Errorf("%w: endDate %s is before startDate %s", ErrBadRequest, r.EndDate, r.StartDate)
	}
	return nil
}

// ParseRequest decodes and validates a create body.
func ParseRequest(body []byte) (Request, error) {
	var raw struct {
		UserID    *string         `json:"userId"`
		SvcID     json.RawMessage `json:"svcId"`
		StartDate *string         `json:"startDate"`
		EndDate   *string         `json:"endDate"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return Request{}, fmt.Errorf("%w: the body is not a JSON object: %v", ErrBadRequest, err)
	}
	var r Request
	if raw.UserID != nil {
		r.UserID = *raw.UserID
	}
	if len(raw.SvcID) > 0 && string(raw.SvcID) != "null" {
		n, err := strconv.ParseInt(string(raw.SvcID), 10, 64)
		if err != nil || n <= 0 {
			return Request{}, fmt.Errorf("%w: svcId must be a positive integer", ErrBadRequest)
		}
		r.SvcID = n
	}
	if raw.StartDate != nil {
		r.StartDate = *raw.StartDate
	}
	if raw.EndDate != nil {
		r.EndDate = *raw.EndDate
	}
	return r, r.Validate()
}

// Created is the create answer.
type Created struct {
	RequestID int64 `json:"requestId"`
}

// Status is the status answer.
type Status struct {
	Status string   `json:"status"`
	URLs   []string `json:"urls"`
}

// API returns the DSAR API as forward data: base cfg.URL
// (--analytics-url), the organization's key pair as Basic, the cost budget
// (Budget per BudgetWindow, as cfg changes it; POST CostPost, GET CostGet)
// per organization, the creation checked by ParseRequest, and outputs
// whose redirects (to the files) the relay follows itself, up to
// MaxRedirects.
func API(cfg forward.APIConfig) forward.API {
	lim := cfg.Over(ratelimit.Config{Name: "dsar", Limit: Budget, Window: BudgetWindow})
	return forward.API{
		Upstream: forward.Upstream{API: "dsar", Kind: credentials.KindAnalytics, Fallback: cfg.URL,
			Flag: "--analytics-url", Scheme: forward.SchemeOrgBasic},
		Limits: []forward.Limit{{
			Config: lim,
			Cost: func(method string) int {
				if method == http.MethodPost {
					return CostPost
				}
				return CostGet
			},
			Says: fmt.Sprintf("the DSAR cost budget of %d per hour per organization", lim.Limit),
		}},
		Routes: []forward.Route{
			{Method: http.MethodPost, Path: PathRequests, BodyLimit: 1 << 20, Check: checkCreate},
			{Method: http.MethodGet, Path: PathRequests + "/{id}"},
			{Method: http.MethodGet, Path: PathRequests + "/{id}/outputs/{output}", Follow: MaxRedirects},
		},
	}
}

func checkCreate(_ *http.Request, body []byte) *forward.Problem {
	_, err := ParseRequest(body)
	return forward.BadIf(err)
}
