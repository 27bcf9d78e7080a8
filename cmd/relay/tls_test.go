package main

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/tlsreload/tlstest"
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
	r := startServe(t, "--tls-cert", ic, "--tls-key", ik, "--admin-tls-cert", ac, "--admin-tls-key", ak)
	urls := []string{"https://" + r.ingestAddr + "/healthz", "https://" + r.adminAddr + "/healthz"}

	// get answers GET url on tr: the certificate serial and whether the
	// connection was reused.
	get := func(tr *http.Transport, url string) (int64, bool) {
		t.Helper()
		var reused bool
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
		}))
		resp, err := (&http.Client{Transport: tr, Timeout: polltest.Max}).Do(req)
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
	r.waitLog(t, "tls certificate reloaded", 2)
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
	r.waitLog(t, "tls certificate reload failed: keeping the previous certificate", 1)
	if s, _ := get(newTransport(), urls[0]); s != 2 {
		t.Fatalf("after a bad file: serial %d, want 2", s)
	}

	if err := r.stop(t); err != nil {
		t.Fatalf("serve: %v", err)
	}
}
