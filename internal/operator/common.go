package operator

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/svcrelay/relay/internal/backfill"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/upstream"
)

// Exit codes of every relay subcommand.
const (
	ExitOK      = 0
	ExitFailure = 1 // a failure while running
	ExitUsage   = 2 // bad flags or configuration: nothing was started
)

// common are the flags every command shares.
type common struct {
	kind         string // credentials.KindAnalytics or KindFeedback: the base the command talks to
	baseFlag     string // "analytics-url" or "feedback-url"
	baseURL      string // its value
	credsPath    string
	project      string
	retryInitial time.Duration
	retryMax     time.Duration
	retryTime    time.Duration
	timeout      time.Duration

	store *credentials.Store
	proj  *credentials.Project
}

// work is a command's work once its flags are parsed (see Main).
type work func(ctx context.Context, p *progress) error

// commands are the operator commands: each registers its flags and returns
// its work.
var commands = map[string]func(*flag.FlagSet, *common, io.Writer) work{
	"export": exportCmd, "dsar": dsarCmd, "delete-users": deleteUsersCmd, "feedback": feedbackCmd,
	"backfill": backfillCmd, "migrate": migrateCmd,
}

// Main runs the operator command name (export, dsar, delete-users,
// feedback, backfill, migrate) with args and returns its exit code (Run).
func Main(ctx context.Context, name string, args []string, stdout, stderr io.Writer) int {
	define, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "relay: no operator command %q\n", name)
		return ExitUsage
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	w := define(fs, newCommon(fs, name), stdout)
	return Run(name, fs, args, stderr, name == "backfill", func() error { // its arguments are its input files
		p := newProgress(stderr)
		defer p.done()
		return w(ctx, p)
	})
}

// Run is the flow every subcommand of relay shares: it parses args into fs
// (-h: exit 0; bad flags: 2), refuses arguments unless takesArgs (2), and
// runs run, whose error decides the code: nil 0; a usage error (Usagef,
// UsageError) 2; ErrFailed 1 with nothing more said (the failures were
// reported); any other 1. An error is printed as "relay NAME: ERR".
func Run(name string, fs *flag.FlagSet, args []string, stderr io.Writer, takesArgs bool, run func() error) int {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	var err error
	if !takesArgs && fs.NArg() > 0 {
		err = Usagef("unexpected argument %q", fs.Arg(0))
	} else {
		err = run()
	}
	if err == nil {
		return ExitOK
	}
	if !errors.Is(err, ErrFailed) {
		fmt.Fprintf(stderr, "relay %s: %v\n", name, err)
	}
	if errors.As(err, new(UsageError)) {
		return ExitUsage
	}
	return ExitFailure
}

// newCommon registers command name's common flags on fs (--feedback-url
// for feedback, else --analytics-url); backfill's only --credentials (it
// talks to the ingest API only).
func newCommon(fs *flag.FlagSet, name string) *common {
	c := &common{kind: credentials.KindAnalytics, baseFlag: "analytics-url"}
	if name == "backfill" {
		fs.StringVar(&c.credsPath, "credentials", "", "YAML file of upstream credentials (the relay's --credentials format), whose projects --api-key may name")
		return c
	}
	fs.StringVar(&c.credsPath, "credentials", "", "YAML file of upstream credentials (the relay's --credentials format); required")
	usage := "upstream base of the analytics APIs (a project's analytics_url overrides it)"
	if name == "feedback" {
		c.kind, c.baseFlag, usage = credentials.KindFeedback, "feedback-url", "upstream base of the feedback API (a project's feedback_url overrides it)"
	}
	fs.StringVar(&c.baseURL, c.baseFlag, "", usage)
	fs.StringVar(&c.project, "project", "", "project of the credentials file to act for")
	fs.DurationVar(&c.retryInitial, "retry-initial", time.Second, "first wait before retrying a 429, 5xx or transport error")
	fs.DurationVar(&c.retryMax, "retry-max", time.Minute, "longest wait between retries (also caps Retry-After)")
	fs.DurationVar(&c.retryTime, "retry-time", 10*time.Minute, "give up retrying one request after this long")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Minute, "longest wait for an answer's head (an export may take a while to start; its body may stream for longer)")
	return c
}

// UsageError is a command called wrongly: exit 2.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }

// Usagef is a UsageError with a formatted message.
func Usagef(format string, a ...any) error { return UsageError{fmt.Errorf(format, a...)} }

// ErrFailed says the command went through but some of its items failed,
// each already reported: exit 1 with nothing more printed.
var ErrFailed = errors.New("some items failed")

// required returns a usage error for the first of the string flags names
// left empty.
func required(fs *flag.FlagSet, names ...string) error {
	for _, n := range names {
		if fs.Lookup(n).Value.String() == "" {
			return Usagef("--%s is required", n)
		}
	}
	return nil
}

// load reads the credentials file and finds the project (required when
// needProject). Its errors are usage errors.
func (c *common) load(needProject bool) error {
	if c.credsPath == "" {
		return Usagef("--credentials is required")
	}
	s, err := credentials.Load(c.credsPath)
	if err != nil {
		return UsageError{err}
	}
	c.store = s
	if c.project == "" {
		if needProject {
			return Usagef("--project is required")
		}
		return nil
	}
	p, ok := s.Project(c.project)
	if !ok {
		return Usagef("--project %q is not in %s", c.project, c.credsPath)
	}
	c.proj = p
	return nil
}

// base returns the upstream base of the command's kind for the project (or
// org). Its error is a usage error.
func (c *common) base(org *credentials.Organization) (string, error) {
	var b string
	if c.proj != nil {
		b = c.proj.URL(c.kind, c.baseURL)
	} else {
		b = org.URL(c.kind, c.baseURL)
	}
	if b == "" {
		return "", Usagef("no upstream base: give --%s or set it in the credentials file", c.baseFlag)
	}
	return strings.TrimRight(b, "/"), nil
}

