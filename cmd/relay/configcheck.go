package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/operator"
)

// runConfig is `relay config check [flags]`: load and validate the settings
// exactly as serving would, without opening the spool or a listener, and
// print them (secrets masked) with where each came from; exit 0 when valid,
// 2 when not. With --diff it prints instead what a reload of the relay
// serving at --admin (default: the settings' admin-listen) would change.
func runConfig(args, environ []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "check" {
		fmt.Fprintln(stderr, "relay: usage: relay config check [--diff [--admin URL] [--token-file F]] [--config FILE] [flags]")
		return exitUsage
	}
	var diff bool
	var admin, tokenFile string // the running relay --diff compares with
	cfg, err := config.Load(args[1:], environ, func(fs *flag.FlagSet) {
		fs.BoolVar(&diff, "diff", false, "")
		fs.StringVar(&admin, "admin", "", "")
		fs.StringVar(&tokenFile, "token-file", "", "")
	})
	if errors.Is(err, config.ErrHelp) {
		fmt.Fprintln(stderr, "usage: relay config check [--config FILE] [flags]: validate the settings as `relay` would, print them and where each came from")
		config.Usage(stderr)
		return exitOK
	}
	if err == nil && !diff && (admin != "" || tokenFile != "") {
		err = errors.New("--admin and --token-file go with --diff")
	}
	if err != nil {
		fmt.Fprintf(stderr, "relay: config check: %v\n", err)
		return exitUsage
	}
	if diff {
		if err := printDiff(admin, tokenFile, cfg, environ, stdout); err != nil {
			fmt.Fprintf(stderr, "relay: config check --diff: %v\n", err)
			if errors.As(err, new(operator.UsageError)) {
				return exitUsage
			}
			return exitFailure
		}
		return exitOK
	}
	printConfig(stdout, cfg)
	return exitOK
}

// printDiff prints what a reload of the relay at admin would change to cfg.
// Without --admin, the relay is the one cfg describes: its admin-listen,
// and its admin token unless --token-file or RELAY_ADMIN_TOKEN gives one.
func printDiff(admin, tokenFile string, cfg config.Config, environ []string, stdout io.Writer) error {
	if admin == "" {
		admin = "http://" + cfg.AdminListen
		if cfg.AdminTLSCert != "" {
			admin = "https://" + cfg.AdminListen
		}
	}
	token := envValue(environ, "RELAY_ADMIN_TOKEN")
	if token == "" && tokenFile == "" {
		token, tokenFile = cfg.AdminToken, cfg.AdminTokenFile
	}
	if token == "" && tokenFile != "" {
		var err error
		if token, err = readToken(tokenFile); err != nil {
			return err
		}
	}
	resp, err := adminGet(context.Background(), &http.Client{Timeout: 30 * time.Second}, admin, "/relay/v1/config", token)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var cur struct {
		Settings []inForce `json:"settings"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&cur); err != nil {
		return err
	}
	old := map[string]inForce{}
	for _, s := range cur.Settings {
		old[s.Name] = s
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "setting\tin force\tafter reload\tsource\tapplies")
	n := 0
	for _, s := range settingsInForce(cfg) {
		o := old[s.Name]
		if o.Value == s.Value && o.Digest == s.Digest {
			continue
		}
		n++
		applies := "needs a restart (kept)"
		if config.Live(s.Name) {
			applies = "live"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, o.Value, s.Value, s.Source, applies)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "%d setting(s) would change; the credentials and token files are read again by every reload\n", n)
	return nil
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
		fmt.Fprintf(w, "mode: upstream %s\n", config.MaskURL(cfg.IngestURL))
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
		ps, os := cfg.Creds.Names()
		fmt.Fprintf(w, "credentials: %s: %d project(s) [%s], %d organization(s) [%s]\n",
			cfg.Credentials, len(ps), strings.Join(ps, " "), len(os), strings.Join(os, " "))
	}
	for _, warn := range cfg.Warnings {
		fmt.Fprintf(w, "warning: %s\n", warn)
	}
	fmt.Fprintln(w, "configuration OK")
}
