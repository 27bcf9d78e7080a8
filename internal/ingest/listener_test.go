package ingest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/svcrelay/relay/internal/event"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/spool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// TestMalformedRequestLogsNoContent: fasthttp's messages about requests it
// cannot parse quote their heads; the ingest log gets none of it.
// Under AnonymizeIP the address is anonymized.
func TestMalformedRequestLogsNoContent(t *testing.T) {
	for _, anon := range []bool{false, true} {
		t.Run(fmt.Sprint("anonymize=", anon), func(t *testing.T) { testMalformedRequestLogs(t, anon) })
	}
}

func testMalformedRequestLogs(t *testing.T, anon bool) {
	const secret = "s3cr3t-4f1d"
	_, addr, logs := serveObserved(t, Config{Open: Open{AnonymizeIP: anon}}, openSpool(t, true))

	for _, req := range []string{
		// A control byte in a header value.
		"POST /2/httpapi?api_key=" + secret + " HTTP/1.1\r\nHost: relay\r\nX-Api-Key: " + secret + "\x01\r\nContent-Length: 2\r\n\r\n{}",
		// A header line without a colon.
		"POST /2/httpapi?api_key=" + secret + " HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer " + secret + "\r\n" + secret + "\r\n\r\n",
		// A bad Content-Length.
		"POST /batch?api_key=" + secret + " HTTP/1.1\r\nHost: relay\r\nContent-Length: " + secret + "\r\n\r\n",
		// A bad request line.
		"POST /2/httpapi?api_key=" + secret + " HTTP/1.1 " + secret + "\r\nHost: relay\r\n\r\n",
		// Two Transfer-Encodings.
		"POST /2/httpapi?api_key=" + secret + " HTTP/1.1\r\nHost: relay\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: " + secret + "\r\n\r\n",
	} {
		rc := dialRaw(t, addr)
		rc.write(req)
		if a := rc.answer(); a == nil || a.StatusCode != 400 {
			t.Fatalf("%q: answer %v, want 400", req, a)
		}
		io.Copy(io.Discard, rc.br) // until the server closed the connection
	}
	// fasthttp logs after it closed the connection: wait for its lines.
	polltest.Until(t, "a connection error logged (else the test does not reach fasthttp's logger)", func() bool {
		return logs.FilterMessage("ingest connection error").Len() > 0
	})
	lines := logs.FilterMessage("ingest connection error").All()
	for _, e := range logs.All() {
		if s := fmt.Sprint(e.Message, e.ContextMap()); strings.Contains(s, secret) {
			t.Fatalf("log line holds the request's content: %s", s)
		}
	}
	want := map[bool]string{false: "127.0.0.1:", true: "127.0.0.0:"}[anon]
	if m := lines[0].ContextMap(); m["class"] == nil || m["class"] == "other" || !strings.HasPrefix(fmt.Sprint(m["remote"]), want) {
		t.Fatalf("log line %v: want a class and the remote address %s...", m, want)
	}
}

// TestMaxConnections: beyond the limit a new connection waits (it is
// accepted by the kernel but not served), and is served once another closes.
func TestMaxConnections(t *testing.T) {
	r := startRelay(t, Config{MaxConnections: 2}, spool.Config{NoSync: true})
	healthz := "GET /healthz HTTP/1.1\r\nHost: relay\r\n\r\n"
	var held [2]*rawConn
	for i := range held {
		held[i] = dialRaw(t, r.addr)
		held[i].write(healthz)
		if a := held[i].answer(); a == nil || a.StatusCode != 200 {
			t.Fatalf("connection %d: %v", i, a)
		}
	}
	waiting := dialRaw(t, r.addr)
	waiting.write(healthz)
	// Not served while two are open. (A wrong pass is possible only if the
	// server were slower than this wait; a correct server never fails it.)
	waiting.c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := waiting.br.Peek(1); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("third connection served while two are open: %v", err)
	}
	if v := r.counter("relay_ingest_connection_limit_waits_total"); v < 1 {
		t.Errorf("relay_ingest_connection_limit_waits_total %v", v)
	}
	waiting.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	held[0].c.Close()
	if a := waiting.answer(); a == nil || a.StatusCode != 200 {
		t.Fatalf("third connection after one closed: %v", a)
	}
	// The one still held keeps being served.
	held[1].write(healthz)
	if a := held[1].answer(); a == nil || a.StatusCode != 200 {
		t.Fatalf("held connection: %v", a)
	}
}

