// Command loadgen is the relay's benchmark load generator: many keep-alive
// connections (fasthttp) posting /2/httpapi envelopes of 1..1000 SDK-shaped
// events (~300-800 bytes each, ~490 on average, nested properties), devices
// drawn from a zipf distribution, one or many api_keys (lanes).
//
// Closed loop (default): every connection sends its next request as soon as
// the previous one is answered; the result is the peak rate. Open loop
// (-rate): requests are sent on a fixed schedule and latency is measured
// from the scheduled send time, so a stalled server is not hidden
// (coordinated omission). Runs are bounded by -duration and/or -requests.
//
// Each request is a pre-built body with its insert_ids and a "sent_us"
// stamp (event_properties.sent_us, microseconds since the epoch) patched in
// place just before sending, so ids are unique per run and bench/sink can
// compute end-to-end lag without parsing JSON.
//
// The last line of output is machine-readable: "RESULT key=value ...".
package main

import (
	"bytes"
	"crypto/tls"
	"flag"
	"fmt"
	"math/rand"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/svcrelay/relay/bench/hist"
	"github.com/valyala/fasthttp"
)

type config struct {
	url       string
	conns     int
	events    int
	duration  time.Duration
	warmup    time.Duration
	requests  int64
	rate      float64
	devices   int
	zipfS     float64
	apiKeys   int
	templates int
	seed      int64
	dumpBody  bool
	timeout   time.Duration
	origin    string // Origin header of every request ("": none), for the CORS cost
}

func main() {
	var c config
	flag.StringVar(&c.url, "url", "http://127.0.0.1:8080/2/httpapi", "target URL")
	flag.IntVar(&c.conns, "c", 32, "connections (= concurrent requests)")
	flag.IntVar(&c.events, "events", 100, "events per request (1..2000)")
	flag.DurationVar(&c.duration, "duration", 10*time.Second, "measured duration (after -warmup); 0: until -requests")
	flag.DurationVar(&c.warmup, "warmup", time.Second, "load sent before measuring starts")
	flag.Int64Var(&c.requests, "requests", 0, "stop after this many requests in total (0: no count bound)")
	flag.Float64Var(&c.rate, "rate", 0, "open loop: requests/s in total (0: closed loop, as fast as answered)")
	flag.IntVar(&c.devices, "devices", 100000, "distinct device_ids")
	flag.Float64Var(&c.zipfS, "zipf", 1.1, "zipf exponent of the device distribution (>1)")
	flag.IntVar(&c.apiKeys, "api-keys", 1, "distinct api_keys (lanes), assigned round-robin to bodies")
	flag.IntVar(&c.templates, "templates", 64, "distinct pre-built bodies (at least -api-keys are built)")
	flag.Int64Var(&c.seed, "seed", 1, "random seed")
	flag.BoolVar(&c.dumpBody, "dump-body", false, "print one request body (for wrk) and exit")
	flag.DurationVar(&c.timeout, "timeout", 10*time.Second, "per-request timeout")
	flag.StringVar(&c.origin, "origin", "", "send this Origin header, as a browser page would (measure the relay's CORS cost with --cors-origins); empty: none")
	flag.Parse()
	if err := c.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	if c.dumpBody {
		t := buildTemplates(c, 1)[0]
		us := uint64(time.Now().UnixMicro())
		for i, off := range t.insertIDs {
			put16(t.body, off, uint64(i+1))
			put16(t.body, t.sentUS[i], us)
		}
		os.Stdout.Write(t.body)
		return
	}
	os.Exit(run(c))
}

