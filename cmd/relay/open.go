package main

import (
	"strconv"

	"github.com/svcrelay/relay/internal/config"
	"go.uber.org/zap"
)

// logOpen logs the ingest listener's settings for browsers and the internet
// (issue 23); api_keys are counted, never shown.
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
