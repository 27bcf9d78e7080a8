package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/svcrelay/relay/internal/adminroute"
	"github.com/svcrelay/relay/internal/admintoken"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/delivery"
	"github.com/svcrelay/relay/internal/operator"
	"github.com/svcrelay/relay/internal/storage"
	"github.com/svcrelay/relay/internal/tap"
	"github.com/svcrelay/relay/internal/upstream"
)

// tappedAppender shows ingest's appends to the live taps: the records as
// spooled (rewritten: insert_id, time, ip), once Append succeeded.
// Without a tap it costs one atomic load.
type tappedAppender struct {
	next storage.Appender
	hub  *tap.Hub
}

func (a tappedAppender) Append(ctx context.Context, req storage.Request) error {
	if !a.hub.Active(tap.Ingest) {
		return a.next.Append(ctx, req)
	}
	// Copied before: Append takes the batch's memory over.
	picked := a.hub.Pick(tap.Ingest, req.APIKey, "", req.Batch.Records())
	err := a.next.Append(ctx, req)
	if err == nil {
		picked.Send()
	}
	return err
}

// tappedSender shows the events of every request the upstream answered
// 200 to the live taps.
type tappedSender struct {
	next delivery.Sender
	hub  *tap.Hub
}

func (s tappedSender) Do(ctx context.Context, req *upstream.Request) upstream.Result {
	res := s.next.Do(ctx, req)
	if res.Status == http.StatusOK && s.hub.Active(tap.Delivered) {
		s.hub.PublishBody(tap.Delivered, req.Body)
	}
	return res
}

// tapRoute is GET /relay/v1/tap; a project is found in the credentials
// file in force.
func tapRoute(hub *tap.Hub, creds *credentials.Ref) adminroute.Route {
	return adminroute.Route{Method: http.MethodGet, Path: "/relay/v1/tap", Mode: admintoken.ModeOwn,
		Handler: hub.Handler(func(name string) (string, bool) {
			p, ok := creds.Load().Project(name)
			if !ok {
				return "", false
			}
			return p.APIKey.Reveal(), true
		})}
}

// runTap is `relay tap`: stream live events of a running relay from its
// admin listener to stdout, as JSON lines.
func runTap(ctx context.Context, args []string, environ []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("relay tap", flag.ContinueOnError)
	admin := fs.String("admin", "", "the relay's admin listener, e.g. http://127.0.0.1:8081 (required)")
	tokenFile := fs.String("token-file", "", "file holding the admin token (else RELAY_ADMIN_TOKEN)")
	project := fs.String("project", "", "only the events of this project's api_key (named in the relay's credentials file)")
	keyHash := fs.String("api-key-hash", "", "only the events of the api_key with this hash (api_key_hash of a tap line)")
	eventType := fs.String("event-type", "", "only events of this event_type")
	device := fs.String("device", "", "only events of this device_id")
	sample := fs.Uint64("sample", 0, "keep one matching event in N")
	limit := fs.Uint64("limit", 0, "stop after N events (0: at the end of --duration)")
	dur := fs.Duration("duration", tap.DefaultDuration, "stop after this long (at most "+tap.MaxDuration.String()+")")
	where := fs.String("where", "ingest", "where to watch: ingest (accepted), delivered (upstream answered 200) or dead (dead letters)")
	mask := fs.Bool("mask", false, "replace the values of event_properties, user_properties, groups and group_properties by \"***\"")
	return operator.Run("tap", fs, args, stderr, true, func() error {
		if *admin == "" || fs.NArg() > 0 {
			return operator.Usagef("--admin URL is required and there are no arguments")
		}
		if *project != "" && *keyHash != "" {
			return operator.Usagef("--project and --api-key-hash exclude each other")
		}
		token := envValue(environ, "RELAY_ADMIN_TOKEN")
		if *tokenFile != "" {
			var err error
			if token, err = readToken(*tokenFile); err != nil {
				return err
			}
		}
		q := url.Values{}
		for k, v := range map[string]string{"project": *project, "api_key_hash": *keyHash, "event_type": *eventType,
			"device": *device, "where": *where, "sample": strconv.FormatUint(*sample, 10),
			"limit": strconv.FormatUint(*limit, 10), "duration": dur.String(), "mask": strconv.FormatBool(*mask)} {
			if v != "" && v != "0" && v != "false" { // a zero value is the server's default
				q.Set(k, v)
			}
		}
		// No client time-out: the server ends the stream after --duration.
		hc := &http.Client{Transport: &http.Transport{ResponseHeaderTimeout: 30 * time.Second}}
		resp, err := adminGet(ctx, hc, *admin, "/relay/v1/tap?"+q.Encode(), token)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		// Event lines to stdout; the drop reports and the end line to stderr,
		// so that stdout is only events.
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Bytes()
			switch {
			case strings.HasPrefix(string(line), `{"dropped":`):
				fmt.Fprintf(stderr, "relay tap: %s (events dropped: the reader was behind; --sample or a narrower filter help)\n", line)
				continue
			case strings.HasPrefix(string(line), `{"end":`):
				fmt.Fprintf(stderr, "relay tap: %s\n", line)
				return nil
			}
			// One write a line: a reader piping to head or jq sees each at once.
			if _, err := stdout.Write(append(line, '\n')); err != nil {
				return operator.ErrFailed
			}
		}
		switch err := sc.Err(); {
		case ctx.Err() != nil: // Ctrl-C
			return nil
		case err != nil:
			return err
		}
		return errors.New("the stream ended early (the relay stopped?)")
	})
}

// readToken reads an admin token file; its error is a usage error.
func readToken(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", operator.UsageError{Err: err}
	}
	return strings.TrimSpace(string(b)), nil
}

// adminGet GETs path of the admin listener at base with the admin token
// (none when ""). An answer but 200 is an error: its status and body. A bad
// base is a usage error.
func adminGet(ctx context.Context, hc *http.Client, base, path, token string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+path, nil)
	if err != nil {
		return nil, operator.UsageError{Err: err}
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return resp, nil
}