func (c *config) validate() error {
	switch {
	case c.conns < 1:
		return fmt.Errorf("-c must be >= 1")
	case c.events < 1 || c.events > 2000:
		return fmt.Errorf("-events must be 1..2000")
	case c.duration <= 0 && c.requests <= 0 && !c.dumpBody:
		return fmt.Errorf("set -duration or -requests (runs are bounded)")
	case c.zipfS <= 1:
		return fmt.Errorf("-zipf must be > 1")
	case c.apiKeys < 1 || c.devices < 1:
		return fmt.Errorf("-api-keys and -devices must be >= 1")
	}
	if c.templates < c.apiKeys {
		c.templates = c.apiKeys
	}
	return nil
}

// template is a pre-built body with the offsets of its patchable fields.
type template struct {
	body      []byte
	insertIDs []int // offsets of 16-digit insert_id counters
	sentUS    []int // offsets of 16-digit sent_us stamps
}

var (
	eventTypes = []string{"Product Viewed", "Add To Cart", "Checkout Started", "Order Completed",
		"Page Viewed", "Search", "Signed In", "Button Clicked", "Video Played", "Session Start"}
	platforms = [][3]string{{"iOS", "ios", "17.5.1"}, {"Android", "android", "14"},
		{"Web", "Chrome", "131.0.0"}, {"Web", "Safari", "18.1"}, {"Web", "Firefox", "133.0"}}
	cities = [][2]string{{"United States", "San Francisco"}, {"Germany", "Berlin"},
		{"France", "Paris"}, {"Japan", "Tokyo"}, {"Brazil", "Sao Paulo"}, {"India", "Bengaluru"}}
	categories = []string{"shoes", "electronics", "books", "garden", "toys", "grocery"}
	words      = strings.Fields("lorem ipsum dolor sit amet consectetur adipiscing elit sed do " +
		"eiusmod tempor incididunt ut labore et dolore magna aliqua enim ad minim veniam")
)

const zeros16 = "0000000000000000"

func apiKey(i int) string { return fmt.Sprintf("b3nch%027x", uint64(i)*0x9e3779b97f4a7c15) }

// buildTemplates builds n bodies of c.events events each.
func buildTemplates(c config, n int) []template {
	r := rand.New(rand.NewSource(c.seed))
	z := rand.NewZipf(r, c.zipfS, 1, uint64(c.devices-1))
	out := make([]template, n)
	for t := range out {
		var b bytes.Buffer
		tp := template{}
		fmt.Fprintf(&b, `{"api_key":"%s","events":[`, apiKey(t%c.apiKeys))
		for e := 0; e < c.events; e++ {
			if e > 0 {
				b.WriteByte(',')
			}
			dev := z.Uint64()
			pl := platforms[dev%uint64(len(platforms))]
			ci := cities[dev%uint64(len(cities))]
			b.WriteByte('{')
			if dev%10 < 7 { // 70% of devices are signed in
				fmt.Fprintf(&b, `"user_id":"user-%08d@example.com",`, dev)
			}
			fmt.Fprintf(&b, `"device_id":"device-%010d","event_type":"%s","time":%d,"insert_id":"lg-%04x-`,
				dev, eventTypes[r.Intn(len(eventTypes))], 1763700000000+r.Int63n(1e8), c.seed&0xffff)
			tp.insertIDs = append(tp.insertIDs, b.Len())
			b.WriteString(zeros16)
			fmt.Fprintf(&b, `","platform":"%s","os_name":"%s","os_version":"%s","ip":"$remote",`, pl[0], pl[1], pl[2])
			if r.Intn(4) > 0 { // a quarter of the events come from SDKs that send no locale or session
				fmt.Fprintf(&b, `"language":"en-US","country":"%s","city":"%s","session_id":%d,`,
					ci[0], ci[1], 1763699990000+int64(dev))
			}
			fmt.Fprintf(&b, `"event_properties":{"product_id":"SKU-%06d","category":"%s","price":%d.%02d,`+
				`"tags":["%s","%s"],"position":%d,"sent_us":`,
				r.Intn(1e6), categories[r.Intn(len(categories))], r.Intn(300), r.Intn(100),
				words[r.Intn(len(words))], words[r.Intn(len(words))], r.Intn(50))
			tp.sentUS = append(tp.sentUS, b.Len())
			b.WriteString(zeros16)
			// A free-text property sized so events spread over ~300..800
			// bytes with a mean near 490.
			pad := int(r.ExpFloat64() * 25)
			if pad > 300 {
				pad = 300
			}
			if pad >= 4 {
				b.WriteString(`,"note":"`)
			}
			for pad >= 4 {
				s := words[r.Intn(len(words))]
				if len(s)+1 > pad {
					s = s[:pad-1]
				}
				b.WriteString(s)
				b.WriteByte(' ')
				pad -= len(s) + 1
			}
			if b.Bytes()[b.Len()-1] == ' ' {
				b.WriteByte('"')
			}
			fmt.Fprintf(&b, `},"user_properties":{"plan":"%s"}}`, []string{"free", "growth", "enterprise"}[dev%3])
		}
		b.WriteString(`]}`)
		tp.body = b.Bytes()
		out[t] = tp
	}
	return out
}

