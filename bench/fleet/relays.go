package main

// Relay mode (-relays 1,2,3): the whole path, process by process. For each
// relay count N and each spool (-spools fleet,local) it starts N relay
// processes (built from ./cmd/relay) delivering to a counting sink
// (bench/sink); for the fleet, a fresh 3-node cluster of nats-server
// processes (built at go.mod's version, sync_interval always with
// -sync-always) that the relays share with --spool nats://...; for local,
// each relay its own --data-dir spool. A closed-loop load of -conns
// connections, spread round-robin over the relays, posts -events events of
// about -event-bytes each (device ids from -devices) for -warmup, then
// -duration measured. It reports, per run: accepted events/s and request
// body MB/s (10^6 bytes), accept latency (p50, p99: the time to a 200),
// and CPU seconds per million accepted events of the relays and of the
// NATS servers (utime+stime from /proc/PID/stat over the measured window,
// delivery included). Everything binds 127.0.0.1.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/svcrelay/relay/bench/hist"
	"github.com/svcrelay/relay/internal/natstest"
)

type relayOpts struct {
	relays     []int
	spools     []string
	conns      int
	warmup     time.Duration
	duration   time.Duration
	events     int
	eventBytes int
	devices    int
	keys       int
	padX       bool // pad events with one letter (compresses far better than real events)
	partitions int
	streams    int
	syncAlways bool
	keep       bool
	rounds     int
	profile    string        // a directory: CPU profiles of the NATS nodes and the first relay over the measured window
	colocate   bool          // the relays connect to n1 only, and the events stream's and consumers' leaders are moved there
	relayEnv   []string      // added to the relays' environment (GOMAXPROCS=2, ...)
	idle       time.Duration // measure the processes' CPU without load for this long first (0: not)
}

// tool is a built binary.
type tools struct{ relay, nats, sink, dir string }

func build(dir string) (tools, error) {
	t := tools{relay: filepath.Join(dir, "relay"), nats: filepath.Join(dir, "nats-server"), sink: filepath.Join(dir, "sink"), dir: dir}
	for _, b := range [][2]string{
		{t.relay, "github.com/svcrelay/relay/cmd/relay"},
		{t.nats, "github.com/nats-io/nats-server/v2"},
		{t.sink, "github.com/svcrelay/relay/bench/sink"},
	} {
		if out, err := exec.Command("go", "build", "-o", b[0], b[1]).CombinedOutput(); err != nil {
			return t, fmt.Errorf("go build %s: %v\n%s", b[1], err, out)
		}
	}
	return t, nil
}

// proc is a started process, killed by stop.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startProc(bin, logPath string, args ...string) (*proc, error) {
	return startProcEnv(nil, bin, logPath, args...)
}

// startProcEnv is startProc with env added to this process's environment.
func startProcEnv(env []string, bin, logPath string, args ...string) (*proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) stop() {
	p.cmd.Process.Kill()
	<-p.done
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// cpuTicks is the process's utime+stime in clock ticks (USER_HZ, 100 on
// Linux).
func (p *proc) cpuTicks() int64 { return pidTicks(p.cmd.Process.Pid) }

func pidTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces) in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

const userHZ = 100

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitOK polls url until 200 or the deadline.
func waitOK(url string, within time.Duration, p *proc) error {
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if p != nil && p.exited() {
			return fmt.Errorf("%s: the process exited", url)
		}
		if resp, err := hc.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s: not 200 within %v", url, within)
}

// startNATS starts a 3-node cluster under dir and returns its processes and
// the --spool URL.
func startNATS(t tools, dir string, syncAlways bool, profPorts []int) ([]*proc, natstest.Layout, error) {
	lay, err := natstest.NewLayout(3)
	if err != nil {
		return nil, lay, err
	}
	var sync []string
	if syncAlways {
		sync = []string{"sync_interval: always"}
	}
	var procs []*proc
	for i, n := range lay.Nodes {
		path := filepath.Join(dir, n.Name+".conf")
		conf := lay.Conf(i, "bench", filepath.Join(dir, n.Name), sync...)
		if profPorts != nil {
			conf = fmt.Sprintf("prof_port: %d\n", profPorts[i]) + conf
		}
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			return procs, lay, err
		}
		p, err := startProc(t.nats, filepath.Join(dir, n.Name+".log"), "-c", path)
		if err != nil {
			return procs, lay, err
		}
		procs = append(procs, p)
	}
	for i, p := range procs {
		if err := waitOK(fmt.Sprintf("http://127.0.0.1:%d/healthz", lay.Nodes[i].Monitor), 60*time.Second, p); err != nil {
			return procs, lay, err
		}
	}
	return procs, lay, nil
}

