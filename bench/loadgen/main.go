// Command loadgen is the relay's benchmark load generator: many keep-alive
// connections (fasthttp) posting /2/httpapi envelopes of 1..2000 events,
// devices drawn from a zipf distribution, one or many api_keys (lanes).
//
// Two body profiles (-profile): "sdk" (the default), events shaped as the
// official SDKs send them (~490 bytes on average, ~250..900: user_id, a UUID
// device_id, session_id, platform, os_name, os_version, language, ip
// "$remote", nested event_properties and user_properties, varied per event;
// no insert_id and no time, which the relay fills), and "small", ~100-byte
// events (device_id, event_type, the send stamp). -insert-ids adds insert_id
// and time to every event, as a server-side sender would.
//
// Closed loop (default): every connection sends its next request as soon as
// the previous one is answered; the result is the peak rate. Open loop
// (-rate): requests are sent on a fixed schedule and latency is measured
// from the scheduled send time, so a stalled server is not hidden
// (coordinated omission). Runs are bounded by -duration and/or -requests.
//
// Each request is a pre-built body (-templates of them, sent in turn) with a
// "sent_us" stamp (event_properties.sent_us, microseconds since the epoch)
// patched in place just before sending, so bench/sink can compute
// end-to-end lag without parsing JSON (with -insert-ids, the insert_ids are
// patched too, unique per run).
//
// The last line of output is machine-readable: "RESULT key=value ...";
// body_bytes and mb_s count the request bodies of 200 answers (MB = 10^6
// bytes), avg_event_bytes the events without their envelope.
package main

