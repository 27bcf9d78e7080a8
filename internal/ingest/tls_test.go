package ingest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/tlsreload"
	"github.com/svcrelay/relay/internal/tlsreload/tlstest"
)

// TestTLSIngestAndReload: events over HTTPS; after a reload a new connection
// gets the new certificate while a kept-alive connection goes on serving.
func TestTLSIngestAndReload(t *testing.T) {
	rl, certFile, keyFile := selfSignedReloader(t)
	roots := x509.NewCertPool()
	tlstest.Trust(t, roots, certFile)

	r := startRelay(t, Config{TLS: rl.TLSConfig()}, spool.Config{Sync: spool.SyncNone})
	url := "https://" + r.addr + "/2/httpapi"
	body := envelope("tls-key", "", `{"user_id":"user-00001","event_type":"a"}`)

	// post sends one event on tr and returns the answer's status, the
	// certificate serial the connection was made with, and whether the
	// connection was reused.
	post := func(tr *http.Transport) (int, int64, bool) {
		t.Helper()
		var reused bool
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
		}))
		resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.TLS.PeerCertificates[0].SerialNumber.Int64(), reused
	}
	kept := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, MaxIdleConnsPerHost: 1}
	defer kept.CloseIdleConnections()
	if code, serial, _ := post(kept); code != 200 || serial != 1 {
		t.Fatalf("first: %d serial %d", code, serial)
	}

	// A plain HTTP request on the TLS listener is not served.
	if resp, err := http.Post("http://"+r.addr+"/2/httpapi", "application/json", bytes.NewReader(body)); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP served on the TLS listener")
		}
	}

	tlstest.WriteSelfSigned(t, 2, certFile, keyFile)
	tlstest.Trust(t, roots, certFile)
	if err := rl.Reload(); err != nil {
		t.Fatal(err)
	}
	if code, serial, reused := post(kept); code != 200 || serial != 1 || !reused {
		t.Fatalf("kept-alive connection after the reload: %d serial %d reused %v", code, serial, reused)
	}
	fresh := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	defer fresh.CloseIdleConnections()
	if code, serial, reused := post(fresh); code != 200 || serial != 2 || reused {
		t.Fatalf("new connection after the reload: %d serial %d reused %v", code, serial, reused)
	}
	if n := r.counter("relay_ingest_events_accepted_total"); n != 3 {
		t.Fatalf("%v events accepted, want 3", n)
	}
}

// tlsRelay starts a relay serving TLS with a new self-signed certificate.
func tlsRelay(t *testing.T, cfg Config) *testRelay {
	t.Helper()
	rl, _, _ := selfSignedReloader(t)
	cfg.TLS = rl.TLSConfig()
	return startRelay(t, cfg, spool.Config{Sync: spool.SyncNone})
}

// selfSignedReloader writes a self-signed certificate with serial 1 to a new
// directory and returns a Reloader serving it, and the two files.
func selfSignedReloader(t *testing.T) (rl *tlsreload.Reloader, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	tlstest.WriteSelfSigned(t, 1, certFile, keyFile)
	rl, err := tlsreload.New(tlsreload.Config{CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	return rl, certFile, keyFile
}

// TestTLSOversizedBodyAnswered: a TLS client still sending a body over the
// limit when the relay refuses it from its Content-Length gets the whole 413
// (the TCP connection under TLS lingers), not a reset.
func TestTLSOversizedBodyAnswered(t *testing.T) {
	const (
		limit = 1000
		size  = 1 << 20
		conns = 30
	)
	r := tlsRelay(t, Config{MaxRequestBytes: limit})
	var failed int
	var first error
	stop := time.Now().Add(30 * time.Second)
	tried := 0
	for ; tried < conns && time.Now().Before(stop); tried++ {
		if err := postOversizedTLS(r.addr, size); err != nil {
			if failed++; first == nil {
				first = err
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d TLS clients did not get the 413; first: %v", failed, tried, first)
	}
}

// postOversizedTLS posts size bytes over a new TLS connection with a small
// send buffer, writing while it reads the answer; nil when the answer is the
// whole 413.
func postOversizedTLS(addr string, size int) error {
	raw, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer raw.Close()
	raw.(*net.TCPConn).SetWriteBuffer(32 << 10)
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true})
	if err := c.Handshake(); err != nil {
		return err
	}
	wrote := make(chan error, 1)
	go func() {
		if _, err := fmt.Fprintf(c, "POST /2/httpapi HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size); err != nil {
			wrote <- err
			return
		}
		chunk := make([]byte, 16<<10)
		for sent := 0; sent < size; sent += len(chunk) {
			if _, err := c.Write(chunk); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	var body []byte
	if err == nil {
		body, err = io.ReadAll(resp.Body)
	}
	werr := <-wrote // the deadline bounds the wait
	switch {
	case err != nil:
		return fmt.Errorf("read answer: %w (body write: %v)", err, werr)
	case resp.StatusCode != 413 || !strings.Contains(string(body), "Payload too large"):
		return fmt.Errorf("answer %d %q", resp.StatusCode, body)
	case werr != nil:
		// A client that writes its whole body before reading sees only
		// this: the reset, not the 413.
		return fmt.Errorf("answer read, but the body write failed: %w", werr)
	}
	return nil
}

// TestTLSShutdownClosesIdle: Shutdown closes an idle kept-alive TLS
// connection at once and returns.
func TestTLSShutdownClosesIdle(t *testing.T) {
	r := tlsRelay(t, Config{})
	c, err := tls.Dial("tcp", r.addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- r.srv.Shutdown(ctx)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Shutdown hangs with an idle TLS connection open")
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("idle TLS connection still open after Shutdown")
	}
}
