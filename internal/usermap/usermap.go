package usermap

import (
	"cmp"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/forms"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/upstream"
)

// Limits of the API reference: "Mapping batch | map/unmap | at most 2000
// requests/events per batch and 1 MB"; "Mapping rate | 1500 alias calls
// (not batches) per 30 seconds"; "Read mappings | user_ids | 1 to 100".
const (
	MaxMappings  = 2000
	MaxBodyBytes = 1_000_000
	RateLimit    = 1500
	RateWindow   = 30 * time.Second
	MaxUserIDs   = 100
)

// Config configures a UserMap.
type Config struct {
	// AliasURL is the upstream base for POST /usermap (--alias-url), read
	// at every send (a reload may change it, for the mappings already
	// spooled too); a project's alias_url overrides it for that project's
	// api_key. Required.
	AliasURL *baseurl.Ref
	// AnalyticsURL is the upstream base for GET /api/2/usermap
	// (--analytics-url; ReadAPI's, given here to be checked); the project
	// named by X-Relay-Project may override it. Required.
	AnalyticsURL *baseurl.Ref
	// RateLimit is the mapping calls allowed per RateWindow per
	// organization; zero means RateLimit (1500).
	RateLimit int
	// RateWindow is the sliding window of RateLimit; zero means RateWindow
	// (30 s). Tests shrink it.
	RateWindow time.Duration
	// Spooling: the delivery's timing, the 503's Retry-After, the store.
	forms.Spooling
}

func httpBase(u string) bool {
	return strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://")
}

// Validate reports a configuration error.
func (c Config) Validate() error {
	switch {
	case !httpBase(c.AliasURL.Load()):
		return fmt.Errorf("usermap: AliasURL %q is not an http(s) base", c.AliasURL.Load())
	case !httpBase(c.AnalyticsURL.Load()):
		return fmt.Errorf("usermap: AnalyticsURL %q is not an http(s) base", c.AnalyticsURL.Load())
	case c.RateLimit < 0:
		return fmt.Errorf("usermap: RateLimit %d < 0", c.RateLimit)
	}
	return c.ValidateAs("usermap", c.RateWindow, c.RetryAfter)
}

// UserMap is the /usermap route (Spooled.In accepts) and the delivery of
// spooled mappings (Spooled's Pipeline: Run, Ready, LaneStatus, StopLane,
// ResumeLane); GET /api/2/usermap is ReadAPI.
type UserMap struct {
	creds *credentials.Ref // read at every use: a reload takes effect at once
	forms.Spooled
}

// New returns a UserMap. creds (the credentials file in force), log and reg
// may be nil.
func New(cfg Config, client *upstream.Client, creds *credentials.Ref, log *zap.Logger, reg prometheus.Registerer) (*UserMap, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.RateLimit, cfg.RateWindow = cmp.Or(cfg.RateLimit, RateLimit), cmp.Or(cfg.RateWindow, RateWindow)
	u := &UserMap{creds: creds}
	pace, err := newPacer(cfg.RateLimit, cfg.RateWindow, u.orgOf, promauto.With(reg).NewCounter(prometheus.CounterOpts{
		Name: "relay_usermap_pace_wait_seconds_total",
		Help: "Time lanes waited for the per-organization mapping rate (1500 per 30 s)."}))
	if err != nil {
		return nil, err
	}
	u.Spooled, err = forms.NewSpooled(delivery.FormConfig{
		Name:         "usermap",
		Lanes:        storage.KindUserMap,
		Kind:         &delivery.Form{Field: "mapping", MaxItems: min(MaxMappings, cfg.RateLimit), MaxBodyBytes: MaxBodyBytes},
		URL:          delivery.ProjectURL(creds, credentials.KindAlias, cfg.AliasURL, "/usermap"),
		ThrottleWait: cfg.RateWindow,
		Pacer:        pace,
	}, forms.IntakeConfig{Field: "mappings_accepted", AcceptedHelp: "Mappings accepted into the spool.",
		RejectedHelp: "POST /usermap requests refused locally, by reason."}, cfg.Spooling, client, creds, log, reg)
	if err != nil {
		return nil, err
	}
	return u, nil
}

// orgOf is the pacing key of an api_key: its project's organization, else
// the api_key itself (hashed; never logged).
func (u *UserMap) orgOf(apiKey string) string {
	creds := u.creds.Load()
	if p, ok := creds.ProjectByAPIKey(apiKey); ok {
		if o := p.Org(); o != nil {
			return "org:" + o.Name
		}
		return "project:" + p.Name
	}
	return "key:" + apiKey
}

// Routes returns POST /usermap (GET /api/2/usermap is ReadAPI, forwarded by
// internal/forward).
func (u *UserMap) Routes() []adminroute.Route {
	return []adminroute.Route{
		{Method: http.MethodPost, Path: "/usermap", Mode: admintoken.ModeOwn, Handler: forms.Handler(u.In, shape, parse)},
	}
}
