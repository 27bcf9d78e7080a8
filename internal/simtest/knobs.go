package simtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"time"

	"github.com/svcrelay/relay/internal/sim"
)

// Model is the simulator the functions of this file turn and read: a
// *sim.Sim or a *Sim. They set its sim.Knobs and read its /sim/ read-outs
// in process (the same answers Control reads over HTTP).
type Model interface {
	Knobs(f func(k *sim.Knobs))
	ControlHandler() http.Handler
}

// readOut returns the answer of the read-out GET path, decoded.
func readOut[T any](m Model, path string) T {
	w := httptest.NewRecorder()
	m.ControlHandler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
	var out T
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		panic(fmt.Sprintf("simtest: read-out %s: %v: %s", path, err, w.Body))
	}
	return out
}

func setPositive[T int | int64 | time.Duration](dst *T, v T) {
	if v > 0 {
		*dst = v
	}
}

// Silence silences a device (every api_key) until Unsilence.
func Silence(m Model, deviceID string) {
	m.Knobs(func(k *sim.Knobs) { k.Silenced[deviceID] = true })
}

// Unsilence ends Silence.
func Unsilence(m Model, deviceID string) {
	m.Knobs(func(k *sim.Knobs) { delete(k.Silenced, deviceID) })
}

// SilencedDevices returns the silenced devices, sorted.
func SilencedDevices(m Model) (out []string) {
	m.Knobs(func(k *sim.Knobs) { out = slices.Sorted(maps.Keys(k.Silenced)) })
	return out
}

// SetDailyQuota changes the daily quota per device (0: none).
func SetDailyQuota(m Model, n int) { m.Knobs(func(k *sim.Knobs) { k.DailyQuota = n }) }

// SetManagementKey makes key an accepted experiment management key (once
// one is set, others are answered 403).
func SetManagementKey(m Model, key string) {
	m.Knobs(func(k *sim.Knobs) { k.ManagementKeys[key] = true })
}

// SetSCIMToken makes token an accepted SCIM token of organization org (once
// one is set, others are answered 403).
func SetSCIMToken(m Model, token, org string) {
	m.Knobs(func(k *sim.Knobs) { k.SCIMTokens[token] = org })
}

// SetProjectSecret makes secret the only accepted secret key of apiKey on
// the classifier and taxonomy routes.
func SetProjectSecret(m Model, apiKey, secret string) {
	m.Knobs(func(k *sim.Knobs) { k.ProjectSecrets[apiKey] = secret })
}

// SetSCIMRate sets the SCIM rate limit; zero values keep the current setting.
func SetSCIMRate(m Model, limit int, window time.Duration) {
	m.Knobs(func(k *sim.Knobs) { setPositive(&k.SCIMLimit, limit); setPositive(&k.SCIMWindow, window) })
}

// SetTaxonomyLimits sets the taxonomy limits; zero values keep the current
// setting.
func SetTaxonomyLimits(m Model, maxInFlight, periodCost int, period time.Duration) {
	m.Knobs(func(k *sim.Knobs) {
		setPositive(&k.TaxonomyMaxInFlight, maxInFlight)
		setPositive(&k.TaxonomyPeriodCost, periodCost)
		setPositive(&k.TaxonomyPeriod, period)
	})
}

// SetTaxonomyDelay makes every taxonomy request take at least d.
func SetTaxonomyDelay(m Model, d time.Duration) { m.Knobs(func(k *sim.Knobs) { k.TaxonomyDelay = d }) }

// TaxonomyPeakInFlight returns the highest taxonomy cost in flight seen for apiKey.
func TaxonomyPeakInFlight(m Model, apiKey string) int {
	return readOut[sim.MgmtCalls](m, "/sim/mgmt/calls").TaxonomyPeak[sim.KeyLabel(apiKey)]
}

// MgmtCalls returns the management calls logged so far, oldest first.
func MgmtCalls(m Model) []sim.MgmtCall { return readOut[sim.MgmtCalls](m, "/sim/mgmt/calls").Calls }

// SetUserMapRate sets the mapping rate limit: limit calls per window
// (defaults 1500 per 30 s); zero values keep the current setting.
func SetUserMapRate(m Model, limit int, window time.Duration) {
	m.Knobs(func(k *sim.Knobs) { setPositive(&k.UserMapLimit, limit); setPositive(&k.UserMapWindow, window) })
}

// SetUserMapOrg puts apiKey in organization org: keys of one organization
// share the mapping rate and the mapping state.
func SetUserMapOrg(m Model, apiKey, org string) {
	m.Knobs(func(k *sim.Knobs) { k.UserMapOrgs[apiKey] = org })
}

// SetSecretKey makes GET /api/2/usermap require secret for apiKey.
func SetSecretKey(m Model, apiKey, secret string) {
	m.Knobs(func(k *sim.Knobs) { k.UserMapSecrets[apiKey] = secret })
}

