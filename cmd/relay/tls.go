package main

import (
	"time"

	"github.com/svcrelay/relay/internal/tlsreload"
	"go.uber.org/zap"
)

func logCert(log *zap.Logger, listener string, r *tlsreload.Reloader, msg string) {
	leaf := r.Leaf()
	fields := []zap.Field{zap.String("listener", listener), zap.String("subject", leaf.Subject.String()),
		zap.Strings("dns_names", leaf.DNSNames), zap.Time("not_after", leaf.NotAfter)}
	if time.Now().After(leaf.NotAfter) {
		log.Warn(msg+": the certificate has expired", fields...)
		return
	}
	log.Info(msg, fields...)
}
