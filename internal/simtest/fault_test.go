package simtest

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/sim/wiretest"
)

func TestFailNextStatuses(t *testing.T) {
	s, url := start(t, sim.Config{})
	for _, st := range []int{500, 502, 503, 504} {
		s.FailNext(2, st)
		for i := 0; i < 2; i++ {
			a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "x")))
			if a.Status != st || a.JSON["code"] != float64(st) {
				t.Fatalf("want %d, got %d %s", st, a.Status, a.Body)
			}
		}
	}
	if s.Count() != 0 {
		t.Fatalf("faulted requests ingested %d", s.Count())
	}
	a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "x")))
	if a.Status != 200 || s.Count() != 1 {
		t.Fatalf("after faults: %d count %d", a.Status, s.Count())
	}
	reqs := s.Requests()
	if len(reqs) != 9 || reqs[0].Status != 500 || reqs[0].Fault != "status" || !slices.Contains(reqs[0].Devices, "device1") || reqs[8].Status != 200 {
		t.Fatalf("log %+v", reqs)
	}
}

func TestFaultNonJSONBodyAndPathPrefix(t *testing.T) {
	s, url := start(t, sim.Config{})
	s.Inject(Fault{Status: 502, Body: []byte("<html>bad gateway</html>"), ContentType: "text/html", PathPrefix: "/batch"})
	a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "x")))
	if a.Status != 200 {
		t.Fatalf("prefix not honoured: %d", a.Status)
	}
	a = wiretest.Post(t, url+"/batch", wiretest.Envelope("k", wiretest.Event("device1", "y")))
	if a.Status != 502 || string(a.Body) != "<html>bad gateway</html>" {
		t.Fatalf("%d %q", a.Status, a.Body)
	}
}

func TestFaultFractionAndUnlimited(t *testing.T) {
	s := NewSeeded(sim.Config{}, nil, 7)
	url, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.Inject(Fault{Status: 503, Count: -1, Fraction: 0.5})
	fails := 0
	for i := 0; i < 40; i++ {
		if wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "x"))).Status == 503 {
			fails++
		}
	}
	if fails < 8 || fails > 32 {
		t.Fatalf("fraction 0.5 failed %d of 40", fails)
	}
	s.ClearFaults()
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "x"))); a.Status != 200 {
		t.Fatalf("after clear: %d", a.Status)
	}
}

func TestLatency(t *testing.T) {
	s, url := start(t, sim.Config{})
	s.SetLatency(150 * time.Millisecond)
	t0 := time.Now()
	wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "x")))
	if d := time.Since(t0); d < 150*time.Millisecond {
		t.Fatalf("latency %v", d)
	}
	s.SetLatency(0)
	s.Inject(Fault{Latency: 100 * time.Millisecond})
	t0 = time.Now()
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "y"))); a.Status != 200 {
		t.Fatalf("latency-only fault changed status: %d", a.Status)
	}
	if d := time.Since(t0); d < 100*time.Millisecond {
		t.Fatalf("fault latency %v", d)
	}
	// Control routes are never delayed (a delayed one would take 10
	// minutes).
	s.SetLatency(10 * time.Minute)
	t0 = time.Now()
	var st map[string]any
	wiretest.GetJSON(t, url+"/sim/stats", &st)
	if d := time.Since(t0); d > polltest.Max {
		t.Fatalf("control route delayed %v", d)
	}
	s.SetLatency(0)
}

func TestDrops(t *testing.T) {
	for _, tc := range []struct {
		mode     DropMode
		ingested int64
	}{{DropNoAnswer, 0}, {DropMidRequest, 0}, {DropAfterIngest, 1}, {DropMidResponse, 1}} {
		t.Run(string(tc.mode), func(t *testing.T) {
			s, url := start(t, sim.Config{})
			s.DropNext(1, tc.mode)
			_, err := wiretest.TryPost(url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "x")))
			if err == nil {
				t.Fatalf("no error from a dropped connection")
			}
			if s.Count() != tc.ingested {
				t.Fatalf("ingested %d, want %d", s.Count(), tc.ingested)
			}
			// The retry: the same insert_id is a duplicate when it was ingested.
			a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "x")))
			if a.Status != 200 || s.Count() != 1 || s.Duplicates() != tc.ingested {
				t.Fatalf("retry: %d count %d dups %d", a.Status, s.Count(), s.Duplicates())
			}
			r := s.Requests()[0]
			if r.Status != 0 || r.Fault != "drop-"+string(tc.mode) {
				t.Fatalf("record %+v", r)
			}
		})
	}
}

