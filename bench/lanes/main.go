// Command lanes measures what lanes cost a running relay: waves of new
// api_keys (one lane each, one 1-event request per key), then the relay's
// heap, stacks, goroutines and RSS once the lanes are idle (-mode idle) or
// once every lane retired (-mode retire). It reads the relay's admin
// listener (/relay/v1/lanes, /metrics, and /debug/pprof/heap?gc=1 to run a
// GC before each reading) and /proc/PID/status. Bounded: it gives up on a
// wave after -wait.
//
//	lanes -url http://127.0.0.1:8080 -admin http://127.0.0.1:8081 -pid PID -mode retire -keys 10000 -waves 10
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	url := flag.String("url", "http://127.0.0.1:8080", "ingest listener")
	admin := flag.String("admin", "http://127.0.0.1:8081", "admin listener")
	pid := flag.Int("pid", 0, "the relay's process id (for RSS)")
	mode := flag.String("mode", "retire", "retire: wait until every lane retired after each wave; idle: wait until the lanes are delivered and idle")
	keys := flag.Int("keys", 10000, "new api_keys per wave")
	waves := flag.Int("waves", 1, "waves")
	conns := flag.Int("c", 16, "concurrent requests")
	prefix := flag.String("prefix", "k", "api_key prefix (a run's keys are prefix-wave-i)")
	settle := flag.Duration("settle", 3*time.Second, "idle: how long to wait after the last delivery before reading")
	wait := flag.Duration("wait", 10*time.Minute, "give up on a wave after this")
	flag.Parse()
	if *mode != "retire" && *mode != "idle" {
		fmt.Fprintln(os.Stderr, "lanes: -mode retire|idle")
		os.Exit(2)
	}
	cli := &http.Client{Timeout: 30 * time.Second}
	fmt.Printf("start: %s\n", reading(cli, *admin, *pid))
	for w := range *waves {
		t0 := time.Now()
		refused := send(cli, *url, *conns, *keys, func(i int) string { return fmt.Sprintf("%s-%d-%d", *prefix, w, i) })
		sent := time.Since(t0)
		ok := false
		for deadline := time.Now().Add(*wait); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			n, records, err := lanes(cli, *admin)
			if err != nil {
				continue
			}
			if (*mode == "retire" && n == 0) || (*mode == "idle" && records == 0) {
				ok = true
				break
			}
		}
		if !ok {
			fmt.Printf("wave %d: not done within %v\n", w, *wait)
			os.Exit(1)
		}
		if *mode == "idle" {
			time.Sleep(*settle)
		}
		n, _, _ := lanes(cli, *admin)
		fmt.Printf("wave %d: %d keys sent in %.1fs (%d retried for 503), then %d lanes after %.1fs: %s\n",
			w, *keys, sent.Seconds(), refused, n, time.Since(t0).Seconds(), reading(cli, *admin, *pid))
	}
}

// send posts one 1-event request for each of n keys, a 503 (lane limit)
// sent again after a pause; it returns how many were sent again.
func send(cli *http.Client, url string, conns, n int, key func(int) string) int64 {
	var next, retried atomic.Int64
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				body := fmt.Sprintf(`{"api_key":%q,"events":[{"event_type":"e","device_id":"device-%d"}]}`, key(i), i)
				for try := 0; ; try++ {
					resp, err := cli.Post(url+"/2/httpapi", "application/json", strings.NewReader(body))
					if err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode == 200 {
							break
						}
					}
					if try > 600 {
						fmt.Fprintf(os.Stderr, "lanes: key %d not taken: %v\n", i, err)
						os.Exit(1)
					}
					retried.Add(1)
					time.Sleep(500 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	return retried.Load()
}

// lanes returns the relay's lanes and the records they hold.
func lanes(cli *http.Client, admin string) (int, int64, error) {
	resp, err := cli.Get(admin + "/relay/v1/lanes")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var v struct {
		Lanes []struct {
			Records int64 `json:"records"`
		} `json:"lanes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return 0, 0, err
	}
	var n int64
	for _, l := range v.Lanes {
		n += l.Records
	}
	return len(v.Lanes), n, nil
}

// reading runs GCs in the relay, then reads its heap, stacks and
// goroutines from /metrics and its RSS from /proc.
func reading(cli *http.Client, admin string, pid int) string {
	for range 2 { // twice: a sync.Pool's items survive one GC (as its victims)
		if resp, err := cli.Get(admin + "/debug/pprof/heap?gc=1"); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	m := map[string]float64{}
	if resp, err := cli.Get(admin + "/metrics"); err == nil {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			f := bytes.Fields(sc.Bytes())
			if len(f) == 2 {
				v, _ := strconv.ParseFloat(string(f[1]), 64)
				m[string(f[0])] = v
			}
		}
		resp.Body.Close()
	}
	rss := "?"
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
				rss = fmt.Sprintf("%.1f", float64(kb)/1024)
			}
		}
	}
	return fmt.Sprintf("heap_inuse_mib=%.1f heap_alloc_mib=%.1f stack_inuse_mib=%.1f goroutines=%.0f rss_mib=%s",
		m["go_memstats_heap_inuse_bytes"]/(1<<20), m["go_memstats_heap_alloc_bytes"]/(1<<20), m["go_memstats_stack_inuse_bytes"]/(1<<20), m["go_goroutines"], rss)
}
