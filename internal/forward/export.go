// The event export API (docs/upstream-api.md, "Export"): base
// --analytics-url, the project's key pair as Basic. The archive (up to
// 4 GB) is streamed, never held; the caller has an idle time-out, not a
// total one. The upstream's own answers (400 over 4 GB, 404 for an empty
// range) pass back untouched.

package forward

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/credentials"
)

// ExportPath is the export endpoint, on the admin listener and upstream.
const ExportPath = "/api/2/export"

// ExportHourFormat is the form of start and end (UTC).
const ExportHourFormat = "20060102T15"

// ExportMaxRange is the longest range of one export request.
const ExportMaxRange = 365 * 24 * time.Hour

// ErrBadExportRange is returned (wrapped) by ParseExportRange for a range
// the upstream does not take.
var ErrBadExportRange = errors.New("bad export range")

// ExportRange is an export range of whole hours: Start to End, End's hour
// included. Both are UTC and on the hour.
type ExportRange struct {
	Start, End time.Time
}

// ParseExportRange parses start and end in ExportHourFormat (UTC); end
// before start or a range longer than ExportMaxRange is ErrBadExportRange.
func ParseExportRange(start, end string) (ExportRange, error) {
	s, err := time.Parse(ExportHourFormat, start)
	if err != nil {
		return ExportRange{}, fmt.Errorf("%w: start %q is not of the form YYYYMMDDTHH", ErrBadExportRange, start)
	}
	e, err := time.Parse(ExportHourFormat, end)
	if err != nil {
		return ExportRange{}, fmt.Errorf("%w: end %q is not of the form YYYYMMDDTHH", ErrBadExportRange, end)
	}
	r := ExportRange{s, e}
	switch {
	case r.End.Before(r.Start):
		return ExportRange{}, fmt.Errorf("%w: end %s is before start %s", ErrBadExportRange, r.EndParam(), r.StartParam())
	case r.Hours() > int(ExportMaxRange/time.Hour):
		return ExportRange{}, fmt.Errorf("%w: %d hours is longer than the 365 days one request may cover", ErrBadExportRange, r.Hours())
	}
	return r, nil
}

// Hours is the number of hours in r.
func (r ExportRange) Hours() int { return int(r.End.Sub(r.Start)/time.Hour) + 1 }

// StartParam is the start query value of r.
func (r ExportRange) StartParam() string { return r.Start.Format(ExportHourFormat) }

// EndParam is the end query value of r.
func (r ExportRange) EndParam() string { return r.End.Format(ExportHourFormat) }

// String is "START-END".
func (r ExportRange) String() string { return r.StartParam() + "-" + r.EndParam() }

// Split cuts r into consecutive ranges of at most hours hours (at least 1).
func (r ExportRange) Split(hours int) []ExportRange {
	hours = max(hours, 1)
	var out []ExportRange
	for s := r.Start; !s.After(r.End); s = s.Add(time.Duration(hours) * time.Hour) {
		e := s.Add(time.Duration(hours-1) * time.Hour)
		if e.After(r.End) {
			e = r.End
		}
		out = append(out, ExportRange{s, e})
	}
	return out
}

// Halves cuts r in two at an hour boundary; false for a single hour.
func (r ExportRange) Halves() (ExportRange, ExportRange, bool) {
	n := r.Hours()
	if n < 2 {
		return r, ExportRange{}, false
	}
	mid := r.Start.Add(time.Duration(n/2) * time.Hour)
	return ExportRange{r.Start, mid.Add(-time.Hour)}, ExportRange{mid, r.End}, true
}

// Export returns the export API described above. The answer, a zip of up
// to 4 GB, is streamed.
func Export(c APIConfig) API {
	return API{
		Upstream: Upstream{API: "export", Kind: credentials.KindAnalytics,
			Fallback: c.URL, Scheme: SchemeProjectBasic},
		Routes: []adminroute.Route{{Method: http.MethodGet, Path: ExportPath, Handler: Endpoint{Check: exportRange}}},
	}
}

func exportRange(r *http.Request, _ []byte) *Problem {
	q := r.URL.Query()
	start, end := q.Get("start"), q.Get("end")
	if start == "" || end == "" {
		return Bad("start and end are required, each of the form YYYYMMDDTHH")
	}
	_, err := ParseExportRange(start, end)
	return BadIf(err)
}