// RejectUserID makes every POST /usermap holding this user_id fail with 400
// "Invalid mapping" (no index named) until Reset.
func RejectUserID(m Model, id string) { m.Knobs(func(k *sim.Knobs) { k.RejectedUserIDs[id] = true }) }

// RejectGroupValue makes every request holding an identification with this
// group_value fail with 400 "Invalid group identification" (no index
// named) until Reset.
func RejectGroupValue(m Model, v string) {
	m.Knobs(func(k *sim.Knobs) { k.RejectedGroupValues[v] = true })
}

// MappingCalls returns every applied mapping, in order.
func MappingCalls(m Model) []sim.MappingCall {
	return readOut[sim.UserMapState](m, "/sim/usermap").Calls
}

// MappingBatches returns the accepted POST /usermap requests with their
// arrival time, organization and mapping count.
func MappingBatches(m Model) []sim.MappingBatch {
	return readOut[sim.UserMapState](m, "/sim/usermap").Batches
}

// MappingThrottled returns the number of POST /usermap answered 429.
func MappingThrottled(m Model) int64 { return readOut[sim.UserMapState](m, "/sim/usermap").Throttled }

// MappingReads returns the GET /api/2/usermap requests seen.
func MappingReads(m Model) []sim.MappingRead {
	return readOut[sim.UserMapState](m, "/sim/usermap").Reads
}

// MappedTo returns the global user id apiKey's organization maps userID to.
func MappedTo(m Model, apiKey, userID string) (string, bool) {
	var org string
	m.Knobs(func(k *sim.Knobs) { org = sim.UserMapOrg(k, apiKey) })
	g, ok := readOut[sim.UserMapState](m, "/sim/usermap").Mapped[org][userID]
	return g, ok
}

// GroupIdentifies returns the identifications stored for apiKey, in arrival order.
func GroupIdentifies(m Model, apiKey string) []sim.GroupIdentify {
	return readOut[[]sim.GroupIdentify](m, "/sim/groupidentify?api_key="+url.QueryEscape(apiKey))
}

// GroupIdentifyRequests returns the number of /groupidentify requests that
// stored their identifications.
func GroupIdentifyRequests(m Model) int64 { return readOut[sim.Stats](m, "/sim/stats").GroupIdentifies }

// Counted returns the number of events CountOnly mode counted.
func Counted(m Model) int64 { return readOut[sim.Stats](m, "/sim/stats").Counted }

// DSARConfig changes the DSAR routes' knobs (POST /sim/dsar/config).
type DSARConfig struct {
	// PollsToDone is how many status polls a job takes to finish; 0 keeps
	// the current value (initially 3).
	PollsToDone int `json:"polls_to_done,omitempty"`
	// FailNext makes the next FailNext created jobs end "failed" instead of
	// "done"; nil keeps the current value.
	FailNext *int `json:"fail_next,omitempty"`
	// URLTTL is how long the urls of a done job stay valid, as a Go
	// duration; "" keeps the current value (initially 48h).
	URLTTL string `json:"url_ttl,omitempty"`
}

// SetDSAR changes the DSAR routes' knobs (fields left zero or nil keep
// their value).
func SetDSAR(m Model, c DSARConfig) error {
	var ttl time.Duration
	if c.URLTTL != "" {
		d, err := time.ParseDuration(c.URLTTL)
		if err != nil {
			return fmt.Errorf("simtest: DSAR url_ttl: %w", err)
		}
		ttl = d
	}
	if c.PollsToDone < 0 || (c.FailNext != nil && *c.FailNext < 0) || ttl < 0 {
		return errors.New("simtest: DSAR configuration: negative value")
	}
	m.Knobs(func(k *sim.Knobs) {
		setPositive(&k.DSARPollsToDone, c.PollsToDone)
		if c.FailNext != nil {
			k.DSARFailNext = *c.FailNext
		}
		setPositive(&k.DSARURLTTL, ttl)
	})
	return nil
}

// ExportConfig changes the export route's knobs (POST /sim/export/config).
type ExportConfig struct {
	// MaxBytes is the largest estimated result; larger ranges get 400. Zero
	// (or absent) keeps the current value; the initial value is 4 GiB.
	MaxBytes int64 `json:"max_bytes,omitempty"`
	// SyntheticBytesPerHour adds that many bytes of synthetic records to
	// every hour of every range; nil keeps the current value, 0 turns it off.
	SyntheticBytesPerHour *int64 `json:"synthetic_bytes_per_hour,omitempty"`
}

// SetExport changes the export route's knobs (fields left zero or nil keep
// their value).
func SetExport(m Model, c ExportConfig) error {
	if c.MaxBytes < 0 || (c.SyntheticBytesPerHour != nil && *c.SyntheticBytesPerHour < 0) {
		return errors.New("simtest: export configuration: negative value")
	}
	m.Knobs(func(k *sim.Knobs) {
		setPositive(&k.ExportMaxBytes, c.MaxBytes)
		if c.SyntheticBytesPerHour != nil {
			k.ExportSyntheticBytes = *c.SyntheticBytesPerHour
		}
	})
	return nil
}
