package fleet

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// ConnConfig is how a relay connects to the cluster (cmd/relay fills it
// from --spool, --nats-creds, --nats-tls-*).
type ConnConfig struct {
	// Servers are the cluster's URLs (nats://host:port or tls://host:port);
	// at least one. The client learns the others from the cluster.
	Servers []string
	// Name is the connection's name as servers show it; empty: "relay".
	Name string
	// CredsFile is a NATS credentials file (JWT and nkey seed); "" none.
	CredsFile string
	// TLSCAFile verifies the servers' certificates; "" means the system
	// roots (when the servers use TLS).
	TLSCAFile string
	// TLSCertFile and TLSKeyFile are a client certificate, for servers
	// that verify clients; both or neither.
	TLSCertFile, TLSKeyFile string
}

// Dial connects to the cluster. The connection reconnects forever (to any
// server of the cluster) until closed; its disconnections and reconnections
// are logged. log may be nil. Server URLs are never logged (they may hold
// a password).
func Dial(cfg ConnConfig, log *zap.Logger) (*nats.Conn, error) {
	if len(cfg.Servers) == 0 {
		return nil, errors.New("fleet: no NATS server given")
	}
	if (cfg.TLSCertFile == "") != (cfg.TLSKeyFile == "") {
		return nil, errors.New("fleet: TLS client certificate and key go together")
	}
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.Name == "" {
		cfg.Name = "relay"
	}
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.Timeout(5 * time.Second),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		nats.RetryOnFailedConnect(false),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("NATS disconnected; reconnecting", zap.Error(err))
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("NATS reconnected", zap.String("server_id", nc.ConnectedServerId()))
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("NATS error", zap.Error(err))
		}),
	}
	if cfg.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.TLSCAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCAFile))
	}
	if cfg.TLSCertFile != "" {
		opts = append(opts, nats.ClientCert(cfg.TLSCertFile, cfg.TLSKeyFile))
	}
	nc, err := nats.Connect(strings.Join(cfg.Servers, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("fleet: connect to NATS: %w", unavailable(err))
	}
	return nc, nil
}
