package simtest

import (
	"errors"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/sim/wiretest"
)

func ctl(t *testing.T, url, path, body string) {
	t.Helper()
	a := wiretest.Post(t, url+path, []byte(body))
	if a.Status != 200 {
		t.Fatalf("POST %s: %d %s", path, a.Status, a.Body)
	}
}

// expectRefused: an open keep-alive connection is cut (a broken connection,
// at most once), then new connections are refused; nothing is answered.
func expectRefused(t *testing.T, url string) {
	t.Helper()
	var err error
	for i := 0; i < 2; i++ {
		_, err = wiretest.TryPost(url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "b")))
		if err == nil {
			t.Fatal("answered while down")
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			return
		}
	}
	t.Fatalf("want connection refused, got %v", err)
}

func TestDownRefuseAndUp(t *testing.T) {
	s, url := start(t, sim.Config{})
	// A keep-alive connection is open before going down.
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a"))); a.Status != 200 {
		t.Fatal(a.Status)
	}
	if err := s.Down(DownRefuse, 0); err != nil {
		t.Fatal(err)
	}
	expectRefused(t, url)
	if err := s.Up(); err != nil {
		t.Fatal(err)
	}
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "b"))); a.Status != 200 {
		t.Fatalf("after up: %d", a.Status)
	}
	if s.Count() != 2 {
		t.Fatalf("count %d", s.Count())
	}
}

func TestDownRefuseOverHTTPComesBack(t *testing.T) {
	s, url := start(t, sim.Config{})
	ctl(t, url, "/sim/down?mode=refuse&for=300ms", "")
	expectRefused(t, url)
	polltest.Until(t, "the sim to come back up after 300 ms", func() bool { return s.IsDown() == "" })
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "b"))); a.Status != 200 {
		t.Fatalf("after coming back: %d", a.Status)
	}
}

func TestServeControlSurvivesRefuse(t *testing.T) {
	s, url := start(t, sim.Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.ServeControl(ln)
	curl := "http://" + ln.Addr().String()
	ctl(t, curl, "/sim/down?mode=refuse", "")
	if _, err := wiretest.TryPost(url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "b"))); err == nil {
		t.Fatal("ingest answered while down")
	}
	ctl(t, curl, "/sim/up", "")
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "b"))); a.Status != 200 {
		t.Fatalf("after up: %d", a.Status)
	}
	// The control listener has only /sim/ routes.
	if a := wiretest.Post(t, curl+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "c"))); a.Status != 404 {
		t.Fatalf("ingest on control listener: %d", a.Status)
	}
}

func TestDown503AndClose(t *testing.T) {
	s, url := start(t, sim.Config{})
	ctl(t, url, "/sim/down?mode=503", "")
	for i := 0; i < 3; i++ {
		a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a")))
		if a.Status != 503 || a.JSON["code"] != 503.0 {
			t.Fatalf("%d %s", a.Status, a.Body)
		}
	}
	var st struct{ Requests int64 }
	wiretest.GetJSON(t, url+"/sim/stats", &st) // control routes still answer
	var fs FaultState
	wiretest.GetJSON(t, url+"/sim/faults", &fs)
	if fs.Down != "503" || st.Requests != 3 {
		t.Fatalf("stats %+v, faults %+v", st, fs)
	}
	ctl(t, url, "/sim/down?mode=close", "")
	if _, err := wiretest.TryPost(url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a"))); err == nil {
		t.Fatal("answer while down=close")
	}
	ctl(t, url, "/sim/up", "")
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a"))); a.Status != 200 {
		t.Fatal(a.Status)
	}
	// The outage is countable in the request log.
	n := 0
	for _, r := range s.Requests() {
		if strings.HasPrefix(r.Fault, "down-") {
			n++
		}
	}
	if n != 4 || s.Count() != 1 {
		t.Fatalf("down requests %d, count %d", n, s.Count())
	}
}

func TestControlRoutes(t *testing.T) {
	s, url := start(t, sim.Config{})
	ctl(t, url, "/sim/fault", `{"status":504,"count":2,"body":"upstream timed out","content_type":"text/plain"}`)
	for i := 0; i < 2; i++ {
		if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a"))); a.Status != 504 || string(a.Body) != "upstream timed out" {
			t.Fatalf("%d %q", a.Status, a.Body)
		}
	}
	ctl(t, url, "/sim/fault", `{"drop":"no-answer"}`)
	if _, err := wiretest.TryPost(url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a"))); err == nil {
		t.Fatal("drop fault answered")
	}
	ctl(t, url, "/sim/fault", `{"status":500,"count":-1}`)
	ctl(t, url, "/sim/faults/clear", "")
	if a := wiretest.Post(t, url+"/sim/fault", []byte(`{"drop":"sideways"}`)); a.Status != 400 {
		t.Fatalf("bad drop mode accepted: %d", a.Status)
	}
	if a := wiretest.Post(t, url+"/sim/fault", []byte(`{"stauts":500}`)); a.Status != 400 {
		t.Fatalf("unknown field accepted: %d", a.Status)
	}
	ctl(t, url, "/sim/latency?d=0s", "")
	ctl(t, url, "/sim/silence?device_id=device1", "")
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a"))); a.Status != 400 || a.JSON["error"] != sim.ErrTextSilenced {
		t.Fatalf("silence over HTTP: %d %s", a.Status, a.Body)
	}
	ctl(t, url, "/sim/unsilence?device_id=device1", "")
	ctl(t, url, "/sim/quota?n=1", "")
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a")))
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "b"))); a.Status != 400 {
		t.Fatalf("quota over HTTP: %d", a.Status)
	}
	ctl(t, url, "/sim/quota?n=0", "")
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("other", wiretest.Event("device2", "c")))

	var evs struct{ Events []sim.Ingested }
	wiretest.GetJSON(t, url+"/sim/events?api_key=k", &evs)
	if len(evs.Events) != 1 || evs.Events[0].InsertID != "a" || string(evs.Events[0].Raw) != wiretest.Event("device1", "a") {
		t.Fatalf("events %+v", evs)
	}
	wiretest.GetJSON(t, url+"/sim/events?after=1", &evs)
	if len(evs.Events) != 1 || evs.Events[0].DeviceID != "device2" {
		t.Fatalf("events after 1 %+v", evs)
	}
	var reqs struct{ Requests []sim.Record }
	wiretest.GetJSON(t, url+"/sim/requests?after=3&limit=2", &reqs)
	if len(reqs.Requests) != 2 || reqs.Requests[0].Seq != 4 {
		t.Fatalf("requests %+v", reqs)
	}
	var st sim.Stats
	wiretest.GetJSON(t, url+"/sim/stats", &st)
	if st.Ingested != 2 || st.ByStatus[504] != 2 || st.ByStatus[0] != 1 || st.IngestedByKey[sim.KeyLabel("k")] != 1 {
		t.Fatalf("stats %+v", st)
	}
	ctl(t, url, "/sim/reset", "")
	if s.Count() != 0 || len(s.Requests()) != 0 || len(s.AllEvents()) != 0 {
		t.Fatal("reset kept state")
	}
	// After reset the insert_id is new again.
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a")))
	if s.Count() != 1 || s.Duplicates() != 0 {
		t.Fatalf("after reset count %d dups %d", s.Count(), s.Duplicates())
	}
	resp, err := client.Get(url + "/sim/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz %v %v", resp, err)
	}
	resp.Body.Close()
}
