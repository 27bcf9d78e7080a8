// Package crash holds the binary-level crash test of the relay: the real
// relay binary, killed with SIGKILL at random moments under load, must keep
// every event it answered 200, exactly once and in per-device order.
package crash

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

const (
	clients  = 16 // concurrent clients, one device each
	kills    = 24 // SIGKILLs (the issue asks for at least 20)
	apiKey   = "crash-test-api-key"
	maxBatch = 4 // events per request: 1..maxBatch
)

// buildRelay builds the relay binary into a temp dir.
func buildRelay(t *testing.T) string {
	t.Helper()
	trackSources(t)
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	bin := filepath.Join(t.TempDir(), "relay")
	cmd := exec.Command(goBin, "build", "-o", bin, "github.com/svcrelay/relay/cmd/relay")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// trackSources stats every Go source and the module files of the repository.
// The go command caches a test's result by the files the test looked at; the
// binary is built in a subprocess, so without this an edit to the relay
// would not invalidate a cached pass of this test.
func trackSources(t *testing.T) {
	t.Helper()
	root := filepath.Join("..", "..")
	for _, f := range []string{"go.mod", "go.sum"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
				_, err = os.Stat(p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// freeAddr returns a 127.0.0.1 address nothing listens on (just freed).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// cleanEnv is the environment without RELAY_* variables.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RELAY_") {
			env = append(env, kv)
		}
	}
	return env
}

type relay struct {
	cmd  *exec.Cmd
	done chan error
}

// startRelay starts the binary and waits until its ingest /healthz answers.
func startRelay(t *testing.T, bin, listen, dataDir, deadURL string, logf *os.File) *relay {
	t.Helper()
	cmd := exec.Command(bin,
		"--listen", listen,
		"--admin-listen", "127.0.0.1:0",
		"--data-dir", dataDir,
		"--ingest-url", deadURL, // nothing listens: nothing is delivered, all stays spooled
		"--spool-min-free-bytes", "0",
		"--log-format", "json",
		"--drain-timeout", "2s",
	)
	cmd.Env = cleanEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &relay{cmd: cmd, done: make(chan error, 1)}
	go func() { r.done <- cmd.Wait() }()
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-r.done:
			t.Fatalf("relay exited during start: %v (log: %s)", err, logf.Name())
		default:
		}
		resp, err := hc.Get("http://" + listen + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return r
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.cmd.Process.Kill()
	t.Fatalf("relay not healthy within 15s (log: %s)", logf.Name())
	return nil
}

func (r *relay) kill(t *testing.T) {
	t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		t.Fatal("killed relay did not exit")
	}
}

// outcome of one event, as its client saw it.
type outcome uint8

const (
	unknown  outcome = iota // no answer, or a 5xx: may or may not be spooled, never twice
	accepted                // 200: must be spooled exactly once
	rejected                // a 4xx: must not be spooled (and is a bug here: every request is valid)
)

type sent struct {
	device string
	seq    int
	out    outcome
}

// client posts events of its own device, one request at a time, until stop.
func client(ctx context.Context, id int, listen string, rng *rand.Rand, record func(insertID string, s sent), reqs *atomic.Int64) {
	device := fmt.Sprintf("crash-device-%02d", id)
	hc := &http.Client{Timeout: 5 * time.Second}
	seq := 0
	var body bytes.Buffer
	for ctx.Err() == nil {
		n := 1 + rng.IntN(maxBatch)
		ids := make([]string, n)
		body.Reset()
		fmt.Fprintf(&body, `{"api_key":%q,"events":[`, apiKey)
		for i := range n {
			seq++
			ids[i] = fmt.Sprintf("%s-%07d", device, seq)
			if i > 0 {
				body.WriteByte(',')
			}
			fmt.Fprintf(&body, `{"event_type":"crash_test","device_id":%q,"insert_id":%q,"event_properties":{"seq":%d,"pad":%q}}`,
				device, ids[i], seq, strings.Repeat("x", rng.IntN(200)))
		}
		body.WriteString(`]}`)
		resp, err := hc.Post("http://"+listen+"/2/httpapi", "application/json", bytes.NewReader(body.Bytes()))
		out := unknown
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case rerr != nil:
				// Status seen, body cut: treat as no answer.
			case resp.StatusCode == 200 && bytes.Contains(b, []byte(`"code":200`)):
				out = accepted
			case resp.StatusCode >= 400 && resp.StatusCode < 500:
				out = rejected
			default:
				// A 503 while the relay shuts down: the append may have
				// been cancelled after it was queued.
				out = unknown
			}
		}
		reqs.Add(1)
		for i, iid := range ids {
			record(iid, sent{device: device, seq: seq - n + 1 + i, out: out})
		}
		if out != accepted {
			time.Sleep(2 * time.Millisecond) // the relay is probably down
		}
	}
}

type dumpRecord struct {
	Kind string          `json:"kind"`
	Seq  uint64          `json:"seq"`
	Data json.RawMessage `json:"data"`
}

type eventData struct {
	DeviceID        string `json:"device_id"`
	InsertID        string `json:"insert_id"`
	EventProperties struct {
		Seq int `json:"seq"`
	} `json:"event_properties"`
}