// projectClient loads the credentials file (--project required) and
// returns a client with the project's key pair and the project's upstream
// base. Its errors are usage errors.
func (c *common) projectClient() (*client, string, error) {
	if err := c.load(true); err != nil {
		return nil, "", err
	}
	base, err := c.base(nil)
	if err != nil {
		return nil, "", err
	}
	return c.newClient(credentials.BasicAuth(c.proj.APIKey, c.proj.SecretKey)), base, nil
}

// client is an upstream HTTP client with one Authorization.
type client struct {
	c    *common
	auth string
	http *http.Client
}

func (c *common) newClient(auth string) *client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = c.timeout
	cl := &client{c: c, auth: auth}
	cl.http = &http.Client{Transport: tr, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) >= 5 {
			return errors.New("stopped after 5 redirects")
		}
		// The document: download addresses "need the same credentials" when
		// the client follows the redirect itself; net/http drops them on a
		// redirect to another host.
		req.Header.Set("Authorization", auth)
		return nil
	}}
	return cl
}

// statusError is a final non-2xx answer.
type statusError struct {
	Status int
	Body   string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("upstream answered %d: %s", e.Status, strings.TrimSpace(e.Body))
}

// do sends a request, retrying 429, 5xx and transport errors (see the
// package doc). accept lists the statuses handed back to the caller with
// the body open (besides 2xx). Any other status is a *statusError. A
// request that must not reach the upstream twice (DSAR create) is sent
// with replay false: only answers that say it was not processed (429, 503)
// are retried, never a transport error (it may have arrived).
func (cl *client) do(ctx context.Context, method, url string, body []byte, replay bool, accept ...int) (*http.Response, error) {
	bo := cl.c.backOff(cl.c.retryTime)
	for {
		resp, retryAfter, err := cl.once(ctx, method, url, body, accept)
		if err == nil {
			return resp, nil
		}
		var perm *backoff.PermanentError
		if errors.As(err, &perm) {
			return nil, fmt.Errorf("%s %s: %w", method, redactURL(url), perm.Err)
		}
		var se *statusError
		if !replay && (!errors.As(err, &se) || (se.Status != http.StatusTooManyRequests && se.Status != http.StatusServiceUnavailable)) {
			return nil, fmt.Errorf("%s %s (not retried: the upstream may have received it): %w", method, redactURL(url), err)
		}
		wait := bo.NextBackOff()
		if wait == backoff.Stop {
			return nil, fmt.Errorf("%s %s: still failing after %v: %w", method, redactURL(url), cl.c.retryTime, err)
		}
		if err := backfill.Sleep(ctx, max(wait, min(retryAfter, cl.c.retryMax))); err != nil {
			return nil, fmt.Errorf("%s %s: %w", method, redactURL(url), err)
		}
	}
}

// backOff is the retries' backoff: --retry-initial growing to --retry-max,
// for maxElapsed (0: without end).
func (c *common) backOff(maxElapsed time.Duration) *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff(backoff.WithInitialInterval(c.retryInitial),
		backoff.WithMaxInterval(c.retryMax), backoff.WithMaxElapsedTime(maxElapsed))
}

// once sends one request; a retryable failure is a plain error (with the
// answer's Retry-After), a final one a *backoff.PermanentError.
func (cl *client) once(ctx context.Context, method, url string, body []byte, accept []int) (*http.Response, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return nil, 0, backoff.Permanent(err)
	}
	req.Header.Set("Authorization", cl.auth)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	r, err := cl.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, 0, backoff.Permanent(ctx.Err())
		}
		return nil, 0, err
	}
	if r.StatusCode/100 == 2 || slices.Contains(accept, r.StatusCode) {
		return r, 0, nil
	}
	b, _ := io.ReadAll(io.LimitReader(r.Body, 4096))
	r.Body.Close()
	se := &statusError{Status: r.StatusCode, Body: string(b)}
	if r.StatusCode == http.StatusTooManyRequests || r.StatusCode >= 500 {
		ra := upstream.RetryAfter(r.Header.Get("Retry-After"), time.Now()) // seconds or an HTTP date
		return nil, ra, se
	}
	return nil, 0, backoff.Permanent(se)
}

// redactURL drops the query (DSAR download addresses may be signed).
func redactURL(u string) string {
	if i := strings.IndexByte(u, '?'); i >= 0 {
		return u[:i] + "?..."
	}
	return u
}

// progress shows progress on stderr: one updating line on a terminal,
// plain lines otherwise.
type progress struct {
	mu   sync.Mutex
	w    io.Writer
	tty  bool
	last time.Time
	line bool // a progress line is on screen (tty)
}

func newProgress(w io.Writer) *progress { return &progress{w: w, tty: IsTerminal(w)} }

// IsTerminal reports whether w is a character device (a terminal).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// update shows a transient status (terminal only, at most 10 a second).
func (p *progress) update(format string, a ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.tty || time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	fmt.Fprintf(p.w, "\r\033[K"+format, a...)
	p.line = true
}

// logf prints a step: a line of its own (on a terminal, replacing the
// progress line).
func (p *progress) logf(format string, a ...any) { p.print(format+"\n", a...) }

// done clears the progress line.
func (p *progress) done() { p.print("") }

// print clears the progress line and writes format.
func (p *progress) print(format string, a ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.line {
		fmt.Fprint(p.w, "\r\033[K")
		p.line = false
	}
	fmt.Fprintf(p.w, format, a...)
}

// countingReader counts bytes read and reports them to on.
type countingReader struct {
	r  io.Reader
	n  int64
	on func(n int64)
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	c.on(c.n)
	return n, err
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
