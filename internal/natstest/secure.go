package natstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Certs are PEM files made by WriteCerts: a CA, a server certificate for
// 127.0.0.1 and localhost, and a client certificate, each signed by the
// CA. Nothing is committed: every run makes its own keys.
type Certs struct {
	CA                    string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
}

// WriteCerts makes a CA and its server and client certificates (ECDSA
// P-256, valid for a day) and writes them into dir.
func WriteCerts(dir string) (Certs, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Certs{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "natstest CA " + filepath.Base(dir)},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return Certs{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return Certs{}, err
	}
	c := Certs{
		CA:         filepath.Join(dir, "ca.pem"),
		ServerCert: filepath.Join(dir, "server.pem"), ServerKey: filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem"),
	}
	if err := writePEM(c.CA, "CERTIFICATE", caDER); err != nil {
		return Certs{}, err
	}
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, certPath, keyPath string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		if usage == x509.ExtKeyUsageServerAuth {
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
			tmpl.DNSNames = []string{"localhost"}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
			return err
		}
		return writePEM(keyPath, "EC PRIVATE KEY", kder)
	}
	if err := leaf(2, "natstest server", x509.ExtKeyUsageServerAuth, c.ServerCert, c.ServerKey); err != nil {
		return Certs{}, err
	}
	if err := leaf(3, "natstest client", x509.ExtKeyUsageClientAuth, c.ClientCert, c.ClientKey); err != nil {
		return Certs{}, err
	}
	return c, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// serverTLS is the nodes' TLS for clients: c's server certificate, and a
// client certificate of c's CA required.
func (c Certs) serverTLS() (*tls.Config, error) {
	return server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: c.ServerCert, KeyFile: c.ServerKey, CaFile: c.CA, Verify: true,
	})
}

// Operator is a decentralised-auth setup made by WriteOperator: an
// operator, its system account, an application account with JetStream
// (unlimited) and one user of it, whose credentials file (JWT and nkey
// seed) is Creds.
type Operator struct {
	claims          *jwt.OperatorClaims
	System, Account string // the accounts' public keys
	sysJWT, accJWT  string
	Creds           string
}

// WriteOperator makes the operator, accounts and user (fresh keys) and
// writes the user's credentials file, user.creds, into dir.
func WriteOperator(dir string) (Operator, error) {
	okp, err := nkeys.CreateOperator()
	if err != nil {
		return Operator{}, err
	}
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "natstest"
	ojwt, err := oc.Encode(okp)
	if err != nil {
		return Operator{}, err
	}
	// Decoded again: the server trusts the claims as a token carries them.
	if oc, err = jwt.DecodeOperatorClaims(ojwt); err != nil {
		return Operator{}, err
	}
	account := func(name string, js bool) (string, string, nkeys.KeyPair, error) {
		akp, err := nkeys.CreateAccount()
		if err != nil {
			return "", "", nil, err
		}
		apub, _ := akp.PublicKey()
		ac := jwt.NewAccountClaims(apub)
		ac.Name = name
		if js {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		ajwt, err := ac.Encode(okp)
		return apub, ajwt, akp, err
	}
	o := Operator{claims: oc}
	if o.System, o.sysJWT, _, err = account("SYS", false); err != nil {
		return Operator{}, err
	}
	var akp nkeys.KeyPair
	if o.Account, o.accJWT, akp, err = account("APP", true); err != nil {
		return Operator{}, err
	}
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return Operator{}, err
	}
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = "relay"
	ujwt, err := uc.Encode(akp)
	if err != nil {
		return Operator{}, err
	}
	seed, _ := ukp.Seed()
	creds, err := jwt.FormatUserConfig(ujwt, seed)
	if err != nil {
		return Operator{}, err
	}
	o.Creds = filepath.Join(dir, "user.creds")
	if err := os.WriteFile(o.Creds, creds, 0o600); err != nil {
		return Operator{}, err
	}
	return o, nil
}

// configure puts the nodes in operator mode, the two accounts preloaded in
// a memory resolver (one per node).
func (o Operator) configure(opts *server.Options) error {
	r := &server.MemAccResolver{}
	for pub, j := range map[string]string{o.System: o.sysJWT, o.Account: o.accJWT} {
		if err := r.Store(pub, j); err != nil {
			return fmt.Errorf("preload account: %w", err)
		}
	}
	opts.TrustedOperators = []*jwt.OperatorClaims{o.claims}
	opts.SystemAccount = o.System
	opts.AccountResolver = r
	return nil
}

// ClientOptions are the connection options a client of the cluster needs:
// its CA and client certificate (Config.TLS), its credentials
// (Config.Operator); none for a plain cluster.
func (c *Cluster) ClientOptions() []nats.Option {
	var opts []nats.Option
	if c.cfg.TLS {
		opts = append(opts, nats.RootCAs(c.certs.CA), nats.ClientCert(c.certs.ClientCert, c.certs.ClientKey))
	}
	if c.cfg.Operator {
		opts = append(opts, nats.UserCredentials(c.op.Creds))
	}
	return opts
}

// Certs are the cluster's TLS files (Config.TLS; zero otherwise).
func (c *Cluster) Certs() Certs { return c.certs }

// Creds is the credentials file of the cluster's user (Config.Operator; ""
// otherwise).
func (c *Cluster) Creds() string { return c.op.Creds }
