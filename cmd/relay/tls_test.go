package main

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/tlsreload/tlstest"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestServeTLSReloadOnSIGHUP runs the relay in-process with TLS on both
// listeners, sends the process SIGHUP after new certificates were written,
// and checks that new connections get them while kept-alive ones go on, and
// that a bad file keeps the certificate in use.
func TestServeTLSReloadOnSIGHUP(t *testing.T) {
	dir := t.TempDir()
	ic, ik := filepath.Join(dir, "ingest.pem"), filepath.Join(dir, "ingest.key")
	ac, ak := filepath.Join(dir, "admin.pem"), filepath.Join(dir, "admin.key")
	tlstest.WriteSelfSigned(t, 1, ic, ik)
	tlstest.WriteSelfSigned(t, 11, ac, ak)
	cfg, err := config.Load([]string{
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"),
		"--spool-min-free-bytes", "0", "--drain-timeout", "2s",
		"--tls-cert", ic, "--tls-key", ik, "--admin-tls-cert", ac, "--admin-tls-key", ak,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serve(ctx, func() {}, cfg, zap.New(core)) }()

	waitLog := func(msg string, n int) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for logs.FilterMessage(msg).Len() < n {
			if time.Now().After(deadline) {
				t.Fatalf("fewer than %d %q log lines", n, msg)
			}
			select {
			case err := <-done:
				t.Fatalf("serve returned early: %v", err)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	waitLog("relay serving", 1) // the SIGHUP handler is installed before
	addr := func(msg string) string { return logs.FilterMessage(msg).All()[0].ContextMap()["addr"].(string) }
	urls := []string{"https://" + addr("ingest listening") + "/healthz", "https://" + addr("admin listening") + "/healthz"}

	// get answers GET url on tr: the certificate serial and whether the
	// connection was reused.
	get := func(tr *http.Transport, url string) (int64, bool) {
		t.Helper()
		var reused bool
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
		}))
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", url, resp.StatusCode)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber.Int64(), reused
	}
	newTransport := func() *http.Transport {
		tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} // serials are checked
		t.Cleanup(tr.CloseIdleConnections)
		return tr
	}
	kept := newTransport()
	for i, want := range []int64{1, 11} {
		if s, _ := get(kept, urls[i]); s != want {
			t.Fatalf("%s: serial %d, want %d", urls[i], s, want)
		}
	}

	tlstest.WriteSelfSigned(t, 2, ic, ik)
	tlstest.WriteSelfSigned(t, 12, ac, ak)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog("tls certificate reloaded", 2)
	fresh := newTransport()
	for i, want := range []int64{2, 12} {
		if s, reused := get(kept, urls[i]); s != want-1 || !reused {
			t.Fatalf("%s kept alive: serial %d reused %v, want %d on the old connection", urls[i], s, reused, want-1)
		}
		if s, _ := get(fresh, urls[i]); s != want {
			t.Fatalf("%s new connection: serial %d, want %d", urls[i], s, want)
		}
	}

	// A bad file: logged, the certificate in use stays.
	if err := os.WriteFile(ic, []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog("tls certificate reload failed: keeping the previous certificate", 1)
	if s, _ := get(newTransport(), urls[0]); s != 2 {
		t.Fatalf("after a bad file: serial %d, want 2", s)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop")
	}
}

// TestTLSLoadErrorNamesSources: a certificate that does not load at start
// says where its settings came from, never a flag that was not given.
func TestTLSLoadErrorNamesSources(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "relay.yaml")
	if err := os.WriteFile(cfgFile, []byte("admin-tls-key: "+filepath.Join(dir, "nope-key.pem")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load([]string{"--admin-tls-cert", filepath.Join(dir, "nope-admin.pem")},
		[]string{"RELAY_TLS_CERT=" + filepath.Join(dir, "nope.pem"), "RELAY_TLS_KEY=" + filepath.Join(dir, "nope-key.pem"), "RELAY_CONFIG=" + cfgFile})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		listener, cert, key, certV, keyV, want string
	}{
		{"ingest", "tls-cert", "tls-key", cfg.TLSCert, cfg.TLSKey, "(tls-cert from variable RELAY_TLS_CERT; tls-key from variable RELAY_TLS_KEY)"},
		{"admin", "admin-tls-cert", "admin-tls-key", cfg.AdminTLSCert, cfg.AdminTLSKey, "(admin-tls-cert from flag --admin-tls-cert; admin-tls-key from " + cfgFile + " line 1)"},
	} {
		_, err := loadTLS(zap.NewNop(), tc.listener, tc.certV, tc.keyV, tlsSources(cfg, tc.cert, tc.key))
		if err == nil {
			t.Fatalf("%s: missing files loaded", tc.listener)
		}
		if !strings.HasPrefix(err.Error(), tc.listener+" listener: ") || !strings.HasSuffix(err.Error(), tc.want) {
			t.Errorf("%s: error %q\nwant it to end with %q", tc.listener, err, tc.want)
		}
	}
}
