package forward_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/ratelimit"
	"github.com/svcrelay/relay/internal/sim"
)

func TestDeletionCheckBodyAndDays(t *testing.T) {
	ids := func(n int) string {
		var l []string
		for i := range n {
			l = append(l, fmt.Sprint(i+1))
		}
		return "[" + strings.Join(l, ",") + "]"
	}
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`{"svc_ids":` + ids(100) + `}`, true},
		{`{"svc_ids":` + ids(60) + `,"user_ids":["a","b"]}`, true},
		{`{"svc_ids":` + ids(60) + `,"user_ids":` + strings.ReplaceAll(ids(41), ",", `,`) + `}`, false},
		{`{"svc_ids":` + ids(101) + `}`, false},
		{`{"requester":"r"}`, false},
		{`{"svc_ids":"1"}`, false},
		{`[1]`, false},
	} {
		if err := forward.CheckDeletion([]byte(tc.body)); (err == nil) != tc.ok || (err != nil && !errors.Is(err, forward.ErrBadDeletion)) {
			t.Errorf("%.60s: %v", tc.body, err)
		}
	}
	for _, tc := range []struct {
		start, end string
		ok         bool
	}{
		{"2026-01-01", "2026-07-01", true},
		{"2026-01-31", "2026-07-31", true},
		{"2026-01-01", "2026-07-02", false},
		{"2026-02-01", "2026-01-01", false},
		{"", "2026-01-01", false},
		{"2026-01-01", "2026-1-2", false},
	} {
		if err := forward.CheckDeletionDays(tc.start, tc.end); (err == nil) != tc.ok {
			t.Errorf("%s..%s: %v", tc.start, tc.end, err)
		}
	}
}

func deletionNewAPI(t testing.TB, upstream string, maxWait time.Duration) forwardtest.Built {
	t.Helper()
	return forwardtest.Build(t, forward.Config{}, forwardtest.WebCreds(t), forward.Deletion(forward.APIConfig{URL: baseurl.NewRef(upstream), Limit: ratelimit.Config{MaxWait: maxWait}}))
}

var deletionInj = []string{"X-Relay-Project: web", "Authorization: Bearer " + forwardtest.AdminToken}

func TestDeletionThroughRelay(t *testing.T) {
	_, up := forwardtest.StartSim(t, sim.Config{})
	forwardtest.Call(t, "POST", up+"/2/httpapi", strings.NewReader(`{"api_key":"proj","events":[{"event_type":"e","user_id":"alice"},{"event_type":"e","user_id":"bobby"}]}`))
	relay := forwardtest.ServeAdmin(t, deletionNewAPI(t, up, 0).Routes())
	post := func(body string) forwardtest.Answer {
		return forwardtest.Call(t, "POST", relay+forward.DeletionPath, strings.NewReader(body), deletionInj...)
	}
	// Local refusal: nothing sent.
	if a := post(`{"user_ids":[]}`); a.Status != 400 || !bytes.Contains(a.Body, []byte(`"source":"relay"`)) {
		t.Fatalf("no ids: %v", a)
	}
	// Invalid ids without ignore_invalid_id: the upstream's 400 naming them.
	a := post(`{"user_ids":["alice","ghost"],"requester":"ops"}`)
	if a.Status != 400 || !bytes.Contains(a.Body, []byte(`"invalid_ids":["ghost"]`)) || bytes.Contains(a.Body, []byte(`"source"`)) {
		t.Fatalf("invalid without ignore: %v", a)
	}
	// With it: 200, the found users scheduled, the invalid ones listed.
	a = post(`{"user_ids":["alice","ghost"],"svc_ids":[` + fmt.Sprint(sim.SvcID("proj", "bobby")) + `],"requester":"ops","ignore_invalid_id":true}`)
	var job forward.DeletionJob
	if json.Unmarshal(a.Body, &job); a.Status != 200 || len(job.SvcIDs) != 2 || len(job.InvalidIDs) != 1 || job.Status != "staging" {
		t.Fatalf("invalid with ignore: %v", a)
	}
	today := time.Now().UTC()
	q := "?start_day=" + today.Format(time.DateOnly) + "&end_day=" + today.AddDate(0, 0, forward.DeletionQueryDays).Format(time.DateOnly)
	a = forwardtest.Call(t, "GET", relay+forward.DeletionPath+q, nil, deletionInj...)
	var jobs []forward.DeletionJob
	if json.Unmarshal(a.Body, &jobs); a.Status != 200 || len(jobs) != 1 || jobs[0].Day != job.Day {
		t.Fatalf("list: %v", a)
	}
	if a := forwardtest.Call(t, "GET", relay+forward.DeletionPath+"?start_day=2026-01-01&end_day=2026-08-01", nil, deletionInj...); a.Status != 400 ||
		!bytes.Contains(a.Body, []byte("six months")) {
		t.Fatalf("7 months: %v", a)
	}
	if a := forwardtest.Call(t, "DELETE", relay+forward.DeletionPath+"/x/"+job.Day, nil, deletionInj...); a.Status != 400 {
		t.Fatalf("bad svc_id: %v", a)
	}
	a = forwardtest.Call(t, "DELETE", relay+forward.DeletionPath+fmt.Sprintf("/%d/%s", job.SvcIDs[0].SvcID, job.Day), nil, deletionInj...)
	if a.Status != 200 {
		t.Fatalf("cancel: %v", a)
	}
}

