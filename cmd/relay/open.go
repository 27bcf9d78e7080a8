package main

import (
	"strconv"

	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/ingest"
	"go.uber.org/zap"
)

// logOpen logs the ingest listener's settings for browsers and the
// internet, with the credentials file creds in force; api_keys are
// counted, never shown.
func logOpen(log *zap.Logger, cfg config.Config, creds *credentials.Store) {
	allowed := "all"
	if keys := cfg.IngestAllowedAPIKeys(creds); keys != nil {
		allowed = strconv.Itoa(len(keys))
		if cfg.AllowedKeysFromCredentials {
			allowed += " (credentials file)"
		}
	}
	log.Info("ingest access", zap.Strings("cors_origins", cfg.CORSOrigins), zap.String("allowed_api_keys", allowed),
		zap.Float64("client_rate_limit", cfg.ClientRateLimit), zap.Bool("anonymize_ip", cfg.AnonymizeIP))
}

// reloadOpen puts the Open settings of cfg in force on ing (a reload:
// CORS origins, the allow-list, from the credentials file in force when it
// comes from there, the client rate limit, IP anonymization).
func reloadOpen(ing *ingest.Server, cfg config.Config, creds *credentials.Store, log *zap.Logger) {
	if err := ing.SetOpen(cfg.IngestOpen(creds)); err != nil {
		// config.Load validated them as ingest does: not expected.
		log.Error("reload: ingest access settings not reloaded; those in force stay", errField(err))
		return
	}
	logOpen(log, cfg, creds)
}
