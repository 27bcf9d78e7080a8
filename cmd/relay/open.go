package main

import (
	"strconv"

	"github.com/svcrelay/relay/internal/config"
	"github.com/svcrelay/relay/internal/credentials"
	"github.com/svcrelay/relay/internal/ingest"
	"go.uber.org/zap"
)

// logOpen logs the ingest listener's settings for browsers and the
// internet; api_keys are counted, never shown.
func logOpen(log *zap.Logger, cfg config.Config) {
	allowed := "all"
	if keys := cfg.IngestAllowedAPIKeys(cfg.Creds); keys != nil {
		allowed = strconv.Itoa(len(keys))
		if cfg.AllowedKeysFromCredentials {
			allowed += " (credentials file)"
		}
	}
	log.Info("ingest access", zap.Strings("cors_origins", cfg.CORSOrigins), zap.String("allowed_api_keys", allowed),
		zap.Float64("client_rate_limit", cfg.ClientRateLimit), zap.Bool("anonymize_ip", cfg.AnonymizeIP))
}

// reloadAllowedKeys refreshes the ingest allow-list after the credentials
// file was reloaded (SIGHUP), when it comes from that file
// (--allowed-api-keys=credentials); otherwise the list is the flag's and
// stays. creds is the store in force after the reload.
func reloadAllowedKeys(ing *ingest.Server, cfg config.Config, creds *credentials.Store, log *zap.Logger) {
	if !cfg.AllowedKeysFromCredentials {
		return
	}
	keys := cfg.IngestAllowedAPIKeys(creds)
	ing.SetAllowedAPIKeys(keys)
	log.Info("ingest allow-list reloaded from the credentials file", zap.Int("allowed_api_keys", len(keys)))
}
