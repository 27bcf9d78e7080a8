package opscmd

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/svcrelay/relay/internal/credentials"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// common are the flags every command shares.
type common struct {
	credsPath    string
	project      string
	analyticsURL string
	feedbackURL  string
	retryInitial time.Duration
	retryMax     time.Duration
	retryTime    time.Duration
	timeout      time.Duration

	store *credentials.Store
	proj  *credentials.Project
}

// newFlagSet returns the flag set of cmd with the common flags registered
// (--feedback-url when feedback, else --analytics-url).
func newFlagSet(cmd string, feedback bool) (*flag.FlagSet, *common) {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	c := &common{}
	c.register(fs, feedback)
	return fs, c
}

func (c *common) register(fs *flag.FlagSet, feedback bool) {
	fs.StringVar(&c.credsPath, "credentials", "", "YAML file of upstream credentials (the relay's --credentials format); required")
	fs.StringVar(&c.project, "project", "", "project of the credentials file to act for")
	if feedback {
		fs.StringVar(&c.feedbackURL, "feedback-url", "", "upstream base of the feedback API (a project's feedback_url overrides it)")
	} else {
		fs.StringVar(&c.analyticsURL, "analytics-url", "", "upstream base of the analytics APIs (a project's analytics_url overrides it)")
	}
	fs.DurationVar(&c.retryInitial, "retry-initial", time.Second, "first wait before retrying a 429, 5xx or transport error")
	fs.DurationVar(&c.retryMax, "retry-max", time.Minute, "longest wait between retries (also caps Retry-After)")
	fs.DurationVar(&c.retryTime, "retry-time", 10*time.Minute, "give up retrying one request after this long")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Minute, "longest wait for an answer's head (an export may take a while to start; its body may stream for longer)")
}

// load reads the credentials file and finds the project (required when
// needProject).
func (c *common) load(needProject bool) error {
	if c.credsPath == "" {
		return errors.New("--credentials is required")
	}
	s, err := credentials.Load(c.credsPath)
	if err != nil {
		return err
	}
	c.store = s
	if c.project == "" {
		if needProject {
			return errors.New("--project is required")
		}
		return nil
	}
	p, ok := s.Project(c.project)
	if !ok {
		return fmt.Errorf("--project %q is not in %s", c.project, c.credsPath)
	}
	c.proj = p
	return nil
}

// base returns the upstream base of kind for the project (or org).
func (c *common) base(kind string, org *credentials.Organization) (string, error) {
	fallback, flagName := c.analyticsURL, "--analytics-url"
	if kind == credentials.KindFeedback {
		fallback, flagName = c.feedbackURL, "--feedback-url"
	}
	var b string
	if c.proj != nil {
		b = c.proj.URL(kind, fallback)
	} else {
		b = org.URL(kind, fallback)
	}
	if b == "" {
		return "", fmt.Errorf("no upstream base: give %s or set it in the credentials file", flagName)
	}
	return strings.TrimRight(b, "/"), nil
}

// projectClient loads the credentials file (--project required) and
// returns a client with the project's key pair and the project's upstream
// base of kind. Its errors are usage errors.
func (c *common) projectClient(kind string) (*client, string, error) {
	if err := c.load(true); err != nil {
		return nil, "", err
	}
	base, err := c.base(kind, nil)
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
// the body open (besides 2xx). Any other status is a *statusError.
func (cl *client) do(ctx context.Context, method, url string, body []byte, accept ...int) (*http.Response, error) {
	return cl.retry(ctx, method, url, body, true, accept)
}

// doNoReplay is do for a request that must not reach the upstream twice
// (DSAR create): only answers that say it was not processed (429, 503) are
// retried, never a transport error (the request may have arrived).
func (cl *client) doNoReplay(ctx context.Context, method, url string, body []byte, accept ...int) (*http.Response, error) {
	return cl.retry(ctx, method, url, body, false, accept)
}

func (cl *client) retry(ctx context.Context, method, url string, body []byte, replay bool, accept []int) (*http.Response, error) {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = cl.c.retryInitial
	bo.MaxInterval = cl.c.retryMax
	bo.MaxElapsedTime = cl.c.retryTime
	bo.Reset()
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
		wait = max(wait, min(retryAfter, cl.c.retryMax))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%s %s: %w", method, redactURL(url), ctx.Err())
		case <-t.C:
		}
	}
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
	if r.StatusCode/100 == 2 || contains(accept, r.StatusCode) {
		return r, 0, nil
	}
	b, _ := io.ReadAll(io.LimitReader(r.Body, 4096))
	r.Body.Close()
	se := &statusError{Status: r.StatusCode, Body: string(b)}
	if r.StatusCode == http.StatusTooManyRequests || r.StatusCode >= 500 {
		var ra time.Duration
		if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err == nil && s > 0 {
			ra = time.Duration(s) * time.Second
		}
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

func contains(l []int, v int) bool {
	for _, x := range l {
		if x == v {
			return true
		}
	}
	return false
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

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
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
func (p *progress) logf(format string, a ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.line {
		fmt.Fprint(p.w, "\r\033[K")
		p.line = false
	}
	fmt.Fprintf(p.w, format+"\n", a...)
}

// done clears the progress line.
func (p *progress) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.line {
		fmt.Fprint(p.w, "\r\033[K")
		p.line = false
	}
}

// countingReader counts bytes read and reports them to a callback.
type countingReader struct {
	r  io.Reader
	n  int64
	on func(n int64)
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	if c.on != nil {
		c.on(c.n)
	}
	return n, err
}

// parseFlags parses args; on error it prints usage and returns false.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) (int, bool) {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "relay %s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return exitUsage, false
	}
	return 0, true
}

func usageErr(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "relay %s: %v\n", cmd, err)
	return exitUsage
}

func fail(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "relay %s: %v\n", cmd, err)
	return exitFailure
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
