package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"time"
)

// User deletion route rules (first version; docs/upstream-api.md, User
// deletion). The Basic user name is the project's api key;
// the project's users are those of its events ingested through /2/httpapi
// (svc_id = SvcID(api key, user_id)).
//
//   - POST /api/2/deletions/users, JSON {svc_ids: [int], user_ids: [string],
//     requester, ignore_invalid_id, delete_from_org, include_mapped_user_ids}:
//     1 to DeletionMaxIDs ids in total, else 400. Ids with no data in the
//     project are invalid: with ignore_invalid_id false (and delete_from_org
//     false) 400 {"error", "invalid_ids"} and nothing is marked; else the
//     found users are added to the project's job scheduled DeletionLead after
//     today (Config.Now, UTC) and the job is answered 200 {day, status,
//     svc_ids, invalid_ids (when ignore_invalid_id or delete_from_org), app
//     (when delete_from_org: the search covers every api key seen)}.
//   - A job is "staging" until 3 days before its day, "submitted" until its
//     scrub is done (its day + 1; active_scrub_done_date), then after 5 more
//     days "done". A new request's job, DeletionLead ahead, is still
//     staging: requests made after a job was submitted go to a later one.
//   - GET /api/2/deletions/users?start_day&end_day: both required
//     (YYYY-MM-DD), end not before start, at most 6 months apart: else 400.
//     200 with the project's jobs whose day is in the range ([] if none).
//   - DELETE /api/2/deletions/users/{svc_id}/{day}: while the job is staging
//     (more than 3 days before its day) removes the id: 200 {svc_id,
//     requested_on_day, requester}; an id not in that job 404; a job no
//     longer staging 400.

// DeletionMaxIDs is the most ids (svc_ids and user_ids together) per request.
const DeletionMaxIDs = 100

// DeletionLead is how far after the request day a new job is scheduled.
const DeletionLead = 7 * 24 * time.Hour

// deletionUser is one entry of a job's svc_ids.
type deletionUser struct {
	SvcID          int64  `json:"svc_id"`
	Requester      string `json:"requester"`
	RequestedOnDay string `json:"requested_on_day"`
	UserID         string `json:"user_id,omitempty"`
}

type deletionJob struct {
	Day                 string         `json:"day"`
	Status              string         `json:"status"`
	SvcIDs              []deletionUser `json:"svc_ids"`
	App                 int64          `json:"app,omitempty"`
	InvalidIDs          []string       `json:"invalid_ids,omitempty"`
	ActiveScrubDoneDate string         `json:"active_scrub_done_date,omitempty"`
}