import (
	"bytes"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/url"
	"os"
	"path/filepath"
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
	profile   string // profileSDK or profileSmall
	insertIDs bool   // events carry insert_id and time (the SDKs send neither)
	dumpDir   string // write -templates bodies as DIR/body-N.json and exit
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
	flag.StringVar(&c.profile, "profile", profileSDK, "event bodies: sdk (~490 B, shaped as the official SDKs send them, no insert_id or time) or small (~100 B)")
	flag.BoolVar(&c.insertIDs, "insert-ids", false, "give every event an insert_id (unique per run) and a time, as a server-side sender would; the SDKs send neither")
	flag.StringVar(&c.dumpDir, "dump-dir", "", "write -templates request bodies to DIR/body-0.json... (for wrk) and exit")
	flag.StringVar(&c.origin, "origin", "", "send this Origin header, as a browser page would (measure the relay's CORS cost with --cors-origins); empty: none")
	flag.Parse()
	if err := c.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	if c.dumpBody || c.dumpDir != "" {
		if err := dump(c); err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(run(c, os.Stdout))
}

// dump writes one body to stdout (-dump-body) or -templates bodies to
// -dump-dir, stamped with the current time and, with -insert-ids, with
// insert_ids unique across the bodies (a replaying tool such as wrk sends
// each many times: the upstream would drop the repeats as duplicates, the
// relay and bench/sink do not look).
func dump(c config) error {
	n := c.templates
	if c.dumpBody {
		n = 1
	}
	us := uint64(time.Now().UnixMicro())
	var k uint64
	for i, t := range buildTemplates(c, n) {
		for _, off := range t.insertIDs {
			k++
			put16(t.body, off, k)
		}
		for _, off := range t.sentUS {
			put16(t.body, off, us)
		}
		if c.dumpBody {
			_, err := os.Stdout.Write(t.body)
			return err
		}
		if err := os.WriteFile(filepath.Join(c.dumpDir, fmt.Sprintf("body-%d.json", i)), t.body, 0o644); err != nil {
			return fmt.Errorf("dump: %w", err)
		}
	}
	return nil
}

func (c *config) validate() error {
	switch {
	case c.conns < 1:
		return fmt.Errorf("-c must be >= 1")
	case c.events < 1 || c.events > 2000:
		return fmt.Errorf("-events must be 1..2000")
	case c.duration <= 0 && c.requests <= 0 && !c.dumpBody && c.dumpDir == "":
		return fmt.Errorf("set -duration or -requests (runs are bounded)")
	case c.zipfS <= 1:
		return fmt.Errorf("-zipf must be > 1")
	case c.apiKeys < 1 || c.devices < 1:
		return fmt.Errorf("-api-keys and -devices must be >= 1")
	case c.profile != profileSDK && c.profile != profileSmall:
		return fmt.Errorf("-profile must be %s or %s", profileSDK, profileSmall)
	}
	if c.templates < c.apiKeys {
		c.templates = c.apiKeys
	}
	return nil
}

// template is a pre-built body with the offsets of its patchable fields.
type template struct {
	body       []byte
	eventBytes int   // bytes of its events, without the envelope and the commas between them
	insertIDs  []int // offsets of 16-digit insert_id counters (-insert-ids only)
	sentUS     []int // offsets of 16-digit sent_us stamps
}

// Profiles of event bodies (-profile).
const (
	// profileSDK: events as the official SDKs send them, ~490 bytes on
	// average (~250..900): user_id (on 70% of the devices), a UUID
	// device_id, event_type, session_id, platform, os_name, os_version,
	// device_model (mobile), language, ip "$remote", nested
	// event_properties and user_properties, varied per event; no insert_id
	// and no time (the relay fills them).
	profileSDK = "sdk"
	// profileSmall: ~100-byte events (device_id, event_type and the send
	// stamp), the earlier benchmarks' synthetic load.
	profileSmall = "small"
)

var (
	eventTypes = []string{"Product Viewed", "Add To Cart", "Checkout Started", "Order Completed",
		"Page Viewed", "Search", "Signed In", "Button Clicked", "Video Played", "session_start"}
	// platforms: platform, os_name, os_version, device_model ("": a browser).
	platforms = [][4]string{{"iOS", "ios", "17.5.1", "iPhone15,2"}, {"iOS", "ios", "18.1", "iPhone16,1"},
		{"Android", "android", "14", "Pixel 8"}, {"Android", "android", "13", "SM-S911B"},
		{"Web", "Chrome", "131.0.0", ""}, {"Web", "Safari", "18.1", ""}, {"Web", "Firefox", "133.0", ""}}
	// locales: language, country, city.
	locales = [][3]string{{"en-US", "United States", "San Francisco"}, {"de-DE", "Germany", "Berlin"},
		{"fr-FR", "France", "Paris"}, {"ja-JP", "Japan", "Tokyo"}, {"pt-BR", "Brazil", "Sao Paulo"},
		{"en-IN", "India", "Bengaluru"}}
	categories = []string{"shoes", "electronics", "books", "garden", "toys", "grocery"}
	plans      = []string{"free", "growth", "enterprise"}
	referrers  = []string{"https://www.google.com/", "https://t.co/", "https://news.example.org/a/123", ""}
	words      = strings.Fields("lorem ipsum dolor sit amet consectetur adipiscing elit sed do " +
		"eiusmod tempor incididunt ut labore et dolore magna aliqua enim ad minim veniam")
)

// stampUS is a placeholder for the 16-digit sent_us stamp, patched before
// each send (a valid JSON number on its own, for -dump-body).
const stampUS = "1700000000000000"

const zeros16 = "0000000000000000"

func apiKey(i int) string { return fmt.Sprintf("b3nch%027x", uint64(i)*0x9e3779b97f4a7c15) }

// deviceUUID is device dev's id as the SDKs make them: a random UUID
// (derived from dev, so that a device keeps its id).
func deviceUUID(dev uint64) string {
	h := (dev + 1) * 0x9e3779b97f4a7c15
	g := h ^ (h >> 29) ^ 0xbf58476d1ce4e5b9
	return fmt.Sprintf("%08x-%04x-4%03x-%x%03x-%012x", uint32(h>>32), uint16(h>>16), uint16(h)&0xfff,
		8+g%4, uint16(g>>8)&0xfff, (g>>16)&0xffffffffffff)
}

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
			from := b.Len()
			dev := z.Uint64()
			if c.profile == profileSmall {
				writeSmall(&b, r, dev, &tp, c)
			} else {
				writeSDK(&b, r, dev, &tp, c)
			}
			tp.eventBytes += b.Len() - from
		}
		b.WriteString(`]}`)
		tp.body = b.Bytes()
		out[t] = tp
	}
	return out
}

