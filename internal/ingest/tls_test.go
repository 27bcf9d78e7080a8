package ingest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/spool"
	"github.com/svcrelay/relay/internal/tlsreload"
)

// writeSelfSigned writes a new self-signed certificate for 127.0.0.1 with
// serial to certFile and keyFile.
func writeSelfSigned(t *testing.T, serial int64, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTLSIngestAndReload: events over HTTPS; after a reload a new connection
// gets the new certificate while a kept-alive connection goes on serving.
func TestTLSIngestAndReload(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeSelfSigned(t, 1, certFile, keyFile)
	rl, err := tlsreload.New(tlsreload.Config{CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(first)

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

	writeSelfSigned(t, 2, certFile, keyFile)
	second, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	roots.AppendCertsFromPEM(second)
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
