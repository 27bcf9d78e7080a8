package sim

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/sim/wiretest"
)

func TestDSARLifecycle(t *testing.T) {
	clock := newFakeClock()
	s, url := start(t, Config{Now: clock.Now})
	_ = s
	// Events of user alice in two months, of bob in one.
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("proj", `{"event_type":"a1","user_id":"alice"}`, `{"event_type":"b1","user_id":"bobby"}`)); a.Status != 200 {
		t.Fatal(a.Status, string(a.Body))
	}
	clock.Advance(30 * 24 * time.Hour)
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("proj", `{"event_type":"a2","user_id":"alice"}`))

	create := func(body string) answer { return apiCall(t, "POST", url+"/api/2/dsar/requests", "org", []byte(body)) }
	for _, bad := range []string{`{`, `{"startDate":"2026-01-01","endDate":"2026-12-31"}`,
		`{"userId":"alice","startDate":"2026-1-1","endDate":"2026-12-31"}`,
		`{"userId":"alice","startDate":"2026-12-31","endDate":"2026-01-01"}`} {
		if a := create(bad); a.Status != 400 || a.JSON["error"] == nil {
			t.Errorf("%s: %d %s", bad, a.Status, a.Body)
		}
	}
	a := create(`{"userId":"alice","startDate":"2026-11-01","endDate":"2027-01-31"}`)
	if a.Status != 202 {
		t.Fatal(a.Status, string(a.Body))
	}
	id := strconv.FormatInt(int64(a.JSON["requestId"].(float64)), 10)
	status := func() answer { return apiCall(t, "GET", url+"/api/2/dsar/requests/"+id, "org", nil) }
	var states []string
	var last answer
	for range 3 {
		last = status()
		states = append(states, last.JSON["status"].(string))
	}
	if states[0] != "submitted" || states[1] != "processing" || states[2] != "done" {
		t.Fatalf("states %v", states)
	}
	var st struct{ URLs []string }
	json.Unmarshal(last.Body, &st)
	if len(st.URLs) != 2 {
		t.Fatalf("urls %s", last.Body)
	}
	// Another key is refused; the creator follows the redirect with its credentials.
	if a := apiCall(t, "GET", st.URLs[0], "intruder", nil); a.Status != 403 {
		t.Errorf("other credentials: %d", a.Status)
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest("GET", st.URLs[1], nil)
	req.SetBasicAuth("org", "secret")
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != 302 || loc == "" {
		t.Fatalf("output: %d %q", resp.StatusCode, loc)
	}
	// The object address needs the same credentials.
	if r, _ := http.Get(loc); r == nil || r.StatusCode != 401 {
		t.Errorf("object without credentials: %v", r)
	}
	req, _ = http.NewRequest("GET", loc, nil)
	req.SetBasicAuth("org", "secret")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := io.ReadAll(zr)
	var line ExportRecord
	if err := json.Unmarshal(bytes.TrimSpace(plain), &line); err != nil || line.EventType != "a2" || line.UserID != "alice" || line.SvcID != SvcID("proj", "alice") {
		t.Fatalf("file %s: %v", plain, err)
	}
	// The object address expires after 60 s; the urls after URLTTL.
	clock.Advance(61 * time.Second)
	if a := apiCall(t, "GET", loc, "org", nil); a.Status != 403 {
		t.Errorf("expired object: %d", a.Status)
	}
	clock.Advance(48 * time.Hour)
	if a := apiCall(t, "GET", st.URLs[0], "org", nil); a.Status != 410 {
		t.Errorf("expired url: %d", a.Status)
	}

	// A failing job, by svcId.
	s.Knobs(func(k *Knobs) { k.DSARPollsToDone, k.DSARFailNext = 2, 1 })
	a = create(`{"svcId":` + strconv.FormatInt(SvcID("proj", "bobby"), 10) + `,"startDate":"2026-01-01","endDate":"2027-12-31"}`)
	id = strconv.FormatInt(int64(a.JSON["requestId"].(float64)), 10)
	status()
	if a := status(); a.JSON["status"] != "failed" || a.JSON["urls"] != nil {
		t.Fatalf("failing job: %s", a.Body)
	}
	if a := apiCall(t, "GET", url+"/api/2/dsar/requests/99999", "org", nil); a.Status != 404 {
		t.Errorf("unknown job: %d", a.Status)
	}
}