// writeIDs writes the insert_id and time fields of -insert-ids (a
// server-side sender's events; the SDKs send neither) and records the
// insert_id's offset.
func writeIDs(b *bytes.Buffer, r *rand.Rand, tp *template, c config) {
	if !c.insertIDs {
		return
	}
	fmt.Fprintf(b, `"time":%d,"insert_id":"lg-%04x-`, 1763700000000+r.Int63n(1e8), c.seed&0xffff)
	tp.insertIDs = append(tp.insertIDs, b.Len())
	b.WriteString(zeros16 + `",`)
}

// writeStamp writes the sent_us stamp's key and placeholder (the last
// member of event_properties) and records its offset.
func writeStamp(b *bytes.Buffer, tp *template) {
	b.WriteString(`"sent_us":`)
	tp.sentUS = append(tp.sentUS, b.Len())
	b.WriteString(stampUS)
}

// writeSmall writes a ~100-byte event.
func writeSmall(b *bytes.Buffer, r *rand.Rand, dev uint64, tp *template, c config) {
	fmt.Fprintf(b, `{"device_id":"d%09d","event_type":"%s",`, dev, eventTypes[r.Intn(len(eventTypes))])
	writeIDs(b, r, tp, c)
	b.WriteString(`"event_properties":{`)
	writeStamp(b, tp)
	b.WriteString(`}}`)
}

// writeSDK writes an SDK-shaped event.
func writeSDK(b *bytes.Buffer, r *rand.Rand, dev uint64, tp *template, c config) {
	pl := platforms[dev%uint64(len(platforms))]
	lo := locales[(dev/7)%uint64(len(locales))]
	b.WriteByte('{')
	if dev%10 < 7 { // 70% of devices are signed in
		fmt.Fprintf(b, `"user_id":"user-%08d@example.com",`, dev)
	}
	et := eventTypes[r.Intn(len(eventTypes))]
	fmt.Fprintf(b, `"device_id":"%s","event_type":"%s",`, deviceUUID(dev), et)
	writeIDs(b, r, tp, c)
	if r.Intn(8) > 0 { // some SDKs and server-side senders send no session
		fmt.Fprintf(b, `"session_id":%d,`, 1763699990000+int64(dev%100000)*1000+int64(r.Intn(3)*1800000))
	}
	fmt.Fprintf(b, `"platform":"%s","os_name":"%s","os_version":"%s",`, pl[0], pl[1], pl[2])
	if pl[3] != "" {
		fmt.Fprintf(b, `"device_model":"%s",`, pl[3])
	}
	fmt.Fprintf(b, `"language":"%s","ip":"$remote",`, lo[0])
	if pl[0] != "Web" {
		fmt.Fprintf(b, `"app_version":"3.%d.%d",`, dev%12, r.Intn(4))
	}
	// event_properties: a few by event type, a free-text note of an
	// exponentially distributed length (the spread of real bodies), and
	// the send stamp last.
	b.WriteString(`"event_properties":{`)
	switch et {
	case "Product Viewed", "Add To Cart", "Order Completed", "Checkout Started":
		fmt.Fprintf(b, `"product_id":"SKU-%06d","category":"%s","price":%d.%02d,"quantity":%d,"tags":["%s","%s"],`,
			r.Intn(1e6), categories[r.Intn(len(categories))], r.Intn(300), r.Intn(100), 1+r.Intn(3),
			words[r.Intn(len(words))], words[r.Intn(len(words))])
	case "Page Viewed", "session_start":
		fmt.Fprintf(b, `"page_path":"/%s/%s-%d","page_title":"%s %s","referrer":"%s",`,
			categories[r.Intn(len(categories))], words[r.Intn(len(words))], r.Intn(1000),
			words[r.Intn(len(words))], words[r.Intn(len(words))], referrers[r.Intn(len(referrers))])
	case "Search":
		fmt.Fprintf(b, `"query":"%s %s","results":%d,"filters":{"category":"%s","in_stock":%t},`,
			words[r.Intn(len(words))], words[r.Intn(len(words))], r.Intn(200),
			categories[r.Intn(len(categories))], r.Intn(2) == 0)
	default:
		fmt.Fprintf(b, `"screen":"%s","element_id":"btn-%s-%d","position":%d,`,
			words[r.Intn(len(words))], words[r.Intn(len(words))], r.Intn(100), r.Intn(50))
	}
	if pad := min(int(r.ExpFloat64()*24), 400); pad >= 4 {
		b.WriteString(`"note":"`)
		for pad >= 4 {
			s := words[r.Intn(len(words))]
			if len(s)+1 > pad {
				s = s[:pad-1]
			}
			b.WriteString(s)
			b.WriteByte(' ')
			pad -= len(s) + 1
		}
		b.WriteString(`",`)
	}
	writeStamp(b, tp)
	fmt.Fprintf(b, `},"user_properties":{"plan":"%s","signup_cohort":"2026-W%02d","beta":%t}}`,
		plans[dev%3], 1+dev%52, dev%5 == 0)
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
	bytes   int64 // request body bytes of 200 answers
	status  map[int]int64
	netErrs map[string]int64
	late    int64 // open loop: sends that started > 1 ms after schedule
}

