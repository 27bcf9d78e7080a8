package main

import (
	"fmt"
	"time"

	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/tlsreload"
	"go.uber.org/zap"
)

// tlsPair is the certificate of one listener served over TLS.
type tlsPair struct {
	listener string // "ingest" or "admin"
	r        *tlsreload.Reloader
}

// loadTLS loads the certificate of a listener; nil when cert and key are
// unset (config.Validate refuses one without the other). from says where
// the two settings came from (tlsSources), for the error.
func loadTLS(log *zap.Logger, listener, cert, key, from string) (*tlsPair, error) {
	if cert == "" && key == "" {
		return nil, nil
	}
	r, err := tlsreload.New(tlsreload.Config{CertFile: cert, KeyFile: key})
	if err != nil {
		return nil, fmt.Errorf("%s listener: %w (%s)", listener, err, from)
	}
	p := &tlsPair{listener, r}
	p.logLoaded(log, "tls certificate loaded")
	return p, nil
}

// tlsSources names where a listener's certificate and key settings came
// from, as config's errors do: "tls-cert from flag --tls-cert; tls-key from
// variable RELAY_TLS_KEY".
func tlsSources(cfg config.Config, cert, key string) string {
	return fmt.Sprintf("%s from %s; %s from %s", cert, cfg.Source(cert), key, cfg.Source(key))
}

func (p *tlsPair) logLoaded(log *zap.Logger, msg string) {
	leaf := p.r.Leaf()
	fields := []zap.Field{zap.String("listener", p.listener), zap.String("subject", leaf.Subject.String()),
		zap.Strings("dns_names", leaf.DNSNames), zap.Time("not_after", leaf.NotAfter)}
	if time.Now().After(leaf.NotAfter) {
		log.Warn(msg+": the certificate has expired", fields...)
		return
	}
	log.Info(msg, fields...)
}

// reloadTLS reads the TLS files of every listener served over TLS again
// (on SIGHUP). Connections already open keep their certificate; new ones
// get the new pair. A pair that does not load keeps the old one, and the
// log says why.
func reloadTLS(log *zap.Logger, pairs []*tlsPair) {
	for _, p := range pairs {
		if err := p.r.Reload(); err != nil {
			log.Error("tls certificate reload failed: keeping the previous certificate",
				zap.String("listener", p.listener), errField(err))
			continue
		}
		p.logLoaded(log, "tls certificate reloaded")
	}
}
