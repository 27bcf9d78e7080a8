package tlsreload

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/svcrelay/relay/internal/tlsreload/tlstest"
)

func TestNewWithoutAFile(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	tlstest.WriteSelfSigned(t, 1, cert, key)
	for _, c := range []Config{{}, {CertFile: cert}, {KeyFile: key}} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v): no error", c)
		}
	}
}

func TestReload(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if _, err := New(Config{CertFile: cert, KeyFile: key}); err == nil {
		t.Fatal("New with missing files: no error")
	}
	tlstest.WriteSelfSigned(t, 1, cert, key)
	r, err := New(Config{CertFile: cert, KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	serial := func() int64 {
		t.Helper()
		c, err := r.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Leaf != r.Leaf() {
			t.Fatal("Leaf is not the served certificate's")
		}
		return r.Leaf().SerialNumber.Int64()
	}
	if s := serial(); s != 1 {
		t.Fatalf("serial %d", s)
	}

	tlstest.WriteSelfSigned(t, 2, cert, key)
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if s := serial(); s != 2 {
		t.Fatalf("after Reload: serial %d, want 2", s)
	}

	// Bad new files keep the old certificate.
	other := filepath.Join(dir, "other")
	tlstest.WriteSelfSigned(t, 3, other+".pem", other+".key")
	okCert, _ := os.ReadFile(cert)
	for name, write := range map[string]func(){
		"garbage certificate": func() { os.WriteFile(cert, []byte("not pem"), 0o644) },
		"key of another certificate": func() {
			os.WriteFile(cert, okCert, 0o644)
			b, _ := os.ReadFile(other + ".key")
			os.WriteFile(key, b, 0o600)
		},
		"missing key": func() { os.Remove(key) },
	} {
		write()
		if err := r.Reload(); err == nil {
			t.Errorf("%s: Reload succeeded", name)
		}
		if s := serial(); s != 2 {
			t.Fatalf("%s: serial %d after a failed Reload, want 2", name, s)
		}
	}
}

// TestHandshake: a TLS handshake through TLSConfig sees the current
// certificate; one established before a Reload keeps working.
func TestHandshake(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	tlstest.WriteSelfSigned(t, 1, cert, key)
	r, err := New(Config{CertFile: cert, KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	if cfg := r.TLSConfig(); cfg.MinVersion != tls.VersionTLS12 || cfg.GetCertificate == nil {
		t.Fatalf("TLSConfig %+v", cfg)
	}
	handshake := func() (*tls.Conn, *tls.Conn) {
		c, s := net.Pipe()
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true})
		ts := tls.Server(s, r.TLSConfig())
		errc := make(chan error, 1)
		go func() { errc <- ts.Handshake() }()
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tc.Close(); ts.Close() })
		return tc, ts
	}
	old, oldSrv := handshake()
	tlstest.WriteSelfSigned(t, 2, cert, key)
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	nc, _ := handshake()
	if s := nc.ConnectionState().PeerCertificates[0].SerialNumber.Int64(); s != 2 {
		t.Fatalf("new handshake saw serial %d, want 2", s)
	}
	// The old connection still carries data.
	go old.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := oldSrv.Read(buf); err != nil || string(buf) != "ping" {
		t.Fatalf("old connection: %q %v", buf, err)
	}
	if s := old.ConnectionState().PeerCertificates[0].SerialNumber.Int64(); s != 1 {
		t.Fatalf("old connection's certificate serial %d", s)
	}
}
