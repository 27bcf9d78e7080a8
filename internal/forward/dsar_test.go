package forward_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/ratelimit"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

func TestDSARParseRequest(t *testing.T) {
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`{"userId":"u1","startDate":"2026-01-01","endDate":"2026-02-01"}`, true},
		{`{"svcId":123,"startDate":"2026-01-01","endDate":"2026-01-01"}`, true},
		{`{"svcId":0,"startDate":"2026-01-01","endDate":"2026-02-01"}`, false},
		{`{"svcId":"12","startDate":"2026-01-01","endDate":"2026-02-01"}`, false},
		{`{"userId":"","startDate":"2026-01-01","endDate":"2026-02-01"}`, false},
		{`{"userId":"u","startDate":"2026-02-01","endDate":"2026-01-01"}`, false},
		{`{"userId":"u","startDate":"2026-02-01"}`, false},
		{`[]`, false},
	} {
		_, err := forward.ParseDSAR([]byte(tc.body))
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, forward.ErrBadDSAR)) {
			t.Errorf("%s: %v", tc.body, err)
		}
	}
}

func dsarNewAPI(t testing.TB, upstream string, lim ratelimit.Config) forwardtest.Built {
	t.Helper()
	return forwardtest.Build(t, forward.Config{}, dsarTestCreds(t), forward.DSAR(forward.APIConfig{URL: baseurl.NewRef(upstream), Limit: lim}))
}

// TestDSARThroughRelay creates, polls and downloads a DSAR through the
// relay with injected organization credentials; the relay follows the
// output's redirect to the object address with the same credentials.
func TestDSARThroughRelay(t *testing.T) {
	_, up := forwardtest.StartSim(t, sim.Config{})
	forwardtest.Call(t, "POST", up+"/2/httpapi", strings.NewReader(`{"api_key":"proj","events":[{"event_type":"e1","user_id":"alice"},{"event_type":"e2","user_id":"alice"}]}`))
	relay := forwardtest.ServeAdmin(t, dsarNewAPI(t, up, ratelimit.Config{}).Routes())
	inj := []string{"X-Relay-Project: web", "Authorization: Bearer " + forwardtest.AdminToken}
	day := time.Now().UTC().Format(time.DateOnly)

	a := forwardtest.Call(t, "POST", relay+forward.DSARPath, strings.NewReader(`{"userId":"alice","startDate":"2026-13-01","endDate":"2026-01-01"}`), inj...)
	if a.Status != 400 || !bytes.Contains(a.Body, []byte(`"source":"relay"`)) {
		t.Fatalf("bad body: %v", a)
	}
	a = forwardtest.Call(t, "POST", relay+forward.DSARPath, strings.NewReader(`{"userId":"alice","startDate":"`+day+`","endDate":"`+day+`"}`), inj...)
	var c forward.DSARCreated
	if json.Unmarshal(a.Body, &c); a.Status != 202 || c.RequestID == 0 {
		t.Fatalf("create: %v", a)
	}
	id := strconv.FormatInt(c.RequestID, 10)
	var st forward.DSARStatus
	for i := 0; i < 10 && st.Status != forward.DSARDone; i++ {
		a = forwardtest.Call(t, "GET", relay+forward.DSARPath+"/"+id, nil, inj...)
		if a.Status != 200 {
			t.Fatalf("status: %v", a)
		}
		json.Unmarshal(a.Body, &st)
	}
	if st.Status != forward.DSARDone || len(st.URLs) != 1 {
		t.Fatalf("status %+v", st)
	}
	u, _ := url.Parse(st.URLs[0])
	a = forwardtest.Call(t, "GET", relay+u.Path, nil, inj...)
	if a.Status != 200 || a.Header.Get("Content-Type") != "application/gzip" {
		t.Fatalf("output: %v", a)
	}
	zr, err := gzip.NewReader(bytes.NewReader(a.Body))
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := io.ReadAll(zr)
	if lines := strings.Split(strings.TrimSpace(string(plain)), "\n"); len(lines) != 2 || !strings.Contains(lines[0], `"user_id":"alice"`) {
		t.Fatalf("file %q", plain)
	}
	// Pass-through works too (the caller's own org key pair), and a project key is refused by the object store.
	org := "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("org:org-secret"))
	if a := forwardtest.Call(t, "GET", relay+u.Path, nil, org, "Proxy-Authorization: Bearer "+forwardtest.AdminToken); a.Status != 200 {
		t.Errorf("pass-through output: %v", a)
	}
	proj := "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("proj:proj-secret"))
	if a := forwardtest.Call(t, "GET", relay+u.Path, nil, proj, "Proxy-Authorization: Bearer "+forwardtest.AdminToken); a.Status != 403 {
		t.Errorf("other credentials: %v", a)
	}
}

