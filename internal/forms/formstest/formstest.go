// Package formstest is the test slice of a relay around one form-request
// component (internal/groupidentify, internal/usermap): a spool in a temp
// dir, the simulator as the upstream, and the component's routes served over
// real HTTP on 127.0.0.1, reopenable on the same spool directory to test
// durability across restarts.
//
// Invariants: every server, spool, simulator and Run goroutine an Env starts
// is stopped by t.Cleanup (Close is idempotent); every wait is bounded.
package formstest

import (
	"context"
	"encoding/json"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/svcrelay/relay/internal/adminapi"
	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/upstream"
)

// Component is a form-request route with its delivery.
type Component interface {
	Routes() []adminroute.Route
	Run(ctx context.Context) error
	Ready() error
}

// Build makes the component on an open spool; simURL is the simulator's
// base, reg a fresh registry of this Open.
type Build[C Component] func(simURL string, sp *spool.Spool, client *upstream.Client, reg *prometheus.Registry) (C, error)

// Env is a relay slice around one component C.
type Env[C Component] struct {
	T      *testing.T
	Dir    string // the spool directory, kept across Close and Open
	Sim    *simtest.Sim
	SimURL string
	Spool  *spool.Spool
	C      C                    // the component of the last Open
	Reg    *prometheus.Registry // the registry of the last Open
	Base   string               // the routes' base URL, "http://127.0.0.1:P"

	kind    storage.Kind
	build   Build[C]
	srv     *adminapi.Server
	cancel  context.CancelFunc
	runDone chan error
}

// New starts a simulator (simCfg) and Opens the component (without
// delivery: see Run). kind is the spool lane kind of the component's
// records (LaneRecords).
func New[C Component](t *testing.T, simCfg sim.Config, kind storage.Kind, build Build[C]) *Env[C] {
	t.Helper()
	e := &Env[C]{T: t, Dir: t.TempDir(), kind: kind, build: build}
	e.Sim = simtest.New(simCfg, nil)
	u, err := e.Sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.SimURL = u
	t.Cleanup(func() { e.Sim.Close() })
	e.Open()
	return e
}

// Open opens the spool, builds the component and serves its routes
// on the admin listener (internal/adminapi, no admin token), without
// delivery.
func (e *Env[C]) Open() {
	t := e.T
	sp, err := spool.Open(spool.Config{Dir: e.Dir, NoSync: true, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Spool = sp
	client, err := upstream.New(upstream.Config{Timeout: 5 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.Reg = prometheus.NewRegistry()
	c, err := e.build(e.SimURL, sp, client, e.Reg)
	if err != nil {
		t.Fatal(err)
	}
	e.C = c
	// The real admin listener, without an admin token.
	e.srv, err = adminapi.New(adminapi.Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Register(c.Routes()...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go e.srv.Serve(ln)
	e.Base = "http://" + ln.Addr().String()
	t.Cleanup(e.Close)
}

// Run starts delivery (the component's Run) and waits until it is Ready.
func (e *Env[C]) Run() {
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	e.runDone = make(chan error, 1)
	go func() { e.runDone <- e.C.Run(ctx) }()
	polltest.Until(e.T, "Ready", func() bool { return e.C.Ready() == nil })
}

// Close stops delivery, the server and the spool (idempotent). Run
// returning an error fails the test.
func (e *Env[C]) Close() {
	if e.cancel != nil {
		e.cancel()
		if err := <-e.runDone; err != nil {
			e.T.Errorf("Run: %v", err)
		}
		e.cancel = nil
	}
	if e.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		e.srv.Shutdown(ctx)
		cancel()
		e.srv = nil
	}
	if e.Spool != nil {
		e.Spool.Close()
		e.Spool = nil
	}
}

// LaneRecords is the number of unacknowledged records of the lane of apiKey
// (0 when there is no such lane).
func (e *Env[C]) LaneRecords(apiKey string) int64 {
	for _, l := range e.Spool.Lanes() {
		if l.Key() == (storage.LaneKey{Kind: e.kind, APIKey: apiKey}) {
			return l.Stats().Records
		}
	}
	return 0
}

// WaitFor polls cond until it holds, failing the test after timeout or
// polltest.Max, whichever is longer: the bound only decides how long a failing
// test takes, and the 10 or 15 s its callers name could be reached on a
// loaded CI machine under -race.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	polltest.Within(t, max(timeout, polltest.Max), what, cond)
}

// Answer is an HTTP answer read in full; JSON is its body decoded when it
// is a JSON object.
type Answer struct {
	Status int
	Body   string
	JSON   map[string]any
	CT     string // Content-Type
}

// Do sends method to u, with form as a form body when not nil and headers
// as name, value pairs, and reads the answer (20 s at most).
func Do(t testing.TB, method, u string, form url.Values, hdr ...string) Answer {
	t.Helper()
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(u)
	req.Header.SetMethod(method)
	if form != nil {
		req.Header.SetContentType("application/x-www-form-urlencoded")
		req.SetBodyString(form.Encode())
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	if err := fasthttp.DoTimeout(req, resp, 20*time.Second); err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	a := Answer{Status: resp.StatusCode(), Body: string(resp.Body()), CT: string(resp.Header.ContentType())}
	json.Unmarshal(resp.Body(), &a.JSON)
	return a
}
