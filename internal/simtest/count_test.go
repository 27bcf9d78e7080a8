package simtest

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/sim/wiretest"
)

func TestCountEvents(t *testing.T) {
	for _, tc := range []struct {
		body string
		want int
	}{
		{`{"api_key":"k","events":[]}`, 0},
		{`{"api_key":"k","events":[ ]}`, 0},
		{`{"api_key":"k","events":[{"a":1}]}`, 1},
		{`{"events":[{"a":[1,2,{"x":","}]},{"b":"]"}, {"c":{"events":[1,2]}}],"api_key":"k"}`, 3},
		{`{"options":{"events":[1,2,3]},"api_key":"k","events":[{"a":1},{"b":2}]}`, 2},
		{`{"api_key":"ev\"ents","events":[{},{},{},{}]}`, 4},
		{`{"api_key":"k","x":"events","y":[1,2],"events":[{}]}`, 1},
		{`not json`, 0},
	} {
		if got := CountEvents([]byte(tc.body)); got != tc.want {
			t.Errorf("CountEvents(%s) = %d, want %d", tc.body, got, tc.want)
		}
	}
}

func FuzzCountEvents(f *testing.F) {
	f.Add([]byte(`{"api_key":"k","events":[{"a":1},{"b":[1,2]}]}`))
	f.Add([]byte(`{"events":[{"s":"\"],"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		n := CountEvents(body)
		var top map[string]json.RawMessage
		var evs []json.RawMessage
		if json.Unmarshal(body, &top) != nil || json.Unmarshal(top["events"], &evs) != nil {
			return
		}
		if bytes.Count(body, []byte(`"events"`)) == 1 && n != len(evs) {
			t.Fatalf("CountEvents = %d, json says %d", n, len(evs))
		}
	})
}

func TestCountOnly(t *testing.T) {
	s, url := start(t, sim.Config{CountOnly: CountEvents})
	// No validation: an event without ids is counted too.
	a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a"), `{"event_type":"x"}`, wiretest.Event("device1", "a")))
	if a.Status != 200 || a.JSON["events_ingested"] != 3.0 {
		t.Fatalf("%d %s", a.Status, a.Body)
	}
	a = wiretest.Post(t, url+"/batch", gz(wiretest.Envelope("k", wiretest.Event("device1", "a"))), "Content-Encoding", "gzip")
	if a.Status != 200 || s.Stats().Counted != 4 || s.Count() != 0 || len(s.AllEvents()) != 0 {
		t.Fatalf("%d counted %d count %d", a.Status, s.Stats().Counted, s.Count())
	}
	var st sim.Stats
	wiretest.GetJSON(t, url+"/sim/stats", &st)
	if st.Counted != 4 {
		t.Fatalf("stats %+v", st)
	}
	s.Inject(Fault{Status: 503}) // faults still apply
	if a := wiretest.Post(t, url+"/2/httpapi", wiretest.Envelope("k", wiretest.Event("device1", "a"))); a.Status != 503 {
		t.Fatal(a.Status)
	}
	big := `{"api_key":"k","events":[{"p":"` + strings.Repeat("x", 1_000_000) + `"}]}`
	if a := wiretest.Post(t, url+"/2/httpapi", []byte(big)); a.Status != 413 {
		t.Fatal(a.Status)
	}
}

func benchBody(n int) []byte {
	evs := make([]string, n)
	for i := range evs {
		evs[i] = fmt.Sprintf(`{"event_type":"purchase","device_id":"device-%04d","user_id":"user-%04d","insert_id":"ins-%08d","time":1700000000000,"event_properties":{"price":9.99,"sku":"abc-123","tags":["a","b"]}}`, i%100, i%100, i)
	}
	return wiretest.Envelope("bench-key", evs...)
}

func BenchmarkCountEvents(b *testing.B) {
	body := benchBody(1000)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		CountEvents(body)
	}
}

// BenchmarkCountOnlyHTTP measures the CountOnly sink over real HTTP
// (1000-event batches, keep-alive, 4 client goroutines).
func BenchmarkCountOnlyHTTP(b *testing.B) {
	s, url := start(b, sim.Config{CountOnly: CountEvents, KeepRequests: -1})
	body := benchBody(1000)
	tr := &http.Transport{MaxIdleConnsPerHost: 8}
	c := &http.Client{Transport: tr}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.SetParallelism(2)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := c.Post(url+"/2/httpapi", "application/json", bytes.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			var buf [256]byte
			resp.Body.Read(buf[:])
			resp.Body.Close()
		}
	})
	b.ReportMetric(float64(s.Stats().Counted)/b.Elapsed().Seconds(), "events/s")
}

func gz(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}
