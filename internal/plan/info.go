package plan

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
)

// Info is what GET /relay/v1/plan shows of a project.
type Info struct {
	Project string `json:"project"`
	Mode    string `json:"mode"`
	// Enforcing is false while no plan was ever read (the project then
	// observes, with nothing to observe against).
	Enforcing  bool       `json:"enforcing"`
	Fetched    *time.Time `json:"fetched,omitempty"`
	AgeSeconds float64    `json:"age_seconds,omitempty"`
	Counts     Counts     `json:"counts"`
	LastError  string     `json:"last_error,omitempty"`
	Plan       *Plan      `json:"plan,omitempty"`
	Samples    []Sample   `json:"samples"`
}

// Counts sizes a plan.
type Counts struct {
	EventTypes       int `json:"event_types"`
	SharedProperties int `json:"shared_properties"`
	EventProperties  int `json:"event_properties"`
	UserProperties   int `json:"user_properties"`
}

// Info returns project's plan in force and its state; false when the
// credentials file has no such project.
func (e *Enforcer) Info(project string) (Info, bool) {
	p, ok := e.creds.Load().Project(project)
	if !ok {
		return Info{}, false
	}
	st := e.state(project)
	in := Info{Project: project, Mode: e.mode(p).String(), Samples: []Sample{}}
	if cur := st.cur.Load(); cur != nil {
		at := cur.fetched.UTC()
		in.Enforcing, in.Fetched, in.AgeSeconds, in.Plan = true, &at, time.Since(cur.fetched).Seconds(), cur.plan
		in.Counts = Counts{EventTypes: len(cur.plan.EventTypes), SharedProperties: len(cur.plan.Shared), UserProperties: len(cur.plan.UserProperties)}
		for _, ps := range cur.plan.Overrides {
			in.Counts.EventProperties += len(ps)
		}
	}
	st.mu.Lock()
	in.LastError = st.lastErr
	in.Samples = append(in.Samples, st.samples...)
	st.mu.Unlock()
	return in, true
}

// ReadyInfo is /readyz's line on the plans: the projects in a mode other
// than off whose plan was never read, which observe meanwhile ("" when
// none). It never changes /readyz's status: ingest keeps taking events.
func (e *Enforcer) ReadyInfo() string {
	var waiting []string
	for _, p := range e.creds.Load().Projects() {
		if m := e.mode(p); m != Off && e.state(p.Name).cur.Load() == nil {
			waiting = append(waiting, fmt.Sprintf("%s (%s)", p.Name, m))
		}
	}
	if len(waiting) == 0 {
		return ""
	}
	return "tracking plan: not read yet, observing until it is: " + strings.Join(waiting, ", ") + "\n"
}

// Watch wraps the forwarded taxonomy API's routes: a change (any method
// but GET) answered 2xx marks its project's plan for an immediate read.
// The project is the X-Relay-Project named, else the project of the Basic
// api_key.
func (e *Enforcer) Watch(routes []adminroute.Route) []adminroute.Route {
	out := slices.Clone(routes)
	for i, rt := range out {
		if rt.Method == http.MethodGet || !strings.HasPrefix(rt.Path, "/api/2/taxonomy/") {
			continue
		}
		h := rt.Handler
		out[i].Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			project := r.Header.Get(admintoken.HeaderProject)
			if project == "" {
				if key, _, ok := r.BasicAuth(); ok {
					if p, ok := e.creds.Load().ProjectByAPIKey(key); ok {
						project = p.Name
					}
				}
			}
			sw := &adminroute.StatusWriter{ResponseWriter: w}
			h.ServeHTTP(sw, r)
			if project != "" && sw.Status < 300 { // 0: nothing written
				e.Changed(project)
			}
		})
	}
	return out
}

// ageCollector is relay_plan_age_seconds{project}: how old each project's
// plan in force is (projects without one have no series).
type ageCollector struct{ e *Enforcer }

var ageDesc = prometheus.NewDesc("relay_plan_age_seconds", "Age of the tracking plan in force, by project (since it was read from the taxonomy API).", []string{"project"}, nil)

func (c ageCollector) Describe(ch chan<- *prometheus.Desc) { ch <- ageDesc }

func (c ageCollector) Collect(ch chan<- prometheus.Metric) {
	c.e.mu.Lock()
	sts := make([]*state, 0, len(c.e.states))
	for _, st := range c.e.states {
		sts = append(sts, st)
	}
	c.e.mu.Unlock()
	now := time.Now()
	for _, st := range sts {
		if cur := st.cur.Load(); cur != nil {
			ch <- prometheus.MustNewConstMetric(ageDesc, prometheus.GaugeValue, now.Sub(cur.fetched).Seconds(), st.name)
		}
	}
}

// Routes returns the admin listener's plan routes: GET
// /relay/v1/plan?project=NAME (the plan in force, its age, counts, last
// error and samples of violating events) and POST
// /relay/v1/plan/refresh?project=NAME (read it now; every project in a
// mode other than off without project).
func (e *Enforcer) Routes() []adminroute.Route {
	return []adminroute.Route{
		{Method: http.MethodGet, Path: "/relay/v1/plan", Mode: admintoken.ModeOwn, Handler: http.HandlerFunc(e.serveInfo)},
		{Method: http.MethodPost, Path: "/relay/v1/plan/refresh", Mode: admintoken.ModeOwn, Handler: http.HandlerFunc(e.serveRefresh)},
	}
}

func (e *Enforcer) serveInfo(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("project")
	if name == "" {
		var out []Info
		for _, p := range e.creds.Load().Projects() {
			in, _ := e.Info(p.Name)
			in.Plan = nil
			out = append(out, in)
		}
		adminroute.WriteJSON(w, http.StatusOK, map[string]any{"projects": out})
		return
	}
	in, ok := e.Info(name)
	if !ok {
		adminroute.WriteJSON(w, http.StatusNotFound, map[string]string{"error": "no project of that name in the credentials file"})
		return
	}
	adminroute.WriteJSON(w, http.StatusOK, in)
}

func (e *Enforcer) serveRefresh(w http.ResponseWriter, r *http.Request) {
	names := []string{r.URL.Query().Get("project")}
	if names[0] == "" {
		names = names[:0]
		for _, p := range e.creds.Load().Projects() {
			if e.mode(p) != Off {
				names = append(names, p.Name)
			}
		}
	}
	out := make([]Info, 0, len(names))
	status := http.StatusOK
	for _, n := range names {
		in, err := e.Refresh(r.Context(), n)
		if err != nil {
			if in.Project == "" {
				adminroute.WriteJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
				return
			}
			status = http.StatusBadGateway
		}
		in.Plan = nil
		out = append(out, in)
	}
	adminroute.WriteJSON(w, status, map[string]any{"projects": out})
}