func TestMidResponseSendsPartialBody(t *testing.T) {
	s, url := start(t, sim.Config{})
	s.DropNext(1, DropMidResponse)
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := wiretest.Envelope("k", wiretest.Event("device1", "x"))
	c.Write([]byte("POST /2/httpapi HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"))
	c.Write(body)
	c.SetReadDeadline(time.Now().Add(polltest.Max))
	var got bytes.Buffer
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			break
		}
	}
	out := got.String()
	if !strings.HasPrefix(out, "HTTP/1.1 200") || !strings.Contains(out, `{"code":200`) || strings.HasSuffix(out, "}") {
		t.Fatalf("partial answer %q", out)
	}
}

func TestKeepAlive(t *testing.T) {
	s, url := start(t, sim.Config{})
	tr := &http.Transport{MaxIdleConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	for i := 0; i < 5; i++ {
		resp, err := c.Post(url+"/2/httpapi", "application/json", bytes.NewReader(wiretest.Envelope("k", wiretest.Event("device1", strconv.Itoa(i)))))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatal(resp.StatusCode)
		}
	}
	if n := s.Stats().Connections; n != 1 {
		t.Fatalf("5 requests over %d connections", n)
	}
}

// TestFaultsOnAPIRoutes: the management routes (taxonomy here) and the
// data API routes (export) apply the same faults, but for a
// mid-response drop: the management routes drop the connection, the data
// API routes serve and cut the answer after 64 KiB (a short answer stays
// whole).
func TestFaultsOnAPIRoutes(t *testing.T) {
	s, url := start(t, sim.Config{})
	get := func(path string) (int, error) {
		req, _ := http.NewRequest("GET", url+path, nil)
		req.SetBasicAuth("k1", "s1")
		// A new connection each time: net/http sends a GET again when a
		// reused connection closes without an answer.
		resp, err := (&http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		return resp.StatusCode, err
	}
	const mgmt, data = "/api/2/taxonomy/category", "/api/2/export?start=20260101T00&end=20260101T00"
	for _, c := range []struct {
		path  string
		fault Fault
		down  DownMode
		fails bool // the client sees no answer
		code  int  // else the answer's status; 0: any
		rec   string
	}{
		{mgmt, Fault{Status: 502}, "", false, 502, "status"},
		{data, Fault{Status: 502}, "", false, 502, "status"},
		{mgmt, Fault{Drop: DropNoAnswer}, "", true, 0, "drop-no-answer"},
		{data, Fault{Drop: DropNoAnswer}, "", true, 0, "drop-no-answer"},
		{mgmt, Fault{Drop: DropMidResponse}, "", true, 0, "drop-mid-response"},
		{data, Fault{Drop: DropMidResponse}, "", false, 0, "drop-mid-response"},
		{mgmt, Fault{}, Down503, false, 503, "down-503"},
		{data, Fault{}, Down503, false, 503, "down-503"},
	} {
		n := len(s.Requests()) + 1
		if c.down != "" {
			if err := s.Down(c.down, 0); err != nil {
				t.Fatal(err)
			}
		} else {
			s.Inject(c.fault)
		}
		code, err := get(c.path)
		if c.down != "" {
			s.Up()
		}
		// A dropped request is logged after its connection is closed.
		reqs := s.Requests()
		for deadline := time.Now().Add(polltest.Max); len(reqs) < n && time.Now().Before(deadline); reqs = s.Requests() {
			time.Sleep(time.Millisecond)
		}
		if (err != nil) != c.fails || (c.code != 0 && code != c.code) || len(reqs) == 0 || reqs[len(reqs)-1].Fault != c.rec {
			t.Errorf("%s %+v %s: %d %v, logged %+v", c.path, c.fault, c.down, code, err, reqs[len(reqs)-1])
		}
	}
}
