package export

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
)

// Path is the export endpoint, on the admin listener and upstream.
const Path = "/api/2/export"

// HourFormat is the form of start and end (UTC).
const HourFormat = "20060102T15"

// MaxRange is the longest range of one export request.
const MaxRange = 365 * 24 * time.Hour

// ErrBadRange is returned (wrapped) by ParseRange and NewRange for a range
// the upstream does not take.
var ErrBadRange = errors.New("bad export range")

// Range is an export range of whole hours: Start to End, End's hour
// included. Both are UTC and on the hour.
type Range struct {
	Start, End time.Time
}

// ParseRange parses start and end in HourFormat and checks the range (see
// NewRange).
func ParseRange(start, end string) (Range, error) {
	s, err := time.Parse(HourFormat, start)
	if err != nil {
		return Range{}, fmt.Errorf("%w: start %q is not of the form YYYYMMDDTHH", ErrBadRange, start)
	}
	e, err := time.Parse(HourFormat, end)
	if err != nil {
		return Range{}, fmt.Errorf("%w: end %q is not of the form YYYYMMDDTHH", ErrBadRange, end)
	}
	return NewRange(s, e)
}

// NewRange returns the range of hours start to end (truncated to the hour,
// UTC); end before start or a range longer than MaxRange is ErrBadRange.
func NewRange(start, end time.Time) (Range, error) {
	r := Range{start.UTC().Truncate(time.Hour), end.UTC().Truncate(time.Hour)}
	switch {
	case r.End.Before(r.Start):
		return Range{}, fmt.Errorf("%w: end %s is before start %s", ErrBadRange, r.End.Format(HourFormat), r.Start.Format(HourFormat))
	case r.Hours() > int(MaxRange/time.Hour):
		return Range{}, fmt.Errorf("%w: %d hours is longer than the 365 days one request may cover", ErrBadRange, r.Hours())
	}
	return r, nil
}

// Hours is the number of hours in r.
func (r Range) Hours() int { return int(r.End.Sub(r.Start)/time.Hour) + 1 }

// StartParam and EndParam are the query values of r.
func (r Range) StartParam() string { return r.Start.Format(HourFormat) }

// EndParam is the end query value of r.
func (r Range) EndParam() string { return r.End.Format(HourFormat) }

// String is "START-END".
func (r Range) String() string { return r.StartParam() + "-" + r.EndParam() }

// Split cuts r into consecutive ranges of at most hours hours (at least 1).
func (r Range) Split(hours int) []Range {
	hours = max(hours, 1)
	var out []Range
	for s := r.Start; !s.After(r.End); s = s.Add(time.Duration(hours) * time.Hour) {
		e := s.Add(time.Duration(hours-1) * time.Hour)
		if e.After(r.End) {
			e = r.End
		}
		out = append(out, Range{s, e})
	}
	return out
}

// Halves cuts r in two at an hour boundary; false for a single hour.
func (r Range) Halves() (Range, Range, bool) {
	n := r.Hours()
	if n < 2 {
		return r, Range{}, false
	}
	mid := r.Start.Add(time.Duration(n/2) * time.Hour)
	return Range{r.Start, mid.Add(-time.Hour)}, Range{mid, r.End}, true
}

// API is the export API as forward data: base --analytics-url (url), the
// project's key pair as Basic, and GET Path with start and end checked
// (ParseRange). The answer, a zip of up to 4 GB, is streamed.
func API(url string) forward.API {
	return forward.API{
		Upstream: forward.Upstream{API: "export", Kind: credentials.KindAnalytics,
			Fallback: url, Flag: "--analytics-url", Scheme: forward.SchemeProjectBasic},
		Routes: []forward.Route{{Method: http.MethodGet, Path: Path, Check: checkRange}},
	}
}

func checkRange(r *http.Request, _ []byte) *forward.Problem {
	q := r.URL.Query()
	start, end := q.Get("start"), q.Get("end")
	if start == "" || end == "" {
		return forward.Bad("start and end are required, each of the form YYYYMMDDTHH")
	}
	_, err := ParseRange(start, end)
	return forward.BadIf(err)
}
