package groupidentify

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
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

// Limits of the API reference ("Group identify | per request | at most 1024
// group identifies, 1024 group properties, 1 MB").
const (
	MaxIdentifies = 1024
	MaxProperties = 1024
	MaxBodyBytes  = 1_000_000
)

// Config configures a GroupIdentify.
type Config struct {
	// URL is the upstream base (--ingest-url), read at every send (a
	// reload may change it); requests go to URL + "/groupidentify" (a
	// project's ingest_url in the credentials file overrides it for that
	// project's api_key). Required.
	URL *baseurl.Ref
	// Spooling: the delivery's timing, the 503's Retry-After, the store.
	forms.Spooling
}

// Validate reports a configuration error.
func (c Config) Validate() error {
	if u := c.URL.Load(); !(strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://")) {
		return fmt.Errorf("groupidentify: URL %q is not an http(s) base", u)
	}
	return c.ValidateAs("groupidentify", c.RetryAfter)
}

// GroupIdentify is the /groupidentify route (Spooled.In accepts) and its
// delivery (Spooled's Pipeline: Run, Ready, LaneStatus, StopLane,
// ResumeLane).
type GroupIdentify struct{ forms.Spooled }

// New returns a GroupIdentify. creds (the credentials file in force), log
// and reg may be nil.
func New(cfg Config, client *upstream.Client, creds *credentials.Ref, log *zap.Logger, reg prometheus.Registerer) (*GroupIdentify, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s, err := forms.NewSpooled(delivery.FormConfig{
		Name:  "groupidentify",
		Lanes: storage.KindGroupIdentify,
		Kind: &delivery.Form{Field: "identification", MaxItems: MaxIdentifies, MaxBodyBytes: MaxBodyBytes,
			MaxWeight: MaxProperties, Weight: Properties},
		URL: delivery.ProjectURL(creds, credentials.KindIngest, cfg.URL, "/groupidentify"),
	}, forms.IntakeConfig{Field: "identifications_accepted", AcceptedHelp: "Group identifications accepted into the spool.",
		RejectedHelp: "POST /groupidentify requests refused, by reason."}, cfg.Spooling, client, creds, log, reg)
	if err != nil {
		return nil, err
	}
	return &GroupIdentify{s}, nil
}

// Routes returns the admin routes: POST /groupidentify.
func (g *GroupIdentify) Routes() []adminroute.Route {
	return []adminroute.Route{{Method: http.MethodPost, Path: "/groupidentify", Mode: admintoken.ModeOwn, Handler: forms.Handler(g.In, shape, parse)}}
}