func (s *Sim) registerDeletion() {
	jobs := map[string]map[string][]deletionUser{} // api key -> day -> users
	s.apiRoute("POST /api/2/deletions/users", func(w http.ResponseWriter, r *http.Request, key string) (int, any) {
		var req struct {
			SvcIDs        []int64  `json:"svc_ids"`
			UserIDs       []string `json:"user_ids"`
			Requester     string   `json:"requester"`
			IgnoreInvalid bool     `json:"ignore_invalid_id"`
			DeleteFromOrg bool     `json:"delete_from_org"`
			IncludeMapped bool     `json:"include_mapped_user_ids"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
			return apiFail(http.StatusBadRequest, "invalid JSON body: "+err.Error())
		}
		if n := len(req.SvcIDs) + len(req.UserIDs); n == 0 || n > DeletionMaxIDs {
			return apiFail(http.StatusBadRequest, fmt.Sprintf("send 1 to %d ids (svc_ids and user_ids together), not %d", DeletionMaxIDs, n))
		}
		req.IgnoreInvalid = req.IgnoreInvalid || req.DeleteFromOrg
		var hits []keyUser
		var invalid []string
		users := s.usersOf(key, req.DeleteFromOrg)
		match := func(id string, is func(u keyUser) bool) { // hits, or id is invalid
			n := len(hits)
			for _, u := range users {
				if is(u) {
					hits = append(hits, u)
				}
			}
			if len(hits) == n {
				invalid = append(invalid, id)
			}
		}
		for _, id := range req.SvcIDs {
			match(strconv.FormatInt(id, 10), func(u keyUser) bool { return SvcID(u.key, u.user) == id })
		}
		for _, id := range req.UserIDs {
			match(id, func(u keyUser) bool { return u.user == id })
		}
		if len(invalid) > 0 && !req.IgnoreInvalid {
			return http.StatusBadRequest, map[string]any{
				"error": "some ids have no data in the project; nothing was marked for deletion", "invalid_ids": invalid}
		}
		now := s.cfg.Now().UTC()
		today := now.Format(time.DateOnly)
		dayS := now.Add(DeletionLead).Format(time.DateOnly)
		s.mu.Lock()
		var job deletionJob
		for _, h := range hits {
			byDay := entry(jobs, h.key, func() map[string][]deletionUser { return map[string][]deletionUser{} })
			u := deletionUser{SvcID: SvcID(h.key, h.user), Requester: req.Requester, RequestedOnDay: today}
			if req.IncludeMapped {
				u.UserID = h.user
			}
			if !slices.ContainsFunc(byDay[dayS], func(old deletionUser) bool { return old.SvcID == u.SvcID }) {
				byDay[dayS] = append(byDay[dayS], u)
			}
			if h.key == key || job.SvcIDs == nil {
				job.SvcIDs = append(job.SvcIDs, u)
			}
		}
		s.mu.Unlock()
		job.Day, job.Status, job.SvcIDs = dayS, "staging", nonNil(job.SvcIDs)
		if req.IgnoreInvalid {
			job.InvalidIDs = append([]string{}, invalid...)
		}
		if req.DeleteFromOrg {
			job.App = appID(key)
		}
		return http.StatusOK, job
	})
	s.apiRoute("GET /api/2/deletions/users", func(w http.ResponseWriter, r *http.Request, key string) (int, any) {
		q := r.URL.Query()
		start, err1 := time.Parse(time.DateOnly, q.Get("start_day"))
		end, err2 := time.Parse(time.DateOnly, q.Get("end_day"))
		switch {
		case err1 != nil || err2 != nil:
			return apiFail(http.StatusBadRequest, "start_day and end_day are required, as YYYY-MM-DD")
		case end.Before(start):
			return apiFail(http.StatusBadRequest, "end_day is before start_day")
		case end.After(start.AddDate(0, 6, 0)):
			return apiFail(http.StatusBadRequest, "the range is longer than six months")
		}
		now := s.cfg.Now().UTC()
		out := []deletionJob{}
		s.mu.Lock()
		for dayS, users := range jobs[key] {
			day, _ := time.Parse(time.DateOnly, dayS)
			if day.Before(start) || day.After(end) || len(users) == 0 {
				continue
			}
			j := deletionJob{Day: dayS, Status: deletionStatus(now, day), SvcIDs: append([]deletionUser{}, users...)}
			if scrub := day.AddDate(0, 0, 1); !now.Before(scrub) {
				j.ActiveScrubDoneDate = scrub.Format(time.DateOnly)
			}
			out = append(out, j)
		}
		s.mu.Unlock()
		sort.Slice(out, func(i, j int) bool { return out[i].Day < out[j].Day })
		return http.StatusOK, out
	})
	s.apiRoute("DELETE /api/2/deletions/users/{svc_id}/{day}", func(w http.ResponseWriter, r *http.Request, key string) (int, any) {
		id, err := strconv.ParseInt(r.PathValue("svc_id"), 10, 64)
		day, err2 := time.Parse(time.DateOnly, r.PathValue("day"))
		if err != nil || err2 != nil {
			return apiFail(http.StatusBadRequest, "want /api/2/deletions/users/{svc_id}/{YYYY-MM-DD}")
		}
		if deletionStatus(s.cfg.Now().UTC(), day) != "staging" {
			return apiFail(http.StatusBadRequest, "the job can no longer be changed: less than 3 days before its run")
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		users := jobs[key][r.PathValue("day")]
		for i, u := range users {
			if u.SvcID == id {
				jobs[key][r.PathValue("day")] = append(users[:i:i], users[i+1:]...)
				return http.StatusOK, map[string]any{"svc_id": u.SvcID, "requested_on_day": u.RequestedOnDay, "requester": u.Requester}
			}
		}
		return apiFail(http.StatusNotFound, "the id is not in the job of that day")
	})
}

// deletionStatus is the state at now of a job scheduled for day.
func deletionStatus(now, day time.Time) string {
	switch {
	case now.Before(day.Add(-3 * 24 * time.Hour)):
		return "staging"
	case now.Before(day.AddDate(0, 0, 6)):
		return "submitted"
	}
	return "done"
}

type keyUser struct{ key, user string }

// usersOf returns the distinct (api key, user_id) of the stored events of
// key, then with every those of each other key, keys in the order first seen.
func (s *Sim) usersOf(key string, every bool) []keyUser {
	var out []keyUser
	seen, rank := map[keyUser]bool{}, map[string]int{key: 0} // rank: keys in the order first seen
	for _, ev := range s.AllEvents() {
		u := keyUser{ev.APIKey, ev.UserID}
		if ev.UserID == "" || seen[u] || (!every && u.key != key) {
			continue
		}
		seen[u] = true
		if _, ok := rank[u.key]; !ok {
			rank[u.key] = len(rank)
		}
		out = append(out, u)
	}
	slices.SortStableFunc(out, func(a, b keyUser) int { return rank[a.key] - rank[b.key] })
	return out
}
