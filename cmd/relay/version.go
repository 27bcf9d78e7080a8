package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// versionString describes the build: module version, VCS revision and time
// (stamped by go build in a git checkout), Go version.
func versionString() string {
	v, rev, when, dirty := "(devel)", "unknown", "", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = " " + s.Value
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "+dirty"
				}
			}
		}
	}
	return fmt.Sprintf("relay %s revision %s%s%s %s %s/%s", v, rev, dirty, when, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
