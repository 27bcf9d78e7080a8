package forward_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/forward"
	ft "github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/sim"
)

// TestExportWiredOnAdminListener registers the four data-moving APIs on the real
// admin listener as cmd/relay does (one forwarder, one registry): no route
// or metric clash, the ModeForward token check applies, and each reaches
// the simulator with the credentials its scheme needs.
func TestExportWiredOnAdminListener(t *testing.T) {
	s, up := ft.StartSim(t, sim.Config{})
	creds := ft.ParseCreds(t, ft.WebOrgCredsYAML)
	reg := prometheus.NewRegistry()
	c := forward.APIConfig{URL: baseurl.NewRef(up)}
	base := ft.ServeWired(t, reg, creds, forward.Feedback(forward.APIConfig{URL: baseurl.NewRef(up)}), forward.DSAR(c), forward.Deletion(c), forward.Export(forward.APIConfig{URL: baseurl.NewRef(up)}))
	http.Post(up+"/2/httpapi", "application/json", strings.NewReader(`{"api_key":"proj","events":[{"event_type":"e","user_id":"alice"}]}`))
	hour := time.Now().UTC().Format(forward.ExportHourFormat)
	day := time.Now().UTC().Format(time.DateOnly)

	for _, c := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", forward.FeedbackPath, `{"source_id":"s","items":[{"unique_id":"a","body":"b"}]}`, 200},
		{"POST", forward.DSARPath, `{"userId":"alice","startDate":"` + day + `","endDate":"` + day + `"}`, 202},
		{"GET", forward.DSARPath + "/1000", "", 200},
		{"POST", forward.DeletionPath, `{"user_ids":["alice"],"requester":"ops"}`, 200},
		{"GET", forward.DeletionPath + "?start_day=" + day + "&end_day=" + day, "", 200},
		{"GET", forward.ExportPath + "?start=" + hour + "&end=" + hour, "", 200},
	} {
		do := func(hdr ...string) (int, string) {
			req, _ := http.NewRequest(c.method, base+c.path, strings.NewReader(c.body))
			for i := 0; i+1 < len(hdr); i += 2 {
				req.Header.Set(hdr[i], hdr[i+1])
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode, string(b)
		}
		if st, b := do("X-Relay-Project", "web", "Authorization", "Bearer "+ft.AdminToken); st != c.want {
			t.Errorf("%s %s: %d %s", c.method, c.path, st, b)
		}
		if st, _ := do(); st != 401 {
			t.Errorf("%s %s without token: %d", c.method, c.path, st)
		}
		if st, _ := do("Proxy-Authorization", "Bearer wrong"); st != 403 {
			t.Errorf("%s %s with a wrong token: %d", c.method, c.path, st)
		}
	}
	// The sim's request log carries only labels of the api keys: check the
	// schemes through what each route needs (project or organization key).
	labels := map[string]string{}
	for _, r := range s.Requests() {
		labels[r.Method+" "+r.Path] = r.KeyLabel
	}
	for path, key := range map[string]string{"POST " + forward.FeedbackPath: "proj", "POST " + forward.DSARPath: "org",
		"POST " + forward.DeletionPath: "proj", "GET " + forward.ExportPath: "proj"} {
		if labels[path] != sim.KeyLabel(key) {
			t.Errorf("%s reached the sim with key %q, want %s's", path, labels[path], key)
		}
	}
	mfs, _ := reg.Gather()
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	for _, want := range []string{"relay_forward_requests_total", "relay_client_limit_admitted_total"} {
		if !strings.Contains(strings.Join(names, " "), want) {
			t.Errorf("metric %s missing from %v", want, names)
		}
	}
}
