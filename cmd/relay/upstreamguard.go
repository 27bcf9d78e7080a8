package main

import (
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/spool"
)

// sandboxUpstream is the identity the spool stores for sandbox mode (the
// simulator's address changes at every start).
const sandboxUpstream = "sandbox"

// upstreamIdentity is what the spool remembers of the upstream its records
// are accepted for: the ingest URL without a trailing slash, or "sandbox".
func upstreamIdentity(ingestURL string) string {
	if ingestURL == "" {
		return sandboxUpstream
	}
	return strings.TrimRight(ingestURL, "/")
}

// errUpstreamChanged is returned by guardSpoolUpstream when records wait for
// another upstream and the change is not allowed.
var errUpstreamChanged = errors.New("spool upstream changed")

// guardSpoolUpstream stops a start whose upstream (id) differs from the one
// the spool's waiting records were accepted for — a production relay
// restarted without its --ingest-url would otherwise deliver its backlog to
// the sandbox simulator and delete it — unless allow. Otherwise (no record
// waits, or allowed) it stores id as the spool's upstream.
func guardSpoolUpstream(sp *spool.Spool, id string, allow bool, log *zap.Logger) error {
	prev := sp.Stats().Upstream
	if prev == id {
		return nil
	}
	var waiting int64
	for _, l := range sp.Lanes() {
		waiting += l.Stats().Records
	}
	ask := prev // how to ask for prev on the command line
	if prev == sandboxUpstream {
		ask = `"" (sandbox mode)`
	}
	switch {
	case prev == "" || waiting == 0:
		// A spool from before the guard, or nothing waits: nothing to
		// protect.
	case !allow:
		return fmt.Errorf("%w: the spool holds %d undelivered records accepted for upstream %q, but this start would deliver them to %q; start with --ingest-url %s, or give --spool-upstream-change=allow to send them there",
			errUpstreamChanged, waiting, prev, id, ask)
	default:
		log.Warn("delivering records waiting in the spool to another upstream than they were accepted for (--spool-upstream-change=allow)",
			zap.Int64("records", waiting), zap.String("accepted_for", prev), zap.String("upstream", id))
	}
	return sp.SetUpstream(id)
}

// reloadUpstreamGuard is what a reload that changes --ingest-url passes
// before anything is put in force: the guard of a start with the new URL
// and the new --spool-upstream-change, so records waiting for the old
// upstream are never sent to the new one unless allowed (the reload is
// refused whole otherwise). Records accepted while the reload runs are the
// new upstream's.
func reloadUpstreamGuard(sp *spool.Spool, log *zap.Logger) func(cur, next config.Config) error {
	return func(cur, next config.Config) error {
		id := upstreamIdentity(next.IngestURL)
		if !config.LiveFrom(cur, next, "ingest-url") || id == upstreamIdentity(cur.IngestURL) {
			return nil
		}
		if err := guardSpoolUpstream(sp, id, next.SpoolUpstreamChange == "allow", log); err != nil {
			return fmt.Errorf("ingest-url %s (from %s) not put in force: %w", id, next.Source("ingest-url"), err)
		}
		return nil
	}
}
