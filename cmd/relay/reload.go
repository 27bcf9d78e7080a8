package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/config"
	"go.uber.org/zap"
)

// settingChange is one setting a reload changes (or would, for `config
// check --diff`), values as `config check` shows them (secrets masked).
type settingChange struct {
	Name   string `json:"name"`
	Old    string `json:"old"`
	New    string `json:"new"`
	Source string `json:"source"` // where the new value comes from
	Live   bool   `json:"live"`   // false: needs a restart, kept
}

// diffSettings lists the settings whose value differs between old and new.
// The token and credentials files count as changed when their content is:
// a reload reads them again. A token given directly (Load keeps only its
// Token) counts as changed when the Tokens differ: it needs a restart.
func diffSettings(old, new config.Config) []settingChange {
	var out []settingChange
	oldVals := map[string]string{}
	for _, s := range old.Settings {
		oldVals[s.Name] = s.Value
	}
	for _, s := range new.Settings {
		sameToken := s.Name != "admin-token" || new.AdminTokenFile != "" || old.AdminTokenFile != "" || old.Token.Same(new.Token)
		if o, ok := oldVals[s.Name]; ok && o == s.Value && sameToken && secretOf(old, s.Name) == secretOf(new, s.Name) {
			continue
		}
		out = append(out, settingChange{Name: s.Name, Old: oldVals[s.Name], New: s.Value,
			Source: new.Source(s.Name), Live: config.LiveFrom(old, new, s.Name)})
	}
	return out
}

// secretOf is what a masked setting holds, compared (never shown) to see
// whether it changed.
func secretOf(c config.Config, name string) string {
	if name != "allowed-api-keys" {
		return ""
	}
	return strings.Join(c.AllowedAPIKeys, "\x00")
}

// configReloader is what SIGHUP and POST /relay/v1/reload run: the
// configuration (the command line's flags, the RELAY_* variables, the
// --config file, the token and credentials files) is read and validated
// again as at start; a bad one changes nothing; a good one is put in force
// by every reloader (reloaders.run), settings that need a restart kept.
type configReloader struct {
	load func() (config.Config, error)
	hup  *reloaders
	log  *zap.Logger

	// Lock order: serial, then mu. serial makes reloads one at a time and
	// is held while the reloaders run (they never reload); mu guards cur
	// only, and no call is made while it is held.
	serial chan struct{} // buffered 1: the token of the reload running
	mu     sync.Mutex
	cur    config.Config // in force
	// guard, when set, may refuse a configuration read well (the spool's
	// upstream guard) before anything of it is in force.
	guard func(cur, next config.Config) error

	ok, at prometheus.Gauge
}

func newConfigReloader(cfg config.Config, load func() (config.Config, error), hup *reloaders, log *zap.Logger) *configReloader {
	r := &configReloader{load: load, hup: hup, log: log, cur: cfg, serial: make(chan struct{}, 1)}
	r.ok = prometheus.NewGauge(prometheus.GaugeOpts{Name: "relay_config_last_reload_successful",
		Help: "1 when the last configuration reload (SIGHUP, POST /relay/v1/reload) succeeded or none was tried, 0 when it was refused."})
	r.at = prometheus.NewGauge(prometheus.GaugeOpts{Name: "relay_config_last_reload_success_timestamp_seconds",
		Help: "When the configuration was last put in force (start or successful reload), Unix seconds."})
	r.ok.Set(1)
	r.at.SetToCurrentTime()
	return r
}

// setGuard makes every later reload pass g first.
func (r *configReloader) setGuard(g func(cur, next config.Config) error) {
	r.mu.Lock()
	r.guard = g
	r.mu.Unlock()
}

// reloadResult is the answer of a reload.
type reloadResult struct {
	Reloaded     bool            `json:"reloaded"`
	Error        string          `json:"error,omitempty"`
	Changed      []settingChange `json:"changed"`
	NeedsRestart []string        `json:"needs_restart"` // changed but kept
}

// reload reads the configuration again and puts it in force; by names what
// asked (SIGHUP, the endpoint), for the log.
func (r *configReloader) reload(by string) reloadResult {
	r.serial <- struct{}{}
	defer func() { <-r.serial }()
	r.mu.Lock()
	cur, guard := r.cur, r.guard
	r.mu.Unlock()
	res := reloadResult{Changed: []settingChange{}, NeedsRestart: []string{}}
	var next config.Config
	err := errors.New("this relay cannot read its configuration again") // serve was given no load
	if r.load != nil {
		next, err = r.load()
	}
	if err == nil && guard != nil {
		err = guard(cur, next)
	}
	if err != nil {
		r.ok.Set(0)
		res.Error = err.Error()
		// The error names the setting and where its value came from, as
		// `relay config check` does.
		r.log.Error("configuration not reloaded; the settings in force stay", zap.String("by", by), errField(err))
		return res
	}
	res.Changed = diffSettings(cur, next)
	eff := config.Reloaded(cur, next)
	var live []string
	for _, c := range res.Changed {
		if c.Live {
			live = append(live, c.Name)
			continue
		}
		res.NeedsRestart = append(res.NeedsRestart, c.Name)
		r.log.Warn("setting "+c.Name+" changed (from "+c.Source+") but needs a restart: the value in force is kept",
			zap.String("in_force", c.Old), zap.String("new", c.New))
	}
	for _, w := range next.Warnings {
		r.log.Warn(w)
	}
	r.hup.run(eff)
	r.mu.Lock()
	r.cur = eff
	r.mu.Unlock()
	r.ok.Set(1)
	r.at.SetToCurrentTime()
	res.Reloaded = true
	r.log.Info("configuration reloaded", zap.String("by", by), zap.Strings("changed", live), zap.Strings("needs_restart", res.NeedsRestart))
	return res
}

// inForce is a setting in force as GET /relay/v1/config shows it: the
// value as `config check` prints it (secrets masked), and for a masked one
// a digest to see whether it changed, never the secret.
type inForce struct {
	Name   string `json:"name"`
	Value  string `json:"value"`
	Source string `json:"source"`
	Digest string `json:"digest,omitempty"`
}

func settingsInForce(c config.Config) []inForce {
	out := make([]inForce, 0, len(c.Settings))
	for _, s := range c.Settings {
		f := inForce{Name: s.Name, Value: s.Value, Source: c.Source(s.Name)}
		if v := secretOf(c, s.Name); v != "" {
			h := sha256.Sum256([]byte(v))
			f.Digest = hex.EncodeToString(h[:8])
		}
		out = append(out, f)
	}
	return out
}

// routes are POST /relay/v1/reload (200 with the result when the
// configuration was put in force, 422 with the error when it was refused)
// and GET /relay/v1/config (the settings in force, for `relay config check
// --diff`).
func (r *configReloader) routes() []adminroute.Route {
	return []adminroute.Route{
		{Method: http.MethodGet, Path: "/relay/v1/config", Mode: admintoken.ModeOwn,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				r.mu.Lock()
				cur := r.cur
				r.mu.Unlock()
				adminroute.WriteJSON(w, http.StatusOK, map[string]any{"settings": settingsInForce(cur)})
			})},
		{Method: http.MethodPost, Path: "/relay/v1/reload", Mode: admintoken.ModeOwn,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				res, status := r.reload("POST /relay/v1/reload"), http.StatusOK
				if !res.Reloaded {
					status = http.StatusUnprocessableEntity
				}
				adminroute.WriteJSON(w, status, res)
			})},
	}
}
