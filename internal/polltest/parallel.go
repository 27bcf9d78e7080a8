package polltest

import (
	"flag"
	"strconv"
)

// SetParallel sets how many parallel tests (t.Parallel) of the test binary
// run at once to n, unless the command line set it (-parallel). go test's
// default is GOMAXPROCS, two on the team's machine: right for tests that
// keep the CPU busy, too few for tests that spend their time waiting on
// leases, timers, a cluster or another process. Call it from TestMain,
// before m.Run.
func SetParallel(n int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
			panic(err)
		}
	}
}