// put16 writes v as 16 zero-padded decimal digits at b[off:].
func put16(b []byte, off int, v uint64) {
	for i := off + 15; i >= off; i-- {
		b[i] = byte('0' + v%10)
		v /= 10
	}
}

type workerStats struct {
	lat     hist.Hist // microseconds
	reqs    int64
	events  int64 // events in 200 answers
	status  map[int]int64
	netErrs map[string]int64
	late    int64 // open loop: sends that started > 1 ms after schedule
}

func run(c config) int {
	u, err := url.Parse(c.url)
	if err != nil || u.Host == "" {
		fmt.Fprintln(os.Stderr, "loadgen: bad -url")
		return 2
	}
	tpls := buildTemplates(c, c.templates)
	var total int
	for _, t := range tpls {
		total += len(t.body) - len(`{"api_key":"","events":[]}`) - 32
	}
	avgEvent := float64(total-len(tpls)*(c.events-1)) / float64(len(tpls)*c.events)

	hc := &fasthttp.HostClient{
		Addr: u.Host,
		// https: the relay under test serves a self-signed certificate
		// (bench/compare.sh's -tls targets); it is not verified.
		IsTLS:               u.Scheme == "https",
		TLSConfig:           &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a benchmark on 127.0.0.1
		MaxConns:            c.conns,
		ReadTimeout:         c.timeout,
		WriteTimeout:        c.timeout,
		MaxIdleConnDuration: time.Minute,
		ReadBufferSize:      16 << 10,
		WriteBufferSize:     64 << 10,
	}
	var sent atomic.Int64
	start := time.Now()
	measureFrom := start.Add(c.warmup)
	var end time.Time
	if c.duration > 0 {
		end = measureFrom.Add(c.duration)
	} else {
		end = start.Add(24 * time.Hour)
	}
	stats := make([]*workerStats, c.conns)
	var wg sync.WaitGroup
	for w := 0; w < c.conns; w++ {
		st := &workerStats{status: map[int]int64{}, netErrs: map[string]int64{}}
		stats[w] = st
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			req := fasthttp.AcquireRequest()
			resp := fasthttp.AcquireResponse()
			req.SetRequestURI(c.url)
			req.Header.SetMethod("POST")
			req.Header.SetContentType("application/json")
			if c.origin != "" {
				req.Header.Set("Origin", c.origin)
			}
			buf := make([]byte, 0, 1<<20)
			var interval time.Duration
			var next time.Time
			if c.rate > 0 {
				interval = time.Duration(float64(time.Second) * float64(c.conns) / c.rate)
				next = start.Add(interval * time.Duration(w) / time.Duration(c.conns))
			}
			idBase := uint64(w) << 40
			var k uint64
			for i := w; ; i += c.conns {
				if c.requests > 0 && sent.Add(1) > c.requests {
					return
				}
				sched := time.Now()
				if c.rate > 0 {
					if d := time.Until(next); d > 0 {
						time.Sleep(d)
					} else if d < -time.Millisecond {
						st.late++
					}
					sched = next
					next = next.Add(interval)
				}
				if !sched.Before(end) {
					return
				}
				t := &tpls[i%len(tpls)]
				buf = append(buf[:0], t.body...)
				for _, off := range t.insertIDs {
					k++
					put16(buf, off, idBase|k)
				}
				us := uint64(time.Now().UnixMicro())
				for _, off := range t.sentUS {
					put16(buf, off, us)
				}
				req.SetBodyRaw(buf)
				err := hc.DoTimeout(req, resp, c.timeout)
				done := time.Now()
				if sched.Before(measureFrom) {
					continue
				}
				st.reqs++
				if err != nil {
					st.netErrs[errKind(err)]++
					continue
				}
				code := resp.StatusCode()
				st.status[code]++
				if code == 200 {
					st.events += int64(c.events)
					st.lat.Record(uint64(done.Sub(sched).Microseconds()))
				}
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(measureFrom)
	var all hist.Hist
	var reqs, events, late int64
	status := map[int]int64{}
	netErrs := map[string]int64{}
	for _, st := range stats {
		all.Merge(&st.lat)
		reqs += st.reqs
		events += st.events
		late += st.late
		for k, v := range st.status {
			status[k] += v
		}
		for k, v := range st.netErrs {
			netErrs[k] += v
		}
	}
	secs := elapsed.Seconds()
	ms := func(us uint64) float64 { return float64(us) / 1000 }
	mode := "closed"
	if c.rate > 0 {
		mode = fmt.Sprintf("open@%.0freq/s", c.rate)
	}
	fmt.Printf("loadgen: %s %s, %d conns, %d events/request (avg %.0f B/event), %d api_keys, %.2fs measured\n",
		c.url, mode, c.conns, c.events, avgEvent, c.apiKeys, secs)
	fmt.Printf("  requests/s %.0f   accepted events/s %.0f\n", float64(status[200])/secs, float64(events)/secs)
	fmt.Printf("  latency ms (200s): p50 %.2f  p90 %.2f  p99 %.2f  p99.9 %.2f  max %.2f\n",
		ms(all.Quantile(.5)), ms(all.Quantile(.9)), ms(all.Quantile(.99)), ms(all.Quantile(.999)), ms(all.Max()))
	var codes []string
	for k, v := range status {
		codes = append(codes, fmt.Sprintf("status_%d=%d", k, v))
	}
	for k, v := range netErrs {
		codes = append(codes, fmt.Sprintf("err_%s=%d", k, v))
	}
	sort.Strings(codes)
	if late > 0 {
		fmt.Printf("  open loop: %d sends started >1ms late (generator or server saturated)\n", late)
	}
	errs := reqs - status[200]
	fmt.Printf("  answers: %s\n", strings.Join(codes, " "))
	fmt.Printf("RESULT reqs=%d req_s=%.0f events=%d events_s=%.0f p50_ms=%.3f p99_ms=%.3f p999_ms=%.3f max_ms=%.3f errors=%d late=%d avg_event_bytes=%.0f secs=%.3f %s\n",
		reqs, float64(status[200])/secs, events, float64(events)/secs, ms(all.Quantile(.5)), ms(all.Quantile(.99)),
		ms(all.Quantile(.999)), ms(all.Max()), errs, late, avgEvent, secs, strings.Join(codes, " "))
	if status[200] == 0 {
		return 1
	}
	return 0
}

func errKind(err error) string {
	s := err.Error()
	switch {
	case strings.Contains(s, "timeout"):
		return "timeout"
	case strings.Contains(s, "refused"):
		return "refused"
	case strings.Contains(s, "reset") || strings.Contains(s, "closed"):
		return "closed"
	}
	return "other"
}