// colocate moves the events stream's leader to node (whose client URL is
// url) and waits until it is there: with the relays connected to that node
// only, no publish crosses a route but the Raft traffic itself. The
// partition consumers have one replica each, without a leader to move:
// the server places each on a node of its choosing, so a delivery may
// still cross a route.
func colocate(url, node string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	body := []byte(`{"placement":{"preferred":"` + node + `"}}`)
	type info struct {
		Cluster struct {
			Leader string `json:"leader"`
		} `json:"cluster"`
	}
	subjects := []string{"STREAM.LEADER.STEPDOWN.RELAY_EVENTS"}
	infos := []string{"STREAM.INFO.RELAY_EVENTS"}
	deadline := time.Now().Add(90 * time.Second)
	for i := range subjects {
		for {
			resp, err := nc.Request("$JS.API."+infos[i], nil, 5*time.Second)
			var in info
			if err == nil && json.Unmarshal(resp.Data, &in) == nil && in.Cluster.Leader == node {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("colocate: %s: leader %q, want %s", infos[i], in.Cluster.Leader, node)
			}
			nc.Request("$JS.API."+subjects[i], body, 5*time.Second) //nolint:errcheck // checked by the next info
			time.Sleep(500 * time.Millisecond)
		}
	}
	return nil
}

