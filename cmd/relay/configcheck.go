package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/svcrelay/relay/internal/config"
)

// runConfig is `relay config check [flags]`: load and validate the settings
// (flags, RELAY_* variables, the --config file, the admin token and the
// credentials file) exactly as serving would, without opening the spool or a
// listener; print the effective settings, secrets masked, each with where it
// came from. Exit 0 when valid, 2 when not (the error names the source of the
// bad value).
func runConfig(args, environ []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "check" {
		fmt.Fprintln(stderr, "relay: usage: relay config check [--config FILE] [flags]")
		return exitUsage
	}
	cfg, err := config.Load(args[1:], environ)
	if errors.Is(err, config.ErrHelp) {
		fmt.Fprintln(stderr, "usage: relay config check [--config FILE] [flags]: validate the settings as `relay` would, print them and where each came from")
		config.Usage(stderr)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "relay: config check: %v\n", err)
		return exitUsage
	}
	printConfig(stdout, cfg)
	return exitOK
}

// printConfig writes the effective settings, secrets masked.
func printConfig(w io.Writer, cfg config.Config) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "setting\tvalue\tsource")
	for _, s := range cfg.Settings {
		v := s.Value
		if v == "" {
			v = `""`
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Name, v, cfg.Source(s.Name))
	}
	tw.Flush()
	fmt.Fprintln(w)
	if cfg.Sandbox() {
		fmt.Fprintln(w, "mode: sandbox (no ingest-url: events go to the built-in simulated upstream)")
	} else {
		fmt.Fprintf(w, "mode: upstream %s\n", maskedURL(cfg, "ingest-url"))
	}
	if cfg.Token != nil {
		src := cfg.Source("admin-token")
		if cfg.AdminTokenFile != "" {
			src = cfg.Source("admin-token-file")
		}
		fmt.Fprintf(w, "admin token: set (from %s); every admin route but /healthz, /readyz and /metrics needs it\n", src)
	} else if cfg.AdminInsecureOpen && !config.LoopbackAddr(cfg.AdminListen) {
		fmt.Fprintf(w, "admin token: none, and admin-listen %s is not loopback: every admin route is open to the network (admin-insecure-open, from %s)\n",
			cfg.AdminListen, cfg.Source("admin-insecure-open"))
	} else {
		fmt.Fprintln(w, "admin token: none; every admin route is open to local processes (admin-listen is loopback)")
	}
	if cfg.Creds != nil {
		var ps, os []string
		for _, p := range cfg.Creds.Projects() {
			ps = append(ps, p.Name)
		}
		for _, o := range cfg.Creds.Organizations() {
			os = append(os, o.Name)
		}
		fmt.Fprintf(w, "credentials: %s: %d project(s) [%s], %d organization(s) [%s]\n",
			cfg.Credentials, len(ps), strings.Join(ps, " "), len(os), strings.Join(os, " "))
	}
	for _, warn := range cfg.Warnings {
		fmt.Fprintf(w, "warning: %s\n", warn)
	}
	fmt.Fprintln(w, "configuration OK")
}

func maskedURL(cfg config.Config, name string) string {
	for _, s := range cfg.Settings {
		if s.Name == name {
			return s.Value
		}
	}
	return ""
}
