// The data subject access request API (docs/upstream-api.md, "Data
// subject access requests"): base --analytics-url, the organization's key
// pair as Basic, one cost budget per organization (POST 8, GET 1).
//
// An output answered with a redirect is followed by the relay (at most
// dsarMaxRedirects, http.Client's rules: credentials only to the same
// host), as the document asks of a client that does not follow it itself;
// the final answer is streamed. The "urls" of a status answer name the
// upstream host: a caller going through the relay requests their path on
// the relay instead.

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

// Documented figures of the DSAR API.
const (
	// DSARPath is the root of the DSAR routes.
	DSARPath = "/api/2/dsar/requests"
	// dsarBudget is the cost allowed per dsarBudgetWindow for all DSAR
	// endpoints.
	dsarBudget       = 14400
	dsarBudgetWindow = time.Hour
	// dsarCostPost and dsarCostGet are the costs of one call.
	dsarCostPost = 8
	dsarCostGet  = 1
	// DSARURLLifetime is how long the urls of a done request stay valid.
	DSARURLLifetime = 48 * time.Hour
	// dsarMaxRedirects bounds the redirects followed for one output.
	dsarMaxRedirects = 3
)

// DSAR job states named by the document (others exist, unnamed).
const (
	DSARDone   = "done"
	DSARFailed = "failed"
)

// ErrBadDSAR is returned (wrapped) by DSARRequest.Validate.
var ErrBadDSAR = errors.New("bad DSAR request")

// DSARRequest is the create body.
type DSARRequest struct {
	UserID    string `json:"userId,omitempty"`
	SvcID     int64  `json:"svcId,omitempty"`
	StartDate string `json:"startDate"`
	EndDate   string `json:"endDate"`
}

// Validate checks the rules above.
func (r DSARRequest) Validate() error {
	if r.UserID == "" && r.SvcID <= 0 {
		return fmt.Errorf("%w: userId or svcId is required", ErrBadDSAR)
	}
	s, err1 := time.Parse(time.DateOnly, r.StartDate)
	e, err2 := time.Parse(time.DateOnly, r.EndDate)
	switch {
	case err1 != nil || err2 != nil:
		return fmt.Errorf("%w: startDate and endDate are required, as YYYY-MM-DD", ErrBadDSAR)
	case e.Before(s):
		return fmt.Errorf("%w: endDate %s is before startDate %s", ErrBadDSAR, r.EndDate, r.StartDate)
	}
	return nil
}

// ParseDSAR decodes and validates a create body.
func ParseDSAR(body []byte) (DSARRequest, error) {
	var raw struct {
		UserID    string          `json:"userId"`
		SvcID     json.RawMessage `json:"svcId"`
		StartDate string          `json:"startDate"`
		EndDate   string          `json:"endDate"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return DSARRequest{}, fmt.Errorf("%w: the body is not a JSON object: %v", ErrBadDSAR, err)
	}
	r := DSARRequest{UserID: raw.UserID, StartDate: raw.StartDate, EndDate: raw.EndDate}
	if len(raw.SvcID) > 0 && string(raw.SvcID) != "null" {
		n, err := strconv.ParseInt(string(raw.SvcID), 10, 64)
		if err != nil || n <= 0 {
			return DSARRequest{}, fmt.Errorf("%w: svcId must be a positive integer", ErrBadDSAR)
		}
		r.SvcID = n
	}
	return r, r.Validate()
}

// DSARCreated is the create answer.
type DSARCreated struct {
	RequestID int64 `json:"requestId"`
}

// DSARStatus is the status answer.
type DSARStatus struct {
	Status string   `json:"status"`
	URLs   []string `json:"urls"`
}

// DSAR returns the DSAR API described above; cfg changes its base and
// cost budget.
func DSAR(cfg APIConfig) API {
	lim := cfg.Over(ratelimit.Config{Name: "dsar", Limit: dsarBudget, Window: dsarBudgetWindow})
	return API{
		Upstream: Upstream{API: "dsar", Kind: credentials.KindAnalytics, Fallback: cfg.URL,
			Scheme: SchemeOrgBasic},
		Limits: []Limit{{
			Config: lim,
			Cost:   costOf(http.MethodPost, dsarCostPost, dsarCostGet),
			Says:   fmt.Sprintf("the DSAR cost budget of %d per hour per organization", lim.Limit),
		}},
		Routes: []adminroute.Route{
			{Method: http.MethodPost, Path: DSARPath, Handler: Endpoint{BodyLimit: 1 << 20, Check: dsarCreate}},
			{Method: http.MethodGet, Path: DSARPath + "/{id}"},
			{Method: http.MethodGet, Path: DSARPath + "/{id}/outputs/{output}", Handler: Endpoint{Follow: dsarMaxRedirects}},
		},
	}
}

func dsarCreate(_ *http.Request, body []byte) *Problem {
	_, err := ParseDSAR(body)
	return BadIf(err)
}
