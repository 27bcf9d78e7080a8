package sim

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/sim/wiretest"
)

func TestDeletionJobs(t *testing.T) {
	clock := newFakeClock() // 2026-11-22 12:00 UTC
	_, url := start(t, Config{Now: clock.Now})
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("proj", `{"event_type":"e","user_id":"alice"}`, `{"event_type":"e","user_id":"bobby"}`))
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("other", `{"event_type":"e","user_id":"carol"}`))
	del := func(body string) answer {
		return apiCall(t, "POST", url+"/api/2/deletions/users", "proj", []byte(body))
	}
	ids := make([]int64, 101)
	b, _ := json.Marshal(map[string]any{"svc_ids": ids})
	for _, bad := range []string{`{`, `{"requester":"r"}`, string(b)} {
		if a := del(bad); a.Status != 400 {
			t.Errorf("%.40s: %d", bad, a.Status)
		}
	}
	// Unknown ids without ignore_invalid_id: 400 naming them, nothing marked.
	a := del(`{"user_ids":["alice","nobody"],"svc_ids":[12345],"requester":"ops"}`)
	if a.Status != 400 {
		t.Fatal(a.Status, string(a.Body))
	}
	mustJSON(t, a, map[string]any{"invalid_ids": []string{"12345", "nobody"}})
	list := func(start, end string) answer {
		return apiCall(t, "GET", url+"/api/2/deletions/users?start_day="+start+"&end_day="+end, "proj", nil)
	}
	if a := list("2026-11-22", "2026-12-22"); a.Status != 200 || string(a.Body) != "[]" {
		t.Fatalf("after refused request: %d %s", a.Status, a.Body)
	}
	// With ignore_invalid_id: the found users are scheduled.
	a = del(`{"user_ids":["alice","nobody","carol"],"svc_ids":[` + strconv.FormatInt(SvcID("proj", "bobby"), 10) + `],"requester":"ops","ignore_invalid_id":true,"include_mapped_user_ids":true}`)
	if a.Status != 200 {
		t.Fatal(a.Status, string(a.Body))
	}
	var job deletionJob
	json.Unmarshal(a.Body, &job)
	if job.Day != "2026-11-29" || job.Status != "staging" || len(job.SvcIDs) != 2 || job.SvcIDs[0].UserID != "bobby" || job.SvcIDs[1].UserID != "alice" ||
		job.SvcIDs[0].Requester != "ops" || job.SvcIDs[0].RequestedOnDay != "2026-11-22" ||
		len(job.InvalidIDs) != 2 || job.InvalidIDs[0] != "nobody" || job.InvalidIDs[1] != "carol" {
		t.Fatalf("job %s", a.Body)
	}
	for _, q := range [][2]string{{"", "2026-12-01"}, {"2026-11-01", ""}, {"2026-12-01", "2026-11-01"}, {"2026-01-01", "2026-07-02"}} {
		if a := list(q[0], q[1]); a.Status != 400 {
			t.Errorf("list %v: %d", q, a.Status)
		}
	}
	if a := list("2026-06-01", "2026-12-01"); a.Status != 200 {
		t.Errorf("six months: %d %s", a.Status, a.Body)
	}
	// Cancel bob while more than 3 days before the run.
	bob := strconv.FormatInt(SvcID("proj", "bobby"), 10)
	if a := apiCall(t, "DELETE", url+"/api/2/deletions/users/"+bob+"/2026-11-29", "proj", nil); a.Status != 200 || a.JSON["requester"] != "ops" {
		t.Fatalf("cancel: %d %s", a.Status, a.Body)
	}
	if a := apiCall(t, "DELETE", url+"/api/2/deletions/users/"+bob+"/2026-11-29", "proj", nil); a.Status != 404 {
		t.Errorf("cancel twice: %d", a.Status)
	}
	// 3 days before the run: submitted, no longer cancellable; new requests go to a later job.
	clock.Advance(4*24*time.Hour + time.Hour) // 2026-11-26 13:00
	alice := strconv.FormatInt(SvcID("proj", "alice"), 10)
	if a := apiCall(t, "DELETE", url+"/api/2/deletions/users/"+alice+"/2026-11-29", "proj", nil); a.Status != 400 {
		t.Errorf("cancel when submitted: %d %s", a.Status, a.Body)
	}
	a = del(`{"svc_ids":[` + bob + `],"requester":"ops"}`)
	json.Unmarshal(a.Body, &job)
	if a.Status != 200 || job.Day != "2026-12-03" {
		t.Fatalf("later request: %d %s", a.Status, a.Body)
	}
	var jobs []deletionJob
	json.Unmarshal(list("2026-11-22", "2026-12-22").Body, &jobs)
	if len(jobs) != 2 || jobs[0].Status != "submitted" || len(jobs[0].SvcIDs) != 1 || jobs[1].Status != "staging" {
		t.Fatalf("jobs %+v", jobs)
	}
	clock.Advance(10 * 24 * time.Hour)
	json.Unmarshal(list("2026-11-22", "2026-12-22").Body, &jobs)
	if jobs[0].Status != "done" || jobs[0].ActiveScrubDoneDate != "2026-11-30" {
		t.Fatalf("later: %+v", jobs)
	}
}

// TestDeletionFromOrg: with delete_from_org every api key's users are
// searched, the request's own key first, then the others in the order
// first seen; the answer names the own key's users, or else the first hit.
func TestDeletionFromOrg(t *testing.T) {
	clock := newFakeClock()
	_, url := start(t, Config{Now: clock.Now})
	for _, kv := range [][2]string{{"other", "alice"}, {"third", "carol"}, {"other", "carol"}, {"proj", "alice"}} {
		wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope(kv[0], `{"event_type":"e","user_id":"`+kv[1]+`"}`))
	}
	del := func(users string) answer {
		return apiCall(t, "POST", url+"/api/2/deletions/users", "proj", []byte(`{"user_ids":`+users+`,"requester":"ops","delete_from_org":true}`))
	}
	svc := func(key, user string) string { return strconv.FormatInt(SvcID(key, user), 10) }
	for _, tc := range []struct{ users, want string }{
		{`["carol"]`, svc("other", "carol")},
		{`["alice","nobody"]`, svc("proj", "alice")},
	} {
		a := del(tc.users)
		if a.Status != 200 {
			t.Fatal(a.Status, string(a.Body))
		}
		var got struct {
			SvcIDs []struct {
				SvcID json.Number `json:"svc_id"`
			} `json:"svc_ids"`
			App int64 `json:"app"`
		}
		json.Unmarshal(a.Body, &got)
		if len(got.SvcIDs) != 1 || got.SvcIDs[0].SvcID.String() != tc.want || got.App != appID("proj") {
			t.Errorf("%s: %s, want svc_id %s", tc.users, a.Body, tc.want)
		}
	}
	// Every hit is scheduled in its own project's job.
	for key, want := range map[string]string{"third": svc("third", "carol"), "other": svc("other", "carol") + "," + svc("other", "alice"),
		"proj": svc("proj", "alice")} {
		a := apiCall(t, "GET", url+"/api/2/deletions/users?start_day=2026-11-22&end_day=2026-12-22", key, nil)
		var jobs []deletionJob
		json.Unmarshal(a.Body, &jobs)
		var ids []string
		for _, j := range jobs {
			for _, u := range j.SvcIDs {
				ids = append(ids, strconv.FormatInt(u.SvcID, 10))
			}
		}
		if strings.Join(ids, ",") != want {
			t.Errorf("%s's jobs: %s, want %s", key, a.Body, want)
		}
	}
}