func TestDSARFailedJobPassedBack(t *testing.T) {
	_, up := forwardtest.StartSim(t, sim.Config{})
	one := 1
	(&simtest.Control{Base: up}).SetDSAR(context.Background(), simtest.DSARConfig{PollsToDone: 1, FailNext: &one})
	relay := forwardtest.ServeAdmin(t, dsarNewAPI(t, up, ratelimit.Config{}).Routes())
	inj := []string{"X-Relay-Project: web", "Authorization: Bearer " + forwardtest.AdminToken}
	a := forwardtest.Call(t, "POST", relay+forward.DSARPath, strings.NewReader(`{"svcId":42,"startDate":"2026-01-01","endDate":"2026-01-31"}`), inj...)
	var c forward.DSARCreated
	json.Unmarshal(a.Body, &c)
	a = forwardtest.Call(t, "GET", relay+forward.DSARPath+"/"+strconv.FormatInt(c.RequestID, 10), nil, inj...)
	var st forward.DSARStatus
	if json.Unmarshal(a.Body, &st); st.Status != forward.DSARFailed {
		t.Fatalf("status %v", a)
	}
}

// TestDSARBudget: POST costs 8 and GET 1 against the per-organization
// budget; over it the relay answers 429 with Retry-After and sends nothing.
func TestDSARBudget(t *testing.T) {
	_, up := forwardtest.StartSim(t, sim.Config{})
	relay := forwardtest.ServeAdmin(t, dsarNewAPI(t, up, ratelimit.Config{Limit: 10, MaxWait: -1}).Routes())
	inj := []string{"X-Relay-Project: web", "Authorization: Bearer " + forwardtest.AdminToken}
	body := `{"userId":"u","startDate":"2026-01-01","endDate":"2026-01-31"}`
	if a := forwardtest.Call(t, "POST", relay+forward.DSARPath, strings.NewReader(body), inj...); a.Status != 202 {
		t.Fatalf("first POST: %v", a)
	}
	for i := range 2 {
		if a := forwardtest.Call(t, "GET", relay+forward.DSARPath+"/1000", nil, inj...); a.Status != 200 {
			t.Fatalf("GET %d: %v", i, a)
		}
	}
	a := forwardtest.Call(t, "GET", relay+forward.DSARPath+"/1000", nil, inj...)
	if a.Status != 429 || a.Header.Get("Retry-After") == "" || !bytes.Contains(a.Body, []byte(`"source":"relay"`)) {
		t.Fatalf("over budget: %v %v", a, a.Header)
	}
	if a := forwardtest.Call(t, "POST", relay+forward.DSARPath, strings.NewReader(body), inj...); a.Status != 429 {
		t.Fatalf("POST over budget: %v", a)
	}
}

func FuzzDSARParseRequest(f *testing.F) {
	f.Add([]byte(`{"userId":"u1","startDate":"2026-01-01","endDate":"2026-02-01"}`))
	f.Add([]byte(`{"svcId":1e3,"startDate":"2026-01-01","endDate":"2026-02-01"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := forward.ParseDSAR(b)
		if err == nil && (r.UserID == "" && r.SvcID <= 0 || r.Validate() != nil) {
			t.Fatalf("accepted %+v", r)
		}
		if err != nil && !errors.Is(err, forward.ErrBadDSAR) {
			t.Fatalf("error %v is not ErrBadRequest", err)
		}
	})
}
