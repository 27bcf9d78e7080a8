package ingest

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// testRelay is a Server on 127.0.0.1 over a real spool in a temp dir.
type testRelay struct {
	t      testing.TB
	srv    *Server
	sp     *spool.Spool
	reg    *prometheus.Registry
	url    string
	addr   string
	served chan error
	client *http.Client
}

func startRelay(t testing.TB, cfg Config, scfg spool.Config) *testRelay {
	t.Helper()
	if scfg.Dir == "" {
		scfg.Dir = t.TempDir()
	}
	if scfg.MinFreeBytes == 0 {
		scfg.MinFreeBytes = -1 // the test machine's free space is not under test
	}
	reg := prometheus.NewRegistry()
	sp, err := spool.Open(scfg, nil, reg)
	if err != nil {
		t.Fatalf("open spool: %v", err)
	}
	srv, err := New(cfg, spool.NewBackend(sp), event.NewIDGen(), nil, reg)
	if err != nil {
		sp.Close()
		t.Fatalf("New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		sp.Close()
		t.Fatalf("listen: %v", err)
	}
	r := &testRelay{
		t: t, srv: srv, sp: sp, reg: reg,
		addr:   ln.Addr().String(),
		url:    "http://" + ln.Addr().String(),
		served: make(chan error, 1),
		client: &http.Client{
			Timeout:   20 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
		},
	}
	go func() { r.served <- srv.Serve(ln) }()
	t.Cleanup(r.stop)
	return r
}

// stop shuts the server down (once) and closes the spool.
func (r *testRelay) stop() {
	if r.sp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	defer cancel()
	if err := r.srv.Shutdown(ctx); err != nil {
		r.t.Errorf("Shutdown: %v", err)
	}
	select {
	case err := <-r.served:
		if err != nil {
			r.t.Errorf("Serve returned %v after Shutdown, want nil", err)
		}
	case <-time.After(polltest.Max):
		r.t.Errorf("Serve did not return after Shutdown")
	}
	r.client.CloseIdleConnections()
	if err := r.sp.Close(); err != nil {
		r.t.Errorf("close spool: %v", err)
	}
	r.sp = nil
}

// openSpool opens a real spool (noSync) in a temporary directory, closed
// when the test ends.
func openSpool(t testing.TB, noSync bool) *spool.Spool {
	t.Helper()
	sp, err := spool.Open(spool.Config{Dir: t.TempDir(), NoSync: noSync, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	return sp
}

// newServer is a Server (cfg, logging to log; nil: no logs) on a real
// spool (openSpool), not serving: for calls of its handler in process or
// a listener of the test's own.
func newServer(t testing.TB, cfg Config, noSync bool, log *zap.Logger) (*Server, *spool.Spool) {
	t.Helper()
	sp := openSpool(t, noSync)
	s, err := New(cfg, spool.NewBackend(sp), event.NewIDGen(), log, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, sp
}

// serveObserved serves a Server (cfg) on sp, on a listener of its own on
// 127.0.0.1, logging to the observer it returns; it is shut down when the
// test ends (Shutdown may be called before).
func serveObserved(t testing.TB, cfg Config, sp *spool.Spool) (srv *Server, addr string, logs *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	srv, err := New(cfg, spool.NewBackend(sp), event.NewIDGen(), zap.New(core), nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return srv, ln.Addr().String(), logs
}

// inProcessRemote is the client address of the requests a test hands to a
// handler in process (one value: a benchmark's loop allocates none).
var inProcessRemote = &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1234}

// inProcessRequest is a POST of body to path for a handler called in
// process (callInProcess); header holds name, value pairs.
func inProcessRequest(path string, body []byte, header ...string) *fasthttp.Request {
	req := new(fasthttp.Request)
	req.Header.SetMethod("POST")
	req.SetRequestURI(path)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	req.SetBody(body)
	return req
}

// callInProcess has h answer req (from inProcessRemote) into rc.
func callInProcess(h fasthttp.RequestHandler, req *fasthttp.Request, rc *fasthttp.RequestCtx) {
	rc.Init(req, inProcessRemote, nil)
	h(rc)
}

// postParallel posts body to addr's /2/httpapi over real HTTP from
// benchClients concurrent clients, b.N requests in all, each to be
// answered 200 (header holds name, value pairs); the timer runs around the
// posts only.
func postParallel(b *testing.B, addr string, body []byte, header ...string) {
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: 2 * benchClients, ReadTimeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	b.SetParallelism(max(1, benchClients/runtime.GOMAXPROCS(0)))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI("http://" + addr + "/2/httpapi")
		req.Header.SetMethod("POST")
		req.Header.SetContentType("application/json")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		req.SetBodyRaw(body)
		for pb.Next() {
			if err := hc.Do(req, resp); err != nil {
				b.Error(err)
				return
			}
			if resp.StatusCode() != 200 {
				b.Errorf("answer %d %s", resp.StatusCode(), resp.Body())
				return
			}
		}
	})
	b.StopTimer()
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (r *testRelay) post(path string, body []byte, header ...string) answer {
	r.t.Helper()
	return r.do(http.MethodPost, path, body, header...)
}

func (r *testRelay) do(method, path string, body []byte, header ...string) answer {
	r.t.Helper()
	req, err := http.NewRequest(method, r.url+path, bytes.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := r.client.Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatalf("%s %s: read answer: %v", method, path, err)
	}
	return answer{resp.StatusCode, resp.Header, b}
}

// record is a spooled record, copied out of its chunk.
type record struct {
	chunk             uint64
	orderKey, userID  string
	data              []byte
	chunkRecordsCount int
}

// drain reads every chunk of the events lane of (apiKey, options): as many
// records as the lane holds (appended before the requests were answered),
// then stops at once where waiting out a "nothing more" time-out cost
// every call 150 ms. Each read is bounded by polltest.Max.
func (r *testRelay) drain(apiKey, options string) []record {
	r.t.Helper()
	l, err := r.sp.Lane(context.Background(), storage.LaneKey{Kind: storage.KindEvents, APIKey: apiKey, Options: options})
	if err != nil {
		r.t.Fatalf("lane: %v", err)
	}
	var out []record
	for l.Stats().Records > int64(len(out)) {
		ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
		chunks, _, err := l.NextPart(ctx, 64<<20, nil)
		cancel()
		if err != nil {
			r.t.Fatalf("NextPart: %v", err)
		}
		for _, c := range chunks {
			for _, rec := range c.Records {
				out = append(out, record{
					chunk:             c.Seq,
					orderKey:          string(rec.OrderKey),
					userID:            string(rec.UserID),
					data:              bytes.Clone(rec.Data),
					chunkRecordsCount: len(c.Records),
				})
			}
		}
	}
	return out
}

// counter returns the value of a counter of r's registry (0 when absent).
func (r *testRelay) counter(name string, labels ...string) float64 {
	r.t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// histogram returns the sample sum and count of a histogram of r's registry.
func (r *testRelay) histogram(name string) (sum float64, count uint64) {
	r.t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetHistogram().GetSampleSum()
				count += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return sum, count
}

func gz(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// gzipBomb returns one gzip member that inflates to segments MiB of zeros.
// It compresses 1 MiB of zeros twice with sync flushes and repeats the
// second segment's deflate blocks (which only reference the zeros before
// them), so building a 1 GiB bomb costs a few milliseconds.
func gzipBomb(t testing.TB, segments int) []byte {
	t.Helper()
	const seg = 1 << 20
	zeros := make([]byte, seg)
	var raw bytes.Buffer
	fw, err := flate.NewWriter(&raw, flate.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	fw.Write(zeros)
	fw.Flush()
	first := bytes.Clone(raw.Bytes())
	raw.Reset()
	fw.Write(zeros)
	fw.Flush()
	second := bytes.Clone(raw.Bytes())

	var out bytes.Buffer
	out.Write([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff}) // gzip header, no flags
	out.Write(first)
	crc := crc32.Update(0, crc32.IEEETable, zeros)
	for range segments - 1 {
		out.Write(second)
		crc = crc32.Update(crc, crc32.IEEETable, zeros)
	}
	out.Write([]byte{0x03, 0x00}) // final empty fixed-Huffman block
	var tr [8]byte
	binary.LittleEndian.PutUint32(tr[:4], crc)
	binary.LittleEndian.PutUint32(tr[4:], uint32(int64(segments)*seg))
	out.Write(tr[:])
	return out.Bytes()
}

// realisticEvent is an SDK-like event of about 490 bytes.
func realisticEvent(i int) string {
	return fmt.Sprintf(`{"user_id":"user-%06d@example.com","device_id":"dev-%012d","event_type":"Product Viewed","time":1763700000000,"insert_id":"a1b2c3d4-%012d","platform":"Web","os_name":"Chrome","os_version":"131.0.0","language":"en-US","ip":"$remote","country":"United States","city":"Berlin","event_properties":{"product_id":"SKU-%06d","category":"shoes","price":79.99,"currency":"USD","tags":["summer","sale"],"position":%d},"user_properties":{"plan":"growth"},"session_id":1763699990000}`,
		i%100000, i%5000, i, i%1000, i%50)
}

func envelope(apiKey, options string, events ...string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"api_key":%q,"events":[`, apiKey)
	for i, e := range events {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e)
	}
	b.WriteByte(']')
	if options != "" {
		b.WriteString(`,"options":`)
		b.WriteString(options)
	}
	b.WriteByte('}')
	return b.Bytes()
}

func gzipReader(b []byte) (*gzip.Reader, error) { return gzip.NewReader(bytes.NewReader(b)) }

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// clients is the number of client addresses counted.
func (cc *clientConns) clients() int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return len(cc.n)
}