// TestDeletionPacing: POSTs of one project go at most 1 per second (a
// second POST waits for its turn, or with no wait allowed is refused 429
// locally with Retry-After), and at most 8 requests are in flight.
func TestDeletionPacing(t *testing.T) {
	s, up := forwardtest.StartSim(t, sim.Config{})
	forwardtest.Call(t, "POST", up+"/2/httpapi", strings.NewReader(`{"api_key":"proj","events":[{"event_type":"e","user_id":"alice"}]}`))
	body := `{"user_ids":["alice"],"requester":"ops"}`

	relay := forwardtest.ServeAdmin(t, deletionNewAPI(t, up, 5*time.Second).Routes())
	t0 := time.Now()
	for range 2 {
		if a := forwardtest.Call(t, "POST", relay+forward.DeletionPath, strings.NewReader(body), deletionInj...); a.Status != 200 {
			t.Fatalf("POST: %v", a)
		}
	}
	if d := time.Since(t0); d < forward.DeletionPostInterval {
		t.Fatalf("two POSTs took %v, want at least %v", d, forward.DeletionPostInterval)
	}

	noWait := forwardtest.ServeAdmin(t, deletionNewAPI(t, up, -1).Routes())
	forwardtest.Call(t, "POST", noWait+forward.DeletionPath, strings.NewReader(body), deletionInj...)
	a := forwardtest.Call(t, "POST", noWait+forward.DeletionPath, strings.NewReader(body), deletionInj...)
	if a.Status != 429 || a.Header.Get("Retry-After") != "1" || !bytes.Contains(a.Body, []byte(`"source":"relay"`)) {
		t.Fatalf("second POST without waiting: %v %v", a, a.Header)
	}

	// 12 slow GETs at once: never more than 8 at the upstream.
	s.SetLatency(150 * time.Millisecond)
	defer s.SetLatency(0)
	q := "?start_day=2026-01-01&end_day=2026-02-01"
	var wg sync.WaitGroup
	var mu sync.Mutex
	var starts []time.Time
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if a := forwardtest.Call(t, "GET", relay+forward.DeletionPath+q, nil, deletionInj...); a.Status != 200 {
				t.Errorf("GET: %v", a)
			}
			mu.Lock()
			starts = append(starts, time.Now())
			mu.Unlock()
		}()
	}
	wg.Wait()
	reqs := s.Requests()
	var gets []sim.Record
	for _, r := range reqs {
		if r.Method == "GET" && r.Path == forward.DeletionPath {
			gets = append(gets, r)
		}
	}
	if len(gets) != 12 {
		t.Fatalf("%d GETs upstream", len(gets))
	}
	// The request log's times are arrival times: with 150 ms latency and 8
	// in flight, the 9th arrives only after a first one was answered.
	first, ninth := gets[0].Time, gets[8].Time
	if ninth.Sub(first) < 100*time.Millisecond {
		t.Fatalf("9th GET arrived %v after the first: more than 8 in flight", ninth.Sub(first))
	}
}

func FuzzDeletionCheckBody(f *testing.F) {
	f.Add([]byte(`{"svc_ids":[1,2],"user_ids":["a"]}`))
	f.Add([]byte(`{"svc_ids":null,"user_ids":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		err := forward.CheckDeletion(b)
		if err != nil && !errors.Is(err, forward.ErrBadDeletion) {
			t.Fatalf("error %v is not ErrBadRequest", err)
		}
		var r struct {
			SvcIDs  []json.RawMessage `json:"svc_ids"`
			UserIDs []json.RawMessage `json:"user_ids"`
		}
		if err == nil && json.Unmarshal(b, &r) == nil {
			if n := len(r.SvcIDs) + len(r.UserIDs); n < 1 || n > forward.DeletionMaxIDs {
				t.Fatalf("accepted %d ids", n)
			}
		}
	})
}