// runRelays runs every (spool, relay count) of o and prints a table.
func runRelays(o relayOpts) error {
	dir, err := os.MkdirTemp("", "bench-fleet-relays-")
	if err != nil {
		return err
	}
	if !o.keep {
		defer os.RemoveAll(dir)
	} else {
		fmt.Println("logs and stores kept in", dir)
	}
	t, err := build(dir)
	if err != nil {
		return err
	}
	sinkAddrFile := filepath.Join(dir, "sink.addr")
	sink, err := startProc(t.sink, filepath.Join(dir, "sink.log"), "-lag=false", "-addr-file", sinkAddrFile)
	if err != nil {
		return err
	}
	defer sink.stop()
	var sinkAddr []byte
	for range 200 {
		if sinkAddr, err = os.ReadFile(sinkAddrFile); err == nil && len(sinkAddr) > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(sinkAddr) == 0 {
		return errors.New("sink did not start")
	}
	fmt.Printf("load: %d connections, %d events of ~%d B (padding %s) per request, %d device(s) per request out of %d, warm-up %v, measured %v; NATS sync_interval always=%v, P=%d; %d round(s), interleaved\n\n",
		o.conns, o.events, o.eventBytes, map[bool]string{true: "x", false: "props"}[o.padX], o.keys, o.devices, o.warmup, o.duration, o.syncAlways, o.partitions, o.rounds)
	fmt.Println("| round | spool | relays | events/s | MB/s | accept p50 | accept p99 | relay CPU s/M events | NATS CPU s/M events | errors | events stream leaders per node | requests per batch | load + sink CPU s/M events |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	type key struct {
		spool string
		n     int
	}
	all := make(map[key][]result)
	var keys []key
	for round := 1; round <= o.rounds; round++ {
		// Interleaved: every configuration once per round, so that a load
		// from elsewhere on the machine touches all of them alike.
		for _, n := range o.relays {
			for _, spool := range o.spools {
				r, err := runOne(o, t, filepath.Join(dir, fmt.Sprintf("%s-%d-r%d", spool, n, round)), sink, "http://"+string(sinkAddr), spool, n)
				if err != nil {
					return fmt.Errorf("%s x %d: %w", spool, n, err)
				}
				k := key{spool, n}
				if all[k] == nil {
					keys = append(keys, k)
				}
				all[k] = append(all[k], r)
				fmt.Printf("| %d %s\n", round, r.row())
			}
		}
	}
	if o.rounds > 1 {
		fmt.Printf("\nmedians of %d rounds:\n\n", o.rounds)
		fmt.Println("| spool | relays | events/s | MB/s | accept p50 | accept p99 | relay CPU s/M events | NATS CPU s/M events | errors | events stream leaders per node (last round) | requests per batch | load + sink CPU s/M events |")
		fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
		for _, k := range keys {
			fmt.Println(median(all[k]).row())
		}
	}
	return nil
}

// result is one run's figures.
type result struct {
	spool             string
	relays            int
	eps, mbps         float64
	p50, p99          uint64  // µs
	relayCPU, natsCPU float64 // s per million events (0: none)
	loadCPU           float64 // this process's (the HTTP load) and the sink's, s per million events
	errs              int64
	leaders           string
	perBatch          float64 // requests' parts per published batch (fleet)
}

func (r result) row() string {
	cpu := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("| %s | %d | %.0f | %.1f | %s | %s | %s | %s | %d | %s | %s | %s |", r.spool, r.relays, r.eps, r.mbps,
		us(r.p50), us(r.p99), cpu(r.relayCPU), cpu(r.natsCPU), r.errs, r.leaders, cpu(r.perBatch), cpu(r.loadCPU))
}

// median is the field-by-field median of rs (the upper one of an even
// count); leaders are the last run's.
func median(rs []result) result {
	m := rs[len(rs)-1]
	med := func(get func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = get(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	m.eps = med(func(r result) float64 { return r.eps })
	m.mbps = med(func(r result) float64 { return r.mbps })
	m.p50 = uint64(med(func(r result) float64 { return float64(r.p50) }))
	m.p99 = uint64(med(func(r result) float64 { return float64(r.p99) }))
	m.relayCPU = med(func(r result) float64 { return r.relayCPU })
	m.natsCPU = med(func(r result) float64 { return r.natsCPU })
	m.errs = int64(med(func(r result) float64 { return float64(r.errs) }))
	m.perBatch = med(func(r result) float64 { return r.perBatch })
	m.loadCPU = med(func(r result) float64 { return r.loadCPU })
	return m
}

func runOne(o relayOpts, t tools, dir string, sink *proc, sinkURL, spool string, n int) (result, error) {
	res := result{spool: spool, relays: n, leaders: "-"}
	var node natstest.NodeAddr // -colocate's
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return res, err
	}
	var natsProcs []*proc
	var profPorts, monitors []int
	if o.profile != "" && spool == "fleet" {
		for range 3 {
			pp, err := freePort()
			if err != nil {
				return res, err
			}
			profPorts = append(profPorts, pp)
		}
	}
	spoolArgs := []string{"--spool", "local"}
	if spool == "fleet" {
		procs, lay, err := startNATS(t, dir, o.syncAlways, profPorts)
		natsProcs = procs
		for _, nd := range lay.Nodes {
			monitors = append(monitors, nd.Monitor)
		}
		url := lay.SpoolURL()
		if o.colocate {
			node = lay.Nodes[0]
			url = fmt.Sprintf("nats://127.0.0.1:%d", node.Port)
		}
		defer func() {
			for _, p := range natsProcs {
				p.stop()
			}
		}()
		if err != nil {
			return res, err
		}
		spoolArgs = []string{"--spool", url, "--spool-partitions", strconv.Itoa(o.partitions), "--spool-streams", strconv.Itoa(o.streams)}
	}
	var relays []*proc
	var listens, admins []string
	defer func() {
		for _, p := range relays {
			p.stop()
		}
	}()
	for i := range n {
		lp, err := freePort()
		if err != nil {
			return res, err
		}
		ap, err := freePort()
		if err != nil {
			return res, err
		}
		listen, admin := fmt.Sprintf("127.0.0.1:%d", lp), fmt.Sprintf("127.0.0.1:%d", ap)
		args := append([]string{"--listen", listen, "--admin-listen", admin, "--ingest-url", sinkURL,
			"--data-dir", filepath.Join(dir, fmt.Sprintf("relay%d", i)), "--spool-min-free-bytes", "0",
			"--log-format", "json", "--log-level", "warn"}, spoolArgs...)
		p, err := startProcEnv(o.relayEnv, t.relay, filepath.Join(dir, fmt.Sprintf("relay%d.log", i)), args...)
		if err != nil {
			return res, err
		}
		relays = append(relays, p)
		// One at a time: the first creates the fleet's streams.
		if err := waitOK("http://"+listen+"/healthz", 90*time.Second, p); err != nil {
			return res, err
		}
		listens, admins = append(listens, listen), append(admins, admin)
	}
	if spool == "fleet" {
		// events and group identify: these relays have no usermap upstream,
		// so they take none of its partitions (fleet membership is per kind).
		if err := waitSpread(admins, 2*o.partitions, 60*time.Second); err != nil {
			return res, err
		}
		if o.colocate {
			if err := colocate(fmt.Sprintf("nats://127.0.0.1:%d", node.Port), node.Name); err != nil {
				return res, err
			}
		}
		res.leaders = leaders(admins[0])
	}

	ticks := func(ps []*proc) (s int64) {
		for _, p := range ps {
			s += p.cpuTicks()
		}
		return s
	}
	if o.idle > 0 {
		// What the processes cost without a request: leases, heartbeats,
		// pulls, timers. Paid per second, not per event.
		r0, n0, t0 := ticks(relays), ticks(natsProcs), time.Now()
		time.Sleep(o.idle)
		el := time.Since(t0).Seconds()
		r1, n1 := ticks(relays), ticks(natsProcs)
		fmt.Printf("# idle, %s x %d: relays %.1f%%, NATS %.1f%% of a core\n", spool, n,
			float64(r1-r0)/userHZ/el*100, float64(n1-n0)/userHZ/el*100)
	}
	var (
		measuring atomic.Bool
		accepted  atomic.Int64
		bodyBytes atomic.Int64
		errs      atomic.Int64
		mu        sync.Mutex
		lat       hist.Hist
	)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for c := range o.conns {
		wg.Go(func() {
			hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			target := "http://" + listens[c%len(listens)] + "/2/httpapi"
			var h hist.Hist
			for k := 0; ctx.Err() == nil; k++ {
				body := requestBody(o, c, k)
				t0 := time.Now()
				resp, err := hc.Post(target, "application/json", bytes.NewReader(body))
				ok := false
				if err == nil {
					var b bytes.Buffer
					b.ReadFrom(resp.Body)
					resp.Body.Close()
					ok = resp.StatusCode == 200 && bytes.Contains(b.Bytes(), []byte(`"code":200`))
				}
				if !measuring.Load() {
					continue
				}
				if !ok {
					errs.Add(1)
					continue
				}
				h.Record(uint64(time.Since(t0).Microseconds()))
				accepted.Add(int64(o.events))
				bodyBytes.Add(int64(len(body)))
			}
			mu.Lock()
			lat.Merge(&h)
			mu.Unlock()
		})
	}
	time.Sleep(o.warmup) // load before the measured window, not synchronisation
	// The load is this process (and the sink it delivers to): on a
	// machine of few cores it takes its share of them too.
	load := func() int64 { return pidTicks(os.Getpid()) + sink.cpuTicks() }
	r0, n0, l0 := ticks(relays), ticks(natsProcs), load()
	v0, tr0 := varz(monitors), readTraffic(monitors)
	measuring.Store(true)
	t0 := time.Now()
	var profs sync.WaitGroup
	if o.profile != "" {
		secs := max(int(o.duration.Seconds())-1, 1)
		// Every relay: with more relays each one's share of the work
		// differs (the owner of a partition reads what the others publish).
		urls := make(map[string]string)
		for i, a := range admins {
			urls[fmt.Sprintf("%s-%d-relay%d", spool, n, i)] = fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", a, secs)
		}
		for i, pp := range profPorts {
			urls[fmt.Sprintf("nats-%d-n%d", n, i+1)] = fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", pp, secs)
		}
		for name, u := range urls {
			profs.Go(func() {
				if err := fetchTo(u, filepath.Join(o.profile, fmt.Sprintf("%s-%d.pprof", name, time.Now().Unix()))); err != nil {
					fmt.Fprintln(os.Stderr, "profile:", err)
				}
			})
		}
	}
	time.Sleep(o.duration)
	measuring.Store(false)
	el := time.Since(t0).Seconds()
	r1, n1, l1 := ticks(relays), ticks(natsProcs), load()
	if v1 := varz(monitors); len(monitors) > 0 && accepted.Load() > 0 {
		// The nodes' message traffic (clients, routes, Raft) per request
		// accepted: what grows with the publishes and deliveries per event.
		reqs := float64(accepted.Load()) / float64(o.events)
		fmt.Printf("# nats, %s x %d: per request in_msgs %.2f out_msgs %.2f in_bytes %.0f out_bytes %.0f\n", spool, n,
			float64(v1[0]-v0[0])/reqs, float64(v1[1]-v0[1])/reqs, float64(v1[2]-v0[2])/reqs, float64(v1[3]-v0[3])/reqs)
		fmt.Printf("# nats, %s x %d: per request %s\n", spool, n, trafficLine(tr0, readTraffic(monitors), reqs))
	}
	profs.Wait()
	cancel()
	wg.Wait()
	if spool == "fleet" {
		hc := &http.Client{Timeout: 2 * time.Second}
		var parts, batches int
		for _, a := range admins {
			parts += scrape(hc, "http://"+a+"/metrics", "relay_fleet_batch_requests_sum")
			batches += scrape(hc, "http://"+a+"/metrics", "relay_fleet_batch_requests_count")
		}
		if batches > 0 {
			res.perBatch = float64(parts) / float64(batches)
		}
	}

	evs := float64(accepted.Load())
	perM := func(d int64) float64 {
		if evs == 0 {
			return 0
		}
		return float64(d) / userHZ / (evs / 1e6)
	}
	res.eps, res.mbps = evs/el, float64(bodyBytes.Load())/el/1e6
	res.p50, res.p99 = lat.Quantile(0.5), lat.Quantile(0.99)
	res.relayCPU, res.natsCPU, res.loadCPU, res.errs = perM(r1-r0), perM(n1-n0), perM(l1-l0), errs.Load()
	return res, nil
}

// requestBody is connection c's k-th request: o.events events of o.keys
// devices (1: an SDK's request) out of o.devices, padded to about
// o.eventBytes. The padding is properties ("p07":"3f9a0c1e") with random
// values unless o.padX, so that the fleet's compressed messages shrink
// about as real events do (S2 halves them), not as a run of one letter
// does (-pad x, the body of the earlier rounds).
func requestBody(o relayOpts, c, k int) []byte {
	var b bytes.Buffer
	n := max(o.eventBytes-110, 0)
	var pad string
	if o.padX {
		pad = strings.Repeat("x", n)
	}
	rng := rand.New(rand.NewPCG(uint64(c), uint64(k)))
	b.WriteString(`{"api_key":"bench-fleet","events":[`)
	for i := range o.events {
		if i > 0 {
			b.WriteByte(',')
		}
		dev := (c*7919 + k*o.keys + i%o.keys) % o.devices
		if o.padX {
			fmt.Fprintf(&b, `{"event_type":"bench","device_id":"device-%06d","event_properties":{"n":%d,"p":"%s"}}`, dev, k, pad)
			continue
		}
		fmt.Fprintf(&b, `{"event_type":"bench","device_id":"device-%06d","event_properties":{"n":%d`, dev, k)
		for j := 0; j*17 < n; j++ {
			fmt.Fprintf(&b, `,"p%02d":"%08x"`, j, rng.Uint32())
		}
		b.WriteString("}}")
	}
	b.WriteString("]}")
	return b.Bytes()
}

// waitSpread waits until the relays own want partitions between them, each
// some.
func waitSpread(admins []string, want int, within time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		sum, each := 0, true
		for _, a := range admins {
			v := scrape(hc, "http://"+a+"/metrics", "relay_fleet_partitions_owned")
			sum += v
			each = each && v > 0
		}
		if sum == want && each {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("partitions not spread over %d relays within %v", len(admins), within)
}

// scrape reads an unlabelled gauge's value (0 when absent).
func scrape(hc *http.Client, url, name string) int {
	resp, err := hc.Get(url)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	for line := range strings.SplitSeq(b.String(), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(f)
		}
	}
	return 0
}

// leaders asks a relay's /readyz (which reads the events streams' leaders)
// and returns its relay_fleet_stream_leaders series as "n1:1 n2:1 n3:1".
func leaders(admin string) string {
	hc := &http.Client{Timeout: 2 * time.Second}
	if resp, err := hc.Get("http://" + admin + "/readyz"); err == nil {
		resp.Body.Close()
	}
	resp, err := hc.Get("http://" + admin + "/metrics")
	if err != nil {
		return "?"
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	var out []string
	for line := range strings.SplitSeq(b.String(), "\n") {
		if v, ok := strings.CutPrefix(line, `relay_fleet_stream_leaders{node="`); ok {
			node, val, _ := strings.Cut(v, `"} `)
			out = append(out, node+":"+strings.TrimSpace(val))
		}
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// varz sums the nodes' /varz in_msgs, out_msgs, in_bytes, out_bytes.
func varz(monitors []int) (v [4]int64) {
	hc := &http.Client{Timeout: 2 * time.Second}
	for _, m := range monitors {
		var z struct {
			InMsgs   int64 `json:"in_msgs"`
			OutMsgs  int64 `json:"out_msgs"`
			InBytes  int64 `json:"in_bytes"`
			OutBytes int64 `json:"out_bytes"`
		}
		_ = getJSON(hc, fmt.Sprintf("http://127.0.0.1:%d/varz", m), &z) // a failed read shows as zero
		v[0], v[1], v[2], v[3] = v[0]+z.InMsgs, v[1]+z.OutMsgs, v[2]+z.InBytes, v[3]+z.OutBytes
	}
	return v
}

// fetchTo saves url's body (a profile) in path.
func fetchTo(url, path string) error {
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.ReadFrom(resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