func run(c config, w io.Writer) int {
	u, err := url.Parse(c.url)
	if err != nil || u.Host == "" {
		fmt.Fprintln(os.Stderr, "loadgen: bad -url")
		return 2
	}
	tpls := buildTemplates(c, c.templates)
	var total int
	for _, t := range tpls {
		total += t.eventBytes
	}
	avgEvent := float64(total) / float64(len(tpls)*c.events)

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
					st.bytes += int64(len(buf))
					st.lat.Record(uint64(done.Sub(sched).Microseconds()))
				}
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(measureFrom)
	var all hist.Hist
	var reqs, events, bodyBytes, late int64
	status := map[int]int64{}
	netErrs := map[string]int64{}
	for _, st := range stats {
		all.Merge(&st.lat)
		reqs += st.reqs
		events += st.events
		bodyBytes += st.bytes
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
	mbs := float64(bodyBytes) / secs / 1e6
	fmt.Fprintf(w, "loadgen: %s %s, %d conns, %d %s events/request (avg %.0f B/event), %d api_keys, %.2fs measured\n",
		c.url, mode, c.conns, c.events, c.profile, avgEvent, c.apiKeys, secs)
	fmt.Fprintf(w, "  requests/s %.0f   accepted events/s %.0f   request bodies %.1f MB/s\n",
		float64(status[200])/secs, float64(events)/secs, mbs)
	fmt.Fprintf(w, "  latency ms (200s): p50 %.2f  p90 %.2f  p99 %.2f  p99.9 %.2f  max %.2f\n",
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
		fmt.Fprintf(w, "  open loop: %d sends started >1ms late (generator or server saturated)\n", late)
	}
	errs := reqs - status[200]
	fmt.Fprintf(w, "  answers: %s\n", strings.Join(codes, " "))
	fmt.Fprintf(w, "RESULT reqs=%d req_s=%.0f events=%d events_s=%.0f body_bytes=%d mb_s=%.2f profile=%s p50_ms=%.3f p99_ms=%.3f p999_ms=%.3f max_ms=%.3f errors=%d late=%d avg_event_bytes=%.0f secs=%.3f %s\n",
		reqs, float64(status[200])/secs, events, float64(events)/secs, bodyBytes, mbs, c.profile, ms(all.Quantile(.5)), ms(all.Quantile(.99)),
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
