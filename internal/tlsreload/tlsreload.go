// Package tlsreload serves a TLS certificate read from a certificate file and
// a key file, and reads them again on demand (the relay does on SIGHUP)
// without dropping a connection.
//
// # Invariants
//
//   - A Reloader always holds a valid certificate: New fails unless the files
//     load, and a Reload whose files do not load (missing, unreadable, not
//     PEM, a key that does not match the certificate) returns why and keeps
//     the certificate it had.
//   - The certificate is swapped atomically: a handshake sees the old pair or
//     the new one, never a mix. Connections already established keep the
//     certificate they were made with; only new handshakes see a new one.
//   - A Reloader starts no goroutine and holds no lock across a call out.
package tlsreload

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync/atomic"
)

// Config names the files of a Reloader (config.Validate refuses one
// without the other).
type Config struct {
	// CertFile is the PEM certificate chain, leaf first; required.
	CertFile string
	// KeyFile is the PEM private key of the leaf; required.
	KeyFile string
}

// Reloader holds the certificate of Config's files. Create it with New.
type Reloader struct {
	cfg  Config
	cert atomic.Pointer[tls.Certificate]
}

// New loads cfg's files.
func New(cfg Config) (*Reloader, error) {
	r := &Reloader{cfg: cfg}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload reads the files again and, when they load, serves their pair to the
// handshakes that follow. When they do not, the error says why and the
// previous certificate stays in use.
func (r *Reloader) Reload() error {
	c, err := tls.LoadX509KeyPair(r.cfg.CertFile, r.cfg.KeyFile)
	if err != nil {
		return fmt.Errorf("tls certificate %s, key %s: %w", r.cfg.CertFile, r.cfg.KeyFile, err)
	}
	r.cert.Store(&c) // with its Leaf: LoadX509KeyPair parses it (go 1.23 and later)
	return nil
}

// Leaf returns the parsed leaf certificate in use (for its expiry, names).
func (r *Reloader) Leaf() *x509.Certificate { return r.cert.Load().Leaf }

// GetCertificate returns the certificate in use (tls.Config.GetCertificate).
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cert.Load(), nil
}

// TLSConfig returns a new server configuration that serves the Reloader's
// certificate over TLS 1.2 or later, offering HTTP/1.1 only in ALPN (neither
// listener speaks HTTP/2).
func (r *Reloader) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: r.GetCertificate,
		NextProtos:     []string{"http/1.1"},
	}
}