func TestKill9KeepsAcceptedEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test builds and kills the real binary; skipped under -short")
	}
	start := time.Now()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))

	bin := buildRelay(t)
	t.Logf("built relay in %v", time.Since(start).Round(time.Millisecond))
	tmp := t.TempDir()
	dataDir := filepath.Join(tmp, "data")
	listen := freeAddr(t)
	deadURL := "http://" + freeAddr(t)
	logf, err := os.Create(filepath.Join(tmp, "relay.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	dumpLog := func() {
		b, _ := os.ReadFile(logf.Name())
		if len(b) > 8000 {
			b = b[len(b)-8000:]
		}
		t.Logf("relay log tail:\n%s", b)
	}

	var mu sync.Mutex
	events := make(map[string]sent)
	record := func(iid string, s sent) {
		mu.Lock()
		events[iid] = s
		mu.Unlock()
	}
	var reqs atomic.Int64

	r := startRelay(t, bin, listen, dataDir, deadURL, logf)
	ctx, stopClients := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		crng := rand.New(rand.NewPCG(seed, uint64(i)+2))
		go func() {
			defer wg.Done()
			client(ctx, i, listen, crng, record, &reqs)
		}()
	}
	defer func() {
		stopClients()
		wg.Wait()
	}()

	for k := range kills {
		time.Sleep(time.Duration(20+rng.IntN(230)) * time.Millisecond)
		if k == kills/2 {
			// An operator's dump must refuse while the relay holds the spool.
			out, err := exec.Command(bin, "spool", "dump", "--data-dir", dataDir).CombinedOutput()
			if err == nil || !strings.Contains(string(out), "in use by a running relay") {
				t.Errorf("spool dump while the relay runs: err=%v out=%.300s; want a refusal", err, out)
			}
		}
		r.kill(t)
		r = startRelay(t, bin, listen, dataDir, deadURL, logf)
	}
	time.Sleep(200 * time.Millisecond)

	// A graceful stop under load exits 0.
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.done:
		if err != nil {
			dumpLog()
			t.Fatalf("relay exit after SIGTERM: %v, want 0", err)
		}
	case <-time.After(15 * time.Second):
		r.cmd.Process.Kill()
		t.Fatal("relay did not stop within 15s of SIGTERM")
	}
	stopClients()
	wg.Wait()

	out, err := exec.Command(bin, "spool", "dump", "--data-dir", dataDir).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("spool dump: %v: %s", err, ee.Stderr)
		}
		t.Fatal(err)
	}

	seen := make(map[string]int)
	lastSeq := make(map[string]int)
	var violations []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	lines := 0
	for sc.Scan() {
		lines++
		var rec dumpRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("dump line %d: %v: %s", lines, err, sc.Bytes())
		}
		var ev eventData
		if err := json.Unmarshal(rec.Data, &ev); err != nil {
			t.Fatalf("dump line %d data: %v", lines, err)
		}
		seen[ev.InsertID]++
		s, ok := events[ev.InsertID]
		switch {
		case !ok:
			violations = append(violations, fmt.Sprintf("%s: in the spool but never sent", ev.InsertID))
		case s.out == rejected:
			violations = append(violations, fmt.Sprintf("%s: answered 4xx yet spooled", ev.InsertID))
		case s.device != ev.DeviceID || s.seq != ev.EventProperties.Seq:
			violations = append(violations, fmt.Sprintf("%s: changed in the spool", ev.InsertID))
		}
		if last, ok := lastSeq[ev.DeviceID]; ok && ev.EventProperties.Seq <= last {
			violations = append(violations, fmt.Sprintf("%s: device %s seq %d after seq %d (order broken)",
				ev.InsertID, ev.DeviceID, ev.EventProperties.Seq, last))
		}
		lastSeq[ev.DeviceID] = ev.EventProperties.Seq
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	var nAcc, nUnknown, nRej, nUnknownKept int
	for iid, s := range events {
		switch s.out {
		case accepted:
			nAcc++
			if seen[iid] != 1 {
				violations = append(violations, fmt.Sprintf("%s: answered 200, in the spool %d times", iid, seen[iid]))
			}
		case unknown:
			nUnknown++
			if seen[iid] == 1 {
				nUnknownKept++
			}
		case rejected:
			nRej++
		}
		if seen[iid] > 1 && s.out != accepted {
			violations = append(violations, fmt.Sprintf("%s: in the spool %d times", iid, seen[iid]))
		}
	}
	t.Logf("%d kills, %d requests, %d events: %d accepted, %d without answer (%d of them kept), %d rejected; %d spooled; %v total",
		kills, reqs.Load(), len(events), nAcc, nUnknown, nUnknownKept, nRej, lines, time.Since(start).Round(time.Millisecond))
	if len(violations) > 0 {
		dumpLog()
		if len(violations) > 20 {
			violations = append(violations[:20], fmt.Sprintf("... and %d more", len(violations)-20))
		}
		t.Fatalf("%d violations:\n%s", len(violations), strings.Join(violations, "\n"))
	}
	if nRej > 0 {
		t.Errorf("%d valid events were answered 4xx", nRej)
	}
	if nAcc < 100 {
		dumpLog()
		t.Fatalf("only %d events accepted: the test proved little", nAcc)
	}
}
