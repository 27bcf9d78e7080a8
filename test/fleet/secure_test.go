package fleet

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/natstest"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// TestFleetSecurity runs the relay binary against a cluster that serves
// TLS only and requires a client certificate, and against one in operator
// mode (JWT and nkey credentials): with the right files the relay
// serves, appends and delivers through the simulator; with a wrong CA, no
// client certificate or credentials of another operator it exits at start
// with the reason on one line.
func TestFleetSecurity(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS clusters and relay processes; skipped under -short")
	}
	t.Parallel()
	bin := binaries(t).relayBin
	// Files of another CA and another operator: right in form, wrong for
	// the clusters.
	other := t.TempDir()
	otherCerts, err := natstest.WriteCerts(other)
	if err != nil {
		t.Fatal(err)
	}
	otherOp, err := natstest.WriteOperator(other)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("TLS", func(t *testing.T) {
		cl := natstest.Start(t, natstest.Config{TLS: true})
		c := cl.Certs()
		spool := cl.URL() // tls://127.0.0.1:P1,tls://...
		if !strings.HasPrefix(spool, "tls://") {
			t.Fatalf("spool URL %q: want tls://", spool)
		}
		serveAndDeliver(t, bin, spool, "--nats-tls-ca", c.CA, "--nats-tls-cert", c.ClientCert, "--nats-tls-key", c.ClientKey)
		failsAtStart(t, bin, "wrong CA", "certificate signed by unknown authority",
			spool, "--nats-tls-ca", otherCerts.CA, "--nats-tls-cert", c.ClientCert, "--nats-tls-key", c.ClientKey)
		failsAtStart(t, bin, "client certificate of another CA", "tls",
			spool, "--nats-tls-ca", c.CA, "--nats-tls-cert", otherCerts.ClientCert, "--nats-tls-key", otherCerts.ClientKey)
		failsAtStart(t, bin, "no client certificate", "tls",
			spool, "--nats-tls-ca", c.CA)
	})
	t.Run("Creds", func(t *testing.T) {
		cl := natstest.Start(t, natstest.Config{Operator: true})
		serveAndDeliver(t, bin, cl.URL(), "--nats-creds", cl.Creds())
		failsAtStart(t, bin, "credentials of another operator", "authorization violation",
			cl.URL(), "--nats-creds", otherOp.Creds)
		failsAtStart(t, bin, "no credentials", "authorization violation", cl.URL())
	})
}

// serveAndDeliver starts the simulator and a relay on spool with the
// connection flags, sends events and waits until the simulator stored
// every one.
func serveAndDeliver(t *testing.T, bin, spool string, flags ...string) {
	t.Helper()
	dir := t.TempDir()
	sim := harness.StartSim(t, bin, dir)
	relay := harness.StartRelay(t, bin, dir, &harness.RelayOpts{
		DataDir: filepath.Join(dir, "data"), IngestURL: sim.Base,
		Extra: append([]string{"--spool", spool, "--spool-partitions", "4", "--flush-interval", "20ms"}, flags...),
	})
	hc := harness.NewClient()
	const devices, perDevice = 8, 5
	for d := range devices {
		evs := make([]*sentEvent, perDevice)
		for i := range evs {
			evs[i] = &sentEvent{device: fmt.Sprintf("secure-%d", d), seq: i + 1, insertID: fmt.Sprintf("secure-%d-%d", d, i+1)}
		}
		code, answer, err := relay.Post(hc, "/2/httpapi", body(evs))
		if err != nil || code != 200 {
			t.Fatalf("post: %d %s %v\n%s", code, answer, err, relay.LogTail(4000))
		}
	}
	var stored int
	polltest.Until(t, "the simulator to store every event", func() bool {
		evs, err := sim.Ctl.Events(context.Background(), apiKey, 0)
		stored = len(evs)
		return err == nil && stored == devices*perDevice
	})
	if err := relay.Stop(t, polltest.Max); err != nil {
		t.Errorf("relay stop: %v", err)
	}
}

// failsAtStart runs the relay on spool with the connection flags and
// wants it to exit with a failure, its log's only error line naming the
// cause (want, case-insensitive).
func failsAtStart(t *testing.T, bin, what, want, spool string, flags ...string) {
	t.Helper()
	dir := t.TempDir()
	args := append([]string{"--listen", harness.FreeAddr(t), "--admin-listen", harness.FreeAddr(t),
		"--data-dir", filepath.Join(dir, "data"), "--spool-min-free-bytes", "0", "--log-format", "json",
		"--ingest-url", "http://127.0.0.1:9", "--spool", spool}, flags...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*polltest.Max)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = harness.CleanEnv()
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	start := time.Now()
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s: relay still running after %v\n%s", what, 2*polltest.Max, stderr.String())
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("%s: relay exited with %v, want exit code 1\n%s", what, err, stderr.String())
	}
	var errLines []string
	for line := range strings.Lines(stderr.String()) {
		if strings.Contains(line, `"level":"error"`) || strings.Contains(line, `"level":"fatal"`) {
			errLines = append(errLines, strings.TrimSpace(line))
		}
	}
	if len(errLines) != 1 || !strings.Contains(strings.ToLower(errLines[0]), want) {
		t.Fatalf("%s: want one error line naming %q, got %d:\n%s\nfull log:\n%s", what, want, len(errLines), strings.Join(errLines, "\n"), stderr.String())
	}
	t.Logf("%s: exit 1 after %v: %s", what, time.Since(start).Round(time.Millisecond), errLines[0])
}
