package plan

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/ratelimit"
	"github.com/svcrelay/relay/internal/upstream"
)

// Doer sends a request: an *http.Client.
type Doer interface {
	Do(*http.Request) (*http.Response, error)
}

// ErrBudget is returned by Refresh when reading the plan now would spend
// more than Config.Share of the taxonomy API's period cost on plan reads.
var ErrBudget = errors.New("plan read postponed: it would pass the plan's share of the taxonomy API's cost per period")

// maxAnswerBytes bounds one taxonomy answer read.
const maxAnswerBytes = 32 << 20

// maxTries bounds the tries of one call refused by a limit (the local
// limiter or the upstream's 429).
const maxTries = 5

// Run reads every project's plan at start, then every Config.Refresh, and
// at once for a project whose plan was changed through the forwarded
// taxonomy API (Changed); a project never read yet is tried again every
// 30 s (at most every Refresh). It returns when ctx ends.
func (e *Enforcer) Run(ctx context.Context) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			missing := e.refreshAll(ctx, false)
			next := e.live.Load().Refresh
			if missing {
				next = min(next, 30*time.Second)
			}
			t.Reset(next)
		case <-e.relive:
			t.Reset(0)
		case <-e.wake:
			e.refreshAll(ctx, true)
		}
	}
}

// refreshAll reads the plans of the projects in a mode other than off
// (only those marked by Changed when changed); it reports whether one is
// still without a plan.
func (e *Enforcer) refreshAll(ctx context.Context, changed bool) (missing bool) {
	for _, p := range e.creds.Load().Projects() {
		if e.mode(p) == Off {
			continue
		}
		st := e.state(p.Name)
		if changed && !st.refresh.Swap(false) {
			continue
		}
		if _, err := e.Refresh(ctx, p.Name); err != nil && ctx.Err() == nil {
			e.log.Warn("tracking plan not read; the last one stays in force", zap.String("project", p.Name), zap.Error(err))
		}
		missing = missing || st.cur.Load() == nil
	}
	return missing
}

