// Command spoolopen times spool.Open on an existing spool directory (the
// restart cost with a backlog on disk), with an optional CPU profile, and
// prints the process's RSS split into anonymous and file-backed (mmap) parts.
// The spool must not be held by a running relay.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/spool"
)

func main() {
	dir := flag.String("data-dir", "", "spool directory")
	prof := flag.String("cpuprofile", "", "write a CPU profile of Open to this file")
	verify := flag.Bool("verify", false, "first time spool.Verify (relay spool verify) on the directory")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "spoolopen: -data-dir is required")
		os.Exit(2)
	}
	if *verify {
		t0 := time.Now()
		rep, err := spool.Verify(*dir, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, "spoolopen:", err)
			os.Exit(1)
		}
		fmt.Printf("spool.Verify: %.3fs; %d records, %d bytes, %d damaged; %s\n",
			time.Since(t0).Seconds(), rep.Records, rep.Bytes, rep.Damaged, rss())
	}
	if *prof != "" {
		f, err := os.Create(*prof)
		if err != nil {
			fmt.Fprintln(os.Stderr, "spoolopen:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "spoolopen:", err)
			os.Exit(1)
		}
	}
	t0 := time.Now()
	s, err := spool.Open(spool.Config{Dir: *dir, MinFreeBytes: -1, CompactMinFileBytes: -1}, nil, prometheus.NewRegistry())
	d := time.Since(t0)
	if *prof != "" {
		pprof.StopCPUProfile()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "spoolopen:", err)
		os.Exit(1)
	}
	fmt.Printf("spool.Open: %.3fs; %s\n", d.Seconds(), rss())
	t1 := time.Now()
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "spoolopen: close:", err)
		os.Exit(1)
	}
	fmt.Printf("spool.Close: %.3fs\n", time.Since(t1).Seconds())
}

func rss() string {
	b, _ := os.ReadFile("/proc/self/status")
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS") || strings.HasPrefix(l, "RssAnon") || strings.HasPrefix(l, "RssFile") {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	return strings.Join(out, ", ")
}