// TestRetryableAcceptError: which accept errors the listener retries.
func TestRetryableAcceptError(t *testing.T) {
	op := func(err error) error {
		return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", err)}
	}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{op(syscall.EMFILE), true},
		{op(syscall.ENFILE), true},
		{op(syscall.ENOBUFS), true},
		{op(syscall.ENOMEM), true},
		{op(syscall.ECONNABORTED), true},
		{op(os.ErrDeadlineExceeded), true},
		{op(net.ErrClosed), false},
		{net.ErrClosed, false},
		{op(syscall.EBADF), false},
		{op(syscall.EINVAL), false},
		{errors.New("some listener"), false},
	} {
		if got := retryableAcceptError(tc.err); got != tc.want {
			t.Errorf("retryableAcceptError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// fdChildEnv makes the test binary the child of TestFileDescriptorExhaustion.
const fdChildEnv = "RELAY_TEST_FD_CHILD"

// TestFileDescriptorExhaustion runs an ingest Server in a child process (this
// test binary) under a low RLIMIT_NOFILE, exhausts its descriptors with
// connections, frees them, and checks the child serves again: running out of
// descriptors must not stop the listener.
func TestFileDescriptorExhaustion(t *testing.T) {
	if os.Getenv(fdChildEnv) != "" {
		t.Skip("in the child")
	}
	if testing.Short() {
		t.Skip("starts a child process")
	}
	// The child's life: longer than every wait below (polltest.Max each), so
	// that a loaded machine's slow test never loses its child to it.
	ctx, cancel := context.WithTimeout(context.Background(), 4*polltest.Max)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestFileDescriptorChild$", "-test.v")
	cmd.Env = append(os.Environ(), fdChildEnv+"="+t.TempDir())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	childOut := make(chan string, 1)
	addrc := make(chan string, 1)
	go func() {
		var all strings.Builder
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			all.WriteString(line + "\n")
			if a, ok := strings.CutPrefix(line, "LISTENING "); ok {
				addrc <- a
			}
		}
		childOut <- all.String()
	}()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Logf("child stdout:\n%s\nchild stderr:\n%s", <-childOut, stderr.String())
		}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case <-ctx.Done():
		t.Fatal("child did not start")
	}

	get := func() (*http.Response, error) {
		c := &http.Client{Timeout: polltest.Max, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get("http://" + addr + "/healthz")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}
	if resp, err := get(); err != nil || resp.StatusCode != 200 {
		t.Fatalf("before: %v %v", resp, err)
	}

	// The child may hold 24 more descriptors than it had; 100 connections
	// exhaust them (those beyond wait in its accept queue, its accept(2)
	// failing with EMFILE).
	var conns []net.Conn
	for range 100 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// Wait until the child reports retried accept errors, or exited.
	polltest.Until(t, "the child to report retried accept errors", func() bool {
		return strings.Contains(stderr.String(), "ingest accept failed; retrying")
	})
	if !strings.Contains(stderr.String(), "too many open files") {
		t.Fatalf("the child never ran out of descriptors")
	}
	for _, c := range conns {
		c.Close()
	}
	// Served again once the descriptors are free (the backed-off accept
	// retries within a second; each retry frees queued connections).
	var resp *http.Response
	polltest.Until(t, "an answer after the descriptors were freed", func() bool {
		resp, err = get()
		return err == nil && resp.StatusCode == 200
	})
}

// TestFileDescriptorChild is the child of TestFileDescriptorExhaustion.
func TestFileDescriptorChild(t *testing.T) {
	dir := os.Getenv(fdChildEnv)
	if dir == "" {
		t.Skip("only as the child of TestFileDescriptorExhaustion")
	}
	sp, err := spool.Open(spool.Config{Dir: dir, NoSync: true, MinFreeBytes: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	log := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.Lock(os.Stderr), zapcore.DebugLevel))
	srv, err := New(Config{}, spool.NewBackend(sp), event.NewIDGen(), log, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	lim := uint64(len(fds) + 24)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: lim, Max: lim}); err != nil {
		t.Fatal(err)
	}
	fmt.Println("LISTENING " + ln.Addr().String())

	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	select {
	case <-term:
	case err := <-served:
		t.Fatalf("Serve returned while it should serve: %v", err)
	case <-time.After(5 * polltest.Max): // the parent's SIGTERM comes first
	}
	srv.Shutdown(context.Background())
	fmt.Println("Serve returned", strconv.Quote(fmt.Sprint(<-served)))
}

// syncBuffer is a strings.Builder safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestListenerMetricsRegistered checks that New registers the listener's
// series with the request metrics, the connections gauge included.
func TestListenerMetricsRegistered(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := newMetrics(reg, make(chan struct{}, 3)); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	for _, name := range []string{"relay_ingest_connections", "relay_ingest_accept_retries_total",
		"relay_ingest_connection_limit_waits_total", "relay_ingest_client_connection_refusals_total"} {
		if !got[name] {
			t.Errorf("%s not registered", name)
		}
	}
}