// Changed marks project's plan for an immediate read (its taxonomy changed).
func (e *Enforcer) Changed(project string) {
	if _, ok := e.creds.Load().Project(project); !ok {
		return
	}
	e.state(project).refresh.Store(true)
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Refresh reads project's plan from the taxonomy API now, keeps it in Dir
// and puts it in force; on failure the plan in force stays.
func (e *Enforcer) Refresh(ctx context.Context, project string) (Info, error) {
	p, ok := e.creds.Load().Project(project)
	if !ok {
		return Info{}, fmt.Errorf("no project %q in the credentials file", project)
	}
	st := e.state(project)
	st.fetchMu.Lock()
	defer st.fetchMu.Unlock()
	pl, err := e.read(ctx, p)
	var c *compiled
	if err == nil {
		c, err = compile(pl)
	}
	now := time.Now()
	if err == nil {
		if serr := save(e.cfg.Dir, project, pl, now); serr != nil {
			e.log.Error("tracking plan not kept on disk (in force all the same)", zap.String("project", project), zap.Error(serr))
		}
		st.cur.Store(&cached{plan: pl, c: c, fetched: now})
	}
	st.mu.Lock()
	st.lastErr = ""
	if err != nil {
		st.lastErr = err.Error()
	}
	st.mu.Unlock()
	info, _ := e.Info(project)
	return info, err
}

// propJSON is an event or user property record of the taxonomy API.
type propJSON struct {
	EventProperty string  `json:"event_property"`
	UserProperty  string  `json:"user_property"`
	Type          string  `json:"type"`
	Regex         *string `json:"regex"`
	EnumValues    *string `json:"enum_values"`
	IsArrayType   bool    `json:"is_array_type"`
	IsRequired    bool    `json:"is_required"`
	Deleted       bool    `json:"deleted"`
}

func properties(rs []propJSON, user bool) []Property {
	out := make([]Property, 0, len(rs))
	for _, r := range rs {
		if r.Deleted {
			continue
		}
		name := r.EventProperty
		if user {
			name = strings.TrimPrefix(r.UserProperty, "gp:")
		}
		if name == "" {
			continue
		}
		p := Property{Name: name, Type: r.Type, Array: r.IsArrayType, Required: r.IsRequired}
		if r.Regex != nil {
			p.Regex = *r.Regex
		}
		if r.EnumValues != nil && *r.EnumValues != "" {
			for _, v := range strings.Split(*r.EnumValues, ",") {
				p.Enum = append(p.Enum, strings.TrimSpace(v))
			}
		}
		out = append(out, p)
	}
	return out
}

// read reads the plan: the event types, the shared event properties, the
// user properties, then each event type's own properties; one call at a
// time (cost 1 each), so the plan takes at most 1 of the API's cost in
// flight and leaves the rest to the operators' calls.
func (e *Enforcer) read(ctx context.Context, p *credentials.Project) (*Plan, error) {
	base := p.URL(credentials.KindAnalytics, e.cfg.AnalyticsURL.Load())
	if base == "" {
		return nil, errors.New("no taxonomy API base (--analytics-url or the project's analytics_url)")
	}
	base = strings.TrimRight(base, "/") + "/api/2/taxonomy"
	var evs []struct {
		EventType string `json:"event_type"`
	}
	if !e.spend(p.Name, 1) {
		return nil, ErrBudget
	}
	if err := e.get(ctx, p, base+"/event", &evs); err != nil {
		return nil, err
	}
	// The rest of the read costs len(evs)+2: refuse it now rather than
	// stop half-way.
	if !e.spend(p.Name, len(evs)+2) {
		return nil, ErrBudget
	}
	var shared, users []propJSON
	if err := e.get(ctx, p, base+"/event-property", &shared); err != nil {
		return nil, err
	}
	if err := e.get(ctx, p, base+"/user-property", &users); err != nil {
		return nil, err
	}
	pl := &Plan{Shared: properties(shared, false), UserProperties: properties(users, true), Overrides: map[string][]Property{}}
	for _, ev := range evs {
		if ev.EventType == "" {
			continue
		}
		pl.EventTypes = append(pl.EventTypes, ev.EventType)
		var own []propJSON
		if err := e.get(ctx, p, base+"/event-property?event_type="+url.QueryEscape(ev.EventType), &own); err != nil {
			return nil, err
		}
		if ps := properties(own, false); len(ps) > 0 {
			pl.Overrides[ev.EventType] = ps
		}
	}
	return pl, nil
}

// spend counts cost against project's budget, false (nothing counted) when
// it does not fit.
func (e *Enforcer) spend(project string, cost int) bool {
	release, err := e.budget.Acquire(context.Background(), "project:"+project, cost)
	if err != nil {
		return false
	}
	release() // counts for the Window from now
	return true
}

// get reads one taxonomy list into out (its "data"), within the shared
// limiter: a call refused by it, or answered 429, waits its Retry-After
// and is tried again (maxTries in all).
func (e *Enforcer) get(ctx context.Context, p *credentials.Project, u string, out any) error {
	key := "project:" + p.Name
	for try := 1; ; try++ {
		wait, err := e.getOnce(ctx, key, p, u, out)
		if wait == 0 || try == maxTries {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// getOnce makes one call; wait > 0 means try again after it.
func (e *Enforcer) getOnce(ctx context.Context, key string, p *credentials.Project, u string, out any) (wait time.Duration, err error) {
	release, err := e.lim.Acquire(ctx, key, 1)
	if err != nil {
		var le *ratelimit.LimitedError
		if errors.As(err, &le) {
			return time.Duration(le.RetryAfterSeconds()) * time.Second, fmt.Errorf("taxonomy API: %w", err)
		}
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		release()
		return 0, err
	}
	req.Header.Set("Authorization", credentials.BasicAuth(p.APIKey, p.SecretKey))
	req.Header.Set("Accept", "application/json")
	res, err := e.hc.Do(req)
	release()
	if err != nil {
		return 0, fmt.Errorf("taxonomy API: %w", err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxAnswerBytes))
	if err != nil {
		return 0, fmt.Errorf("taxonomy API: %w", err)
	}
	if res.StatusCode == http.StatusTooManyRequests {
		d := min(cmp.Or(upstream.RetryAfter(res.Header.Get("Retry-After"), time.Now()), time.Second), e.lim.Config().Window)
		e.lim.Pause(key, d)
		return d, errors.New("taxonomy API answered 429")
	}
	if res.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("taxonomy API answered %d to GET %s", res.StatusCode, req.URL.Path)
	}
	// A null data leaves out as it was: an empty list.
	env := struct {
		Success bool `json:"success"`
		Data    any  `json:"data"`
	}{Data: out}
	if err := json.Unmarshal(body, &env); err != nil {
		return 0, fmt.Errorf("taxonomy API answer: %w", err)
	}
	if !env.Success {
		return 0, fmt.Errorf("taxonomy API answered success false to GET %s", req.URL.Path)
	}
	return 0, nil
}
