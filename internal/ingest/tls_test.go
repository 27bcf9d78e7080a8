package ingest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptrace"
	"path/filepath"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
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

	r := startRelay(t, Config{TLS: rl.TLSConfig()}, spool.Config{NoSync: true})
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
	return startRelay(t, cfg, spool.Config{NoSync: true})
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
	repeatPosts(t, conns, func() error { return postOversizedTLS(r.addr, size) })
}

// postOversizedTLS is postOversized over a new TLS connection.
func postOversizedTLS(addr string, size int) error {
	raw, err := dialSmall(addr, 10*time.Second)
	if err != nil {
		return err
	}
	defer raw.Close()
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true})
	if err := c.Handshake(); err != nil {
		return err
	}
	return postOversized(c, "/2/httpapi", size, 413, "Payload too large")
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
		// Half the idle timeout (120 s): a Shutdown that waited for it
		// fails on this ctx, a right one takes milliseconds.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done <- r.srv.Shutdown(ctx)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(polltest.Max):
		t.Fatal("Shutdown hangs with an idle TLS connection open")
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("idle TLS connection still open after Shutdown")
	}
}
