package export

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
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

// Config configures the export route.
type Config struct {
	// URL is --analytics-url, the upstream base; "" means none (only
	// projects with an analytics_url can be served; others get 502).
	URL string
	// WriteIdleTimeout is the longest the caller may stop reading a
	// streamed archive before it is cut (see ForwardStreaming); 0 means
	// DefaultWriteIdleTimeout.
	WriteIdleTimeout time.Duration
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	if c.WriteIdleTimeout < 0 {
		return fmt.Errorf("export: WriteIdleTimeout %v < 0", c.WriteIdleTimeout)
	}
	return nil
}

// API is the export route. Build it with New.
type API struct {
	cfg   Config
	creds *credentials.Store
	fwd   *forward.Forwarder
	log   *zap.Logger
	up    forward.Upstream
}

// New returns the export route. creds (the --credentials file; nil means
// pass-through only), log and reg may be nil (reg is unused: the forwarder
// has the metrics).
func New(cfg Config, creds *credentials.Store, fwd *forward.Forwarder, log *zap.Logger, _ prometheus.Registerer) (*API, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if fwd == nil {
		return nil, errors.New("export: nil forwarder")
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &API{cfg: cfg, creds: creds, fwd: fwd, log: log, up: forward.Upstream{API: "export", Kind: credentials.KindAnalytics,
		Fallback: cfg.URL, Flag: "--analytics-url", Scheme: forward.SchemeProjectBasic}}, nil
}

// Routes returns GET /api/2/export in forwarding mode.
func (a *API) Routes() []adminroute.Route {
	return []adminroute.Route{{Method: fasthttp.MethodGet, Path: Path, Mode: admintoken.ModeForward, Handler: a.serve}}
}

func (a *API) serve(ctx *fasthttp.RequestCtx) {
	args := ctx.QueryArgs()
	start, end := args.Peek("start"), args.Peek("end")
	if len(start) == 0 || len(end) == 0 {
		forward.WriteError(ctx, fasthttp.StatusBadRequest, "start and end are required, each of the form YYYYMMDDTHH")
		return
	}
	if _, err := ParseRange(string(start), string(end)); err != nil {
		forward.WriteError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	res, ferr := forward.Resolve(ctx, a.creds, a.up)
	if ferr != nil {
		ferr.Write(ctx)
		return
	}
	ForwardStreaming(ctx, a.fwd, res.Target, a.cfg.WriteIdleTimeout)
}
