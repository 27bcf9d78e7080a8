package upstream

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/internal/storage"
)

func startSim(t *testing.T, cfg sim.Config) (*simtest.Sim, string) {
	t.Helper()
	s := simtest.New(cfg, nil)
	url, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, url
}

func newClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	c, err := New(cfg, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const testBody = `{"api_key":"k","events":[{"event_type":"e","device_id":"device-1","insert_id":"i1"},{"event_type":"e","device_id":"device-2","insert_id":"i2"}]}`

func TestClientAgainstSim(t *testing.T) {
	s, url := startSim(t, sim.Config{})
	c := newClient(t, Config{Timeout: polltest.Max})
	ctx := context.Background()

	for _, gz := range []bool{false, true} {
		r := c.Do(ctx, &Request{URL: url + "/2/httpapi", Body: []byte(testBody), Gzip: gz})
		if r.Kind != OK || r.Status != 200 {
			t.Fatalf("gzip=%v: %+v", gz, r)
		}
	}
	reqs := s.Requests()
	if len(reqs) != 2 || reqs[0].Gzip || !reqs[1].Gzip || reqs[1].BodyBytes != len(testBody) {
		t.Fatalf("requests %+v", reqs)
	}
	if s.Count() != 2 || s.Duplicates() != 2 {
		t.Fatalf("ingested %d dup %d", s.Count(), s.Duplicates())
	}

	r := c.Do(ctx, &Request{URL: url + "/2/httpapi", Body: []byte(`{"api_key":"k","events":[{"device_id":"device-1"}]}`)})
	if r.Kind != Invalid || r.InvalidEvents[0] != "missing_fields" {
		t.Fatalf("%+v", r)
	}

	s.FailNext(1, 503)
	if r := c.Do(ctx, &Request{URL: url + "/2/httpapi", Body: []byte(testBody)}); r.Kind != Retryable || r.Status != 503 {
		t.Fatalf("%+v", r)
	}
	for _, mode := range []simtest.DropMode{simtest.DropNoAnswer, simtest.DropMidResponse, simtest.DropAfterIngest} {
		s.DropNext(1, mode)
		if r := c.Do(ctx, &Request{URL: url + "/2/httpapi", Body: []byte(testBody)}); r.Kind != Retryable || r.Status != 0 || r.Err == nil {
			t.Fatalf("%s: %+v", mode, r)
		}
	}
	if r := c.Do(ctx, &Request{URL: url + "/nope", Body: []byte(testBody)}); r.Kind != Fatal {
		t.Fatalf("wrong path: %+v", r)
	}
}

func TestClientTimeoutAndAbandon(t *testing.T) {
	s, url := startSim(t, sim.Config{})
	// The sim holds each request 10 minutes (or until the client gives up):
	// a client that did not time out or abandon takes that long, a right one
	// about 200 or 100 ms; polltest.Max bounds tell them apart on any machine.
	s.SetLatency(10 * time.Minute)
	c := newClient(t, Config{Timeout: 200 * time.Millisecond})
	start := time.Now()
	r := c.Do(context.Background(), &Request{URL: url + "/2/httpapi", Body: []byte(testBody)})
	if r.Kind != Retryable || r.StatusLabel() != "timeout" || time.Since(start) > polltest.Max {
		t.Fatalf("%+v after %v", r, time.Since(start))
	}

	c = newClient(t, Config{Timeout: 10 * time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start = time.Now()
	r = c.Do(ctx, &Request{URL: url + "/2/httpapi", Body: []byte(testBody)})
	if r.Kind != Retryable || time.Since(start) > polltest.Max {
		t.Fatalf("abandon: %+v after %v", r, time.Since(start))
	}
}

func TestClientRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := newClient(t, Config{Timeout: time.Second})
	if r := c.Do(context.Background(), &Request{URL: "http://" + addr + "/2/httpapi", Body: []byte(testBody)}); r.Kind != Retryable || r.Err == nil {
		t.Fatalf("%+v", r)
	}
	if r := c.Do(context.Background(), &Request{URL: "http://no-such-host.invalid/2/httpapi", Body: []byte(testBody)}); r.Kind != Retryable || r.Err == nil {
		t.Fatalf("dns: %+v", r)
	}
}

// TestClientLeaseEnded: a request whose lease ran out after the sender's
// own check (a process stopped past its lease while compressing the body)
// is not sent; one whose lease holds is.
func TestClientLeaseEnded(t *testing.T) {
	var got atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		w.Write([]byte(`{"code":200}`)) //nolint:errcheck // the test reads the count
	})}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	c := newClient(t, Config{Timeout: polltest.Max})
	req := &Request{URL: "http://" + ln.Addr().String() + "/2/httpapi", Body: []byte(testBody), Gzip: true}
	var held atomic.Bool
	ctx := storage.WithLease(context.Background(), held.Load)
	if r := c.Do(ctx, req); r.Kind != Retryable || !errors.Is(r.Err, errLeaseEnded) || got.Load() != 0 {
		t.Fatalf("lease run out: %+v, %d requests received, want none", r, got.Load())
	}
	held.Store(true)
	if r := c.Do(ctx, req); r.Kind != OK || got.Load() != 1 {
		t.Fatalf("lease held: %+v, %d requests received, want 1", r, got.Load())
	}
}
