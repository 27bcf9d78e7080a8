package forms

import (
	"cmp"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/upstream"
)

// APIKey resolves the api_key of a spooling form route (POST /groupidentify,
// POST /usermap): apiKey as the request gave it, or, when project (the
// X-Relay-Project header) is not empty, the api_key of that project in
// creds (the request must then not give its own: 400, as for a project
// not in creds). The result is not empty and at most event.MaxAPIKeyBytes
// long (a lane per key).
func APIKey(creds *credentials.Store, project, apiKey string) (string, *ValidationError) {
	if project != "" {
		if apiKey != "" {
			return "", Bad("conflict", "api_key and X-Relay-Project: give one, not both")
		}
		p, ok := creds.Project(project)
		if !ok {
			return "", Bad("unknown_project", "X-Relay-Project: no project of that name in the credentials file")
		}
		apiKey = p.APIKey.Reveal()
	}
	if apiKey == "" {
		return "", Bad("missing_field", "api_key: missing or empty")
	}
	if len(apiKey) > event.MaxAPIKeyBytes {
		return "", Bad("invalid_api_key", "api_key: longer than %d bytes", event.MaxAPIKeyBytes)
	}
	return apiKey, nil
}

// IntakeConfig configures an Intake.
type IntakeConfig struct {
	// Name names the route's metrics (relay_<Name>_accepted_total,
	// relay_<Name>_rejected_requests_total{reason}) and log lines. Required.
	Name string
	// Kind is the spool lane kind records go to. Required.
	Kind storage.Kind
	// Field is the count's field of the 200 answer, e.g.
	// "mappings_accepted". Required.
	Field string
	// AcceptedHelp and RejectedHelp are the metrics' help texts.
	AcceptedHelp, RejectedHelp string
	// RetryAfter is sent with 503 when the store refuses (rounded up to
	// whole seconds); zero means DefaultRetryAfter.
	RetryAfter time.Duration
}

// Store is the store of a spooling form route: the intake appends, the
// delivery reads and stores dead letters. spool.NewBackend(sp) locally; in
// fleet mode the fleet's backend restricted to the kind (Backend.Only).
type Store interface {
	storage.Appender
	delivery.Store
}

// DefaultRetryAfter is IntakeConfig.RetryAfter's default.
const DefaultRetryAfter = 5 * time.Second

// Validate reports a configuration error.
func (c IntakeConfig) Validate() error {
	if c.Name == "" || c.Field == "" || c.Kind == storage.KindEvents || c.RetryAfter < 0 {
		return fmt.Errorf("forms: intake %q: Name, Field, a form lane Kind and RetryAfter >= 0 required", c.Name)
	}
	return nil
}

// Intake is the accepting half of a spooling form route (POST
// /groupidentify, POST /usermap): it resolves the api_key, refuses (and
// counts) bad requests and appends accepted records to the store.
type Intake struct {
	cfg        IntakeConfig
	st         storage.Appender
	creds      *credentials.Ref // read at every use: a reload takes effect at once
	log        *zap.Logger
	accepted   prometheus.Counter
	rejected   *prometheus.CounterVec // by the ValidationError's Reason
	retryAfter string                 // cfg.RetryAfter in whole seconds, rounded up
}

// NewIntake returns an Intake appending to st. creds, log and reg may be
// nil; its log lines are sampled (a few a second).
func NewIntake(cfg IntakeConfig, st storage.Appender, creds *credentials.Ref, log *zap.Logger, reg prometheus.Registerer) (*Intake, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if st == nil {
		return nil, errors.New("forms: intake needs a store")
	}
	if log == nil {
		log = zap.NewNop()
	}
	// Every request can fail the same way while the spool does: a few
	// lines a second, the counter has them all.
	log = log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Second, 5, 0)
	}))
	ra := cmp.Or(cfg.RetryAfter, DefaultRetryAfter)
	f := promauto.With(reg)
	return &Intake{cfg: cfg, st: st, creds: creds, log: log, retryAfter: strconv.Itoa(int((ra + time.Second - 1) / time.Second)),
		accepted: f.NewCounter(prometheus.CounterOpts{Name: "relay_" + cfg.Name + "_accepted_total", Help: cfg.AcceptedHelp}),
		rejected: f.NewCounterVec(prometheus.CounterOpts{Name: "relay_" + cfg.Name + "_rejected_requests_total", Help: cfg.RejectedHelp}, []string{"reason"}),
	}, nil
}

// Spooling is the part of a spooling form route's Config (groupidentify,
// usermap) handed to NewSpooled as is.
type Spooling struct {
	// FormTiming: max age, retries, linger and gzip of the delivery (zero
	// means delivery's defaults; MaxAge 6 days).
	delivery.FormTiming
	// RetryAfter is sent with 503 when the store refuses; zero means
	// DefaultRetryAfter (5 s). Rounded up to whole seconds.
	RetryAfter time.Duration
	// Store holds the records: spool.NewBackend(sp), or in fleet mode the
	// fleet's backend restricted to the route's kind. Required.
	Store Store
}

// Spooled is the two halves of a spooling form route (POST /groupidentify,
// POST /usermap): the Intake that accepts records into the lanes of one
// kind and the lane runner that delivers them (delivery.NewForm: the one
// every kind shares).
type Spooled struct {
	// Pipeline delivers (Run, Ready, LaneStatus, StopLane, ResumeLane:
	// with the last three a delivery.LaneControl).
	*delivery.Pipeline
	// In accepts.
	In *Intake
}

// NewSpooled returns the halves of the route of kind out.Lanes over
// sc.Store, with sc's timing (out's) and RetryAfter (in's); in's Name and
// Kind are out's. creds, log and reg may be nil.
func NewSpooled(out delivery.FormConfig, in IntakeConfig, sc Spooling, client *upstream.Client, creds *credentials.Ref, log *zap.Logger, reg prometheus.Registerer) (Spooled, error) {
	out.Store, out.FormTiming, in.RetryAfter = sc.Store, sc.FormTiming, sc.RetryAfter
	d, err := delivery.NewForm(out, client, log, reg)
	if err != nil {
		return Spooled{}, fmt.Errorf("%s: %w", out.Name, err)
	}
	in.Name, in.Kind = out.Name, out.Lanes
	i, err := NewIntake(in, sc.Store, creds, log, reg)
	if err != nil {
		return Spooled{}, fmt.Errorf("%s: %w", out.Name, err)
	}
	return Spooled{Pipeline: d, In: i}, nil
}
