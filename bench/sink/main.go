// Command sink is the peak-rate benchmark's upstream: a fasthttp server that
// answers POST /2/httpapi and /batch with the upstream's 200 body after
// counting the events (see count; no validation, nothing stored), so
// that the upstream is never the bottleneck of a relay or nginx benchmark.
//
// It also measures end-to-end lag: every event_properties.sent_us stamp
// (bench/loadgen's send time, microseconds since the epoch) found in a body
// is subtracted from the arrival time and recorded in a histogram.
//
// A body sent with Content-Encoding: gzip (the relay's --upstream-gzip) is
// decoded before counting, as the upstream would; its decoding costs the
// sink CPU that the target then cannot use (bench/compare.sh's -gzip
// targets measure with this cost in the run). A body that does not decode
// is answered 400.
//
// Control routes: GET /stats (JSON: counted events, requests, first and last
// arrival, lag quantiles), POST /reset, POST /down?on=1|0 (while down every
// request is answered 503, as an upstream outage), POST /lag?on=1|0 (lag
// recording on or off: off, the sink only counts, as a peak-rate run wants;
// the stamp search costs it about 40% more CPU).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/svcrelay/relay/bench/hist"
	"github.com/svcrelay/relay/internal/simtest"
	"github.com/valyala/fasthttp"
)

type sink struct {
	counted   atomic.Int64
	requests  atomic.Int64
	refused   atomic.Int64
	gzipped   atomic.Int64 // requests whose body came gzip-encoded
	badBodies atomic.Int64 // gzip bodies that did not decode (answered 400)
	first     atomic.Int64 // unix ns of the first counted request since reset
	last      atomic.Int64
	down      atomic.Bool
	lagOn     atomic.Bool
	exact     bool // count with simtest.CountEvents instead of by event_type keys

	mu  sync.Mutex
	lag hist.Hist // microseconds
}

var stamp = []byte(`"sent_us":`)

var eventTypeKey = []byte(`"event_type"`)

// count counts body's events. By default it counts "event_type" strings
// (bytes.Count, several GB/s): every event the relay or nginx passes on has
// exactly one such key, and bench/loadgen's property names and values never
// contain it. simtest.CountEvents, exact for any envelope, scans a byte at a
// time; in a peak-rate run it took more of the two cores than nginx did.
func (s *sink) count(body []byte) int {
	if s.exact {
		return simtest.CountEvents(body)
	}
	return bytes.Count(body, eventTypeKey)
}

func (s *sink) handle(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/2/httpapi", "/batch":
		if s.down.Load() {
			s.refused.Add(1)
			ctx.SetStatusCode(503)
			ctx.SetBodyString(`{"code":503,"error":"sink is down"}`)
			return
		}
		body := ctx.PostBody()
		if bytes.EqualFold(ctx.Request.Header.ContentEncoding(), []byte("gzip")) {
			var err error
			if body, err = ctx.Request.BodyGunzip(); err != nil {
				s.badBodies.Add(1)
				ctx.SetStatusCode(400)
				ctx.SetBodyString(`{"code":400,"error":"invalid gzip body"}`)
				return
			}
			s.gzipped.Add(1)
		}
		n := s.count(body)
		now := time.Now()
		s.counted.Add(int64(n))
		s.requests.Add(1)
		s.first.CompareAndSwap(0, now.UnixNano())
		s.last.Store(now.UnixNano())
		if s.lagOn.Load() {
			s.recordLag(body, now.UnixMicro())
		}
		var b [128]byte
		out := append(b[:0], `{"code":200,"events_ingested":`...)
		out = strconv.AppendInt(out, int64(n), 10)
		out = append(out, `,"payload_size_bytes":`...)
		out = strconv.AppendInt(out, int64(len(body)), 10)
		out = append(out, `,"server_upload_time":`...)
		out = strconv.AppendInt(out, now.UnixMilli(), 10)
		out = append(out, '}')
		ctx.SetContentType("application/json")
		ctx.SetBody(out)
	case "/stats":
		s.mu.Lock()
		p50, p99, ln, mx := s.lag.Quantile(.5), s.lag.Quantile(.99), s.lag.Count(), s.lag.Max()
		s.mu.Unlock()
		ctx.SetContentType("application/json")
		fmt.Fprintf(ctx, `{"counted":%d,"requests":%d,"refused":%d,"gzipped":%d,"bad_bodies":%d,"first_ns":%d,"last_ns":%d,"lag_n":%d,"lag_p50_ms":%.3f,"lag_p99_ms":%.3f,"lag_max_ms":%.3f}`+"\n",
			s.counted.Load(), s.requests.Load(), s.refused.Load(), s.gzipped.Load(), s.badBodies.Load(), s.first.Load(), s.last.Load(),
			ln, float64(p50)/1000, float64(p99)/1000, float64(mx)/1000)
	case "/reset":
		s.counted.Store(0)
		s.requests.Store(0)
		s.refused.Store(0)
		s.gzipped.Store(0)
		s.badBodies.Store(0)
		s.first.Store(0)
		s.last.Store(0)
		s.mu.Lock()
		s.lag.Reset()
		s.mu.Unlock()
		ctx.SetBodyString("ok\n")
	case "/down":
		s.down.Store(string(ctx.QueryArgs().Peek("on")) == "1")
		ctx.SetBodyString("ok\n")
	case "/lag":
		s.lagOn.Store(string(ctx.QueryArgs().Peek("on")) == "1")
		ctx.SetBodyString("ok\n")
	default:
		ctx.SetStatusCode(404)
	}
}

// recordLag records now-sent_us for every stamp in body.
func (s *sink) recordLag(body []byte, nowUS int64) {
	var local [64]uint64
	k := 0
	flush := func() {
		s.mu.Lock()
		for _, v := range local[:k] {
			s.lag.Record(v)
		}
		s.mu.Unlock()
		k = 0
	}
	for {
		i := bytes.Index(body, stamp)
		if i < 0 {
			break
		}
		body = body[i+len(stamp):]
		var v int64
		j := 0
		for ; j < len(body) && body[j] >= '0' && body[j] <= '9'; j++ {
			v = v*10 + int64(body[j]-'0')
		}
		body = body[j:]
		if d := nowUS - v; v > 0 && d >= 0 {
			local[k] = uint64(d)
			if k++; k == len(local) {
				flush()
			}
		}
	}
	flush()
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	addrFile := flag.String("addr-file", "", "write the chosen address to this file once listening")
	lag := flag.Bool("lag", true, "record end-to-end lag from event_properties.sent_us stamps")
	exact := flag.Bool("exact", false, "count the events array's elements (a byte-at-a-time scan) instead of event_type keys")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sink:", err)
		os.Exit(1)
	}
	s := &sink{exact: *exact}
	s.lagOn.Store(*lag)
	srv := &fasthttp.Server{
		Handler:            s.handle,
		MaxRequestBodySize: 64 << 20,
		ReadBufferSize:     16 << 10,
		Name:               "bench-sink",
	}
	addr := ln.Addr().String()
	if *addrFile != "" {
		if err := os.WriteFile(*addrFile, []byte(addr), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "sink:", err)
			os.Exit(1)
		}
	}
	fmt.Println("sink listening on", addr)
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, "sink:", err)
		os.Exit(1)
	}
}
