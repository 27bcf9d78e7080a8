package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// version and revision may be stamped at link time (-ldflags "-X
// main.version=v1.2.3 -X main.revision=<commit>", as deploy/image.sh does);
// empty means what go build recorded: the module version ("(devel)" in a
// checkout) and the VCS revision when it stamped one.
var version, revision string

// build describes the running binary.
type build struct {
	Version   string // module version, or "(devel)"
	Revision  string // VCS revision (+"+dirty" when modified), or "unknown"
	Time      string // VCS commit time, or ""
	GoVersion string
}

// readBuild reads the build's version: module version, VCS revision and time
// (stamped by go build in a git checkout), Go version.
func readBuild() build {
	b := build{Version: "(devel)", Revision: "unknown", GoVersion: runtime.Version()}
	dirty := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			b.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Revision = s.Value
			case "vcs.time":
				b.Time = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "+dirty"
				}
			}
		}
	}
	if version != "" {
		b.Version = version
	}
	if revision != "" {
		b.Revision, dirty = revision, ""
	}
	if b.Revision != "unknown" {
		b.Revision += dirty
	}
	return b
}

// versionString describes the build on one line (relay version, --version).
func versionString() string {
	b := readBuild()
	when := ""
	if b.Time != "" {
		when = " " + b.Time
	}
	return fmt.Sprintf("relay %s revision %s%s %s %s/%s", b.Version, b.Revision, when, b.GoVersion, runtime.GOOS, runtime.GOARCH)
}

// buildInfo is relay_build_info{version,revision,goversion}, always 1: join
// it to other series to see which build is running, and alert on its
// changes across a fleet.
func buildInfo() prometheus.Gauge {
	b := readBuild()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "relay_build_info",
		Help:        "Always 1; the labels describe the running build.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	g.Set(1)
	return g
}
